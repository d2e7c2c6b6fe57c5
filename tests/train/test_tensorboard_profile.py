"""`TensorBoard(profile_batch=...)`: Keras's profiler window, traced with jax.profiler."""

import numpy as np
import pytest

import phalanx
from phalanx._src.train.api.callbacks import tensorboard as tb_lib


def _fit(tmp_path, profile_batch, steps_per_execution=1, steps=8):
    strategy = phalanx.Strategy()
    batch = 4 * strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, 3)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    from flax import nnx

    with strategy.scope():
        model = phalanx.Model(nnx.Linear(3, 1, rngs=nnx.Rngs(0)))
        model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    board = phalanx.callbacks.TensorBoard(tmp_path, profile_batch=profile_batch)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[board])
    return board


def test_profile_batch_leaves_an_xplane_trace_under_log_dir(tmp_path):
    _fit(tmp_path, (3, 6))
    traces = list((tmp_path / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert list(traces[0].parent.glob("perfetto_trace.json.gz"))  # for ui.perfetto.dev


class Recorder(tb_lib.TensorBoard):
    """Records at which batch the trace starts and stops instead of tracing."""

    def __init__(self, profile_batch, k):
        super().__init__("unused", profile_batch=profile_batch)
        self.events = []
        self.k = k
        self.engine = self  # steps_per_call below stands in for the model's engine's
        self.set_model(self)

    def steps_per_call(self, steps):
        return self.k

    def _writer(self, name):
        class Quiet:
            def add_scalar(self, *args):
                pass

            def flush(self):
                pass

            close = flush

        return Quiet()

    def _start_trace(self):
        self._tracing = True
        self.events.append(("start", self._last_end_step))

    def _stop_trace(self):
        self._tracing, self._traced = False, True
        self.events.append(("stop", self._last_end_step))


@pytest.mark.parametrize(
    ("profile_batch", "k", "events"),
    [
        ((3, 6), 1, [("start", 2), ("stop", 6)]),  # before batch 3 runs, after batch 6
        (4, 1, [("start", 3), ("stop", 4)]),  # one batch
        ((3, 6), 4, [("start", 0), ("stop", 6)]),  # whole calls: batches 1-4, 5-6 (epoch end)
        ((5, 6), 4, [("start", 4), ("stop", 6)]),
        ((7, 20), 4, [("start", 4), ("stop", 12)]),  # fit ends first: stopped at the end
        (0, 1, []),
    ],
)
def test_the_window_covers_whole_calls(profile_batch, k, events):
    board = Recorder(profile_batch, k)
    board.set_params({"epochs": 2, "steps": 6 if k == 4 else 8})
    board.on_train_begin()
    for epoch in range(2):
        board.on_epoch_begin(epoch)
        steps = board.params["steps"]
        for first in range(0, steps, k):  # the loop's hook after each call of up to k batches
            board.on_train_batch_end(min(first + k, steps) - 1, {})
        board.on_epoch_end(epoch, {})
    board.on_train_end()
    assert board.events == events


def test_bad_profile_batch_is_a_clear_error():
    for bad in ((6, 3), (0, 2), "3,6", -1, (1, 2, 3)):
        with pytest.raises(ValueError, match=r"profile_batch must be 0 \(off\)"):
            tb_lib.TensorBoard("x", profile_batch=bad)
