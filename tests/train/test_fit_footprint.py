"""What a fit call costs beyond its steps: the programs compiled before the first step, and
the copies of device-resident data (issue 23). Structure only, no timing."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax._src import monitoring

import phalanx
from phalanx._src.train.feeding import device_data, sources

COMPILE = "/jax/core/compile/backend_compile_duration"


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


class Conv(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(1, 4, (3,), rngs=rngs)
        self.out = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.conv(x[..., None]))
        return self.out(h.reshape(h.shape[0], -1))


def _model(module=MLP, k=1):
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = phalanx.Model(module(nnx.Rngs(0)))
        model.compile(
            "adam",
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=k,
        )
    return model, 8 * strategy.num_replicas_in_sync


def _data(rows):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    return x, rng.integers(0, 4, rows).astype(np.int32)


class _FirstStep(phalanx.callbacks.Callback):
    """Records the programs compiled from fit's start to the end of its first step."""

    def __init__(self, compiled):
        super().__init__()
        self.compiled = compiled
        self.before_first = None

    def on_train_batch_end(self, batch, logs=None):
        if self.before_first is None:
            self.before_first = list(self.compiled)


@pytest.fixture
def compiled():
    names = []

    def listen(event, secs, **kwargs):
        if event == COMPILE:
            names.append(kwargs.get("fun_name"))

    monitoring.register_event_duration_secs_listener(listen)
    yield names
    monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def placed(monkeypatch):
    """The `device_data.Source` of each fit, as `prepare` makes it."""
    made = []
    real = device_data.prepare

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        made.append(None if result is None else result.arrays)
        return result

    monkeypatch.setattr(sources.device_data, "prepare", recording)
    return made


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("module", [MLP, Conv], ids=["mlp", "conv"])
def test_one_program_is_compiled_before_the_first_step(compiled, module, k):
    # Before the first step: the train call and nothing else (no evaluate or predict
    # program, no FLOP count, no packing or zeroing op, no lowering to look for a
    # convolution); the boundary check only traces the forward pass.
    model, batch = _model(module, k)
    x, y = _data(batch * 8)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    first = _FirstStep(compiled)
    compiled.clear()
    model.fit(ds, epochs=2, verbose=0, callbacks=[first], device_data=True)
    assert first.before_first == ["jit(call)"], first.before_first
    assert model.engine.cache["flops_per_step"] > 0  # counted, with no program of its own
    assert compiled.count("jit(call)") == 1  # the second epoch compiles nothing
    if k > 1:  # XLA:CPU runs a convnet's K steps as single calls: the check's trace told
        assert model.engine.cache["mode"] == ("loop" if module is Conv else "scan")


@pytest.mark.parametrize("k", [1, 4])
def test_data_read_in_order_is_on_the_devices_once(placed, k):
    # Unshuffled whole batches train on their blocks, put on the devices from the host
    # arrays: the replicated source (a copy per device) is never made.
    model, batch = _model(k=k)
    x, y = _data(batch * 8)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    model.fit(ds, epochs=2, verbose=0, device_data=True)
    (source,) = placed
    assert not source.placed
    assert source.host[0] is x  # the caller's own arrays: no host copy made


def test_shuffled_data_is_placed_once_and_not_kept_on_the_host(placed):
    model, batch = _model()
    x, y = _data(batch * 8)
    history = model.fit(x, y, batch_size=batch, epochs=2, verbose=0, device_data=True)
    (source,) = placed
    assert source.placed and source.host is None  # the host arrays are not held on to
    (arrays_x, _) = source.arrays()
    assert arrays_x.sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(arrays_x), x)
    assert len(history.history["loss"]) == 2


@pytest.mark.parametrize("k", [1, 4])
def test_windows_across_the_datas_end_compile_one_program(compiled, k):
    # repeat().batch() over rows that do not split into batches reads windows across the
    # data's end after its first pass. Read ahead, every batch is a window from the first:
    # one train program for the whole run (blocks first would compile a second at the
    # second epoch), and the data placed once.
    model, batch = _model(k=k)
    x, y = _data(batch * 5 + 3)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    compiled.clear()
    history = model.fit(ds, epochs=4, steps_per_epoch=4, verbose=0)
    assert compiled.count("jit(call)") == 1, compiled
    assert history.history["host_to_device_mib"][1:] == [0.0] * 3


def test_read_ahead_windows_give_way_to_blocks_on_the_same_data(compiled):
    # The same read-only arrays, placed once, read by another pipeline in the next call:
    # batch().repeat() ends each pass with a partial batch, which turns the windows off.
    model, batch = _model(k=4)
    x, y = _data(batch * 5 + 3)
    x.flags.writeable = y.flags.writeable = False
    data = phalanx.data.Dataset.from_tensor_slices((x, y))
    model.fit(data.repeat().batch(batch), epochs=2, steps_per_epoch=4, verbose=0)
    got = model.fit(data.batch(batch).repeat(), epochs=3, steps_per_epoch=4, verbose=0)
    want_model, _ = _model(k=4)
    want_model.fit(data.repeat().batch(batch), epochs=2, steps_per_epoch=4, verbose=0)
    want = want_model.fit(
        data.batch(batch).repeat(), epochs=3, steps_per_epoch=4, verbose=0, device_data=False
    )
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=1e-6)
