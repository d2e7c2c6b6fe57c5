"""predict with steps_per_execution, and logs read from the compiled call that made them."""

import numpy as np
import pytest
from conftest import build, make_data

import phalanx


@pytest.mark.parametrize("device_data", [True, False])
def test_predict_runs_k_batches_per_call_with_the_same_outputs(all_devices, device_data):
    x, _ = make_data(13)
    model = build(all_devices, steps_per_execution=3)  # 7 batches: calls of 3, 3 and 1
    got = model.predict(x, batch_size=2, device_data=device_data)
    assert got.shape == (13, 5)
    np.testing.assert_allclose(got, np.asarray(model(x)), atol=1e-5)
    # Device-resident rows run K batches per call; host batches one call each.
    assert (("predict", True) in model.engine.cache) == device_data


def test_predict_steps_limit_and_hooks_once_per_call(all_devices):
    x, _ = make_data(20)
    model = build(all_devices, steps_per_execution=3)

    class Hooks(phalanx.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_predict_batch_begin(self, batch, logs=None):
            self.calls.append(("begin", batch))

        def on_predict_batch_end(self, batch, logs=None):
            self.calls.append(("end", batch))

    hooks = Hooks()
    got = model.predict(x, batch_size=2, steps=4, callbacks=[hooks])
    np.testing.assert_allclose(got, np.asarray(model(x[:8])), atol=1e-5)
    assert hooks.calls == [("begin", 0), ("end", 2), ("begin", 3), ("end", 3)]


@pytest.mark.parametrize("k", [1, 2])
def test_batch_logs_are_the_running_values_of_the_epoch(one_device, k):
    x, y = make_data(12)
    model = build(one_device, steps_per_execution=k)

    class Last(phalanx.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.logs = dict(logs)

    last = Last()
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[last])
    for name in ("loss", "accuracy"):
        assert last.logs[name] == pytest.approx(history.history[name][-1], rel=1e-6)
    evaluated = model.evaluate(x, y, batch_size=4, return_dict=True)
    assert set(evaluated) == {"loss", "accuracy"}
