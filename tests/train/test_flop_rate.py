"""FLOP rate and MFU in fit's epoch logs: XLA's count against a hand count, and the peaks."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx._src.train.engine import flop_rate


class Dense(nnx.Module):
    """Fully connected ReLU layers of the given widths (logits out)."""

    def __init__(self, widths, rngs):
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(widths)])

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


def _fit(widths, steps_per_execution=1, steps=4, rows=16):
    strategy = phalanx.Strategy()
    batch = rows * strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, widths[0])).astype(np.float32)
    y = rng.integers(0, widths[-1], batch * steps).astype(np.int32)
    with strategy.scope():
        model = phalanx.Model(Dense(widths, nnx.Rngs(0)))
        model.compile(
            "adam",
            phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
        )
    history = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    return model, history.history, batch


def _params(widths):
    return [a * b + b for a, b in itertools.pairwise(widths)]


@pytest.mark.multidevice
def test_seed_mlp_flops_match_a_hand_count():
    widths = (784, 128, 10)
    # The seed's 1,024 rows on 8 devices: each device also runs the replicated Adam update
    # (~12 flops a parameter), counted once per device; at 16 rows a replica that alone
    # would add ~20 % to the count.
    model, logs, batch = _fit(widths, rows=128)
    flops = model.engine.cache["flops_per_step"]
    params = _params(widths)
    # Forward 2 flops per parameter per example, weight gradients 2 more, and the gradient
    # with respect to each layer's input 2 more, except for the first layer: nothing
    # differentiates the data. (The "6 x parameters" rule assumes every layer has it; here
    # 99 % of the parameters sit in the first layer, so the exact count is ~4 x.)
    hand = (4 * sum(params) + 2 * sum(params[1:])) * batch
    assert flops == pytest.approx(hand, rel=0.2)
    # The rate is the same steps over the same seconds as examples_per_second.
    rate = logs["model_tflops_per_second"][0] * 1e12
    assert rate / logs["examples_per_second"][0] == pytest.approx(flops / batch, rel=1e-6)
    assert "mfu" not in logs  # no published peak for a CPU


def test_six_times_parameters_rule_for_a_deep_mlp_with_steps_per_execution():
    widths = (16, 256, 256, 256, 10)
    model, logs, batch = _fit(widths, steps_per_execution=2)
    flops = model.engine.cache["flops_per_step"]
    assert flops == pytest.approx(6 * sum(_params(widths)) * batch, rel=0.2)
    rate = logs["model_tflops_per_second"][0] * 1e12
    # Counted once per step, not once per compiled call of 2 steps.
    assert rate / logs["examples_per_second"][0] == pytest.approx(flops / batch, rel=1e-6)


def test_mfu_divides_by_the_peak_of_every_device(monkeypatch):
    monkeypatch.setattr(flop_rate, "peak_tflops", lambda kind, dtype: 0.5)
    _, logs, _ = _fit((8, 16, 4), steps=2)
    devices = len(jax.devices())
    expected = logs["model_tflops_per_second"][0] / (0.5 * devices)
    assert logs["mfu"][0] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kind", "dtype", "peak"),
    [
        ("TPU v4", "bfloat16", 275.0),
        ("TPU v5 lite", "float32", 197.0),
        ("TPU v5", "bfloat16", 459.0),
        ("TPU v5p", "bfloat16", 459.0),
        ("TPU v6 lite", "bfloat16", 918.0),
        ("NVIDIA A100-SXM4-80GB", "float32", 156.0),
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.0),
        ("NVIDIA H100 PCIe", "float16", 756.0),
        ("NVIDIA H200", "float32", 495.0),
        ("cpu", "float32", None),
    ],
)
def test_peak_table(kind, dtype, peak):
    assert flop_rate.peak_tflops(kind, np.dtype(dtype) if dtype != "bfloat16" else dtype) == peak
    # The scalar types a policy or a user names (jnp.bfloat16) give the same peak.
    assert flop_rate.peak_tflops(kind, getattr(jnp, dtype)) == peak


def test_any_source_gets_the_same_count_as_device_arrays():
    widths = (8, 16, 4)
    model, _, batch = _fit(widths, steps=2)
    on_devices = model.engine.cache["flops_per_step"]
    model.compile("adam", phalanx.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(1)
    batches = [
        (rng.normal(size=(batch, 8)).astype(np.float32), np.zeros(batch, np.int32))
        for _ in range(3)
    ]
    history = model.fit(iter(batches), epochs=1, verbose=0, device_data=False)
    # Rows sent, or row numbers into on-device arrays (a gather: a few more flops).
    assert model.engine.cache["flops_per_step"] == pytest.approx(on_devices, rel=0.01)
    assert history.history["model_tflops_per_second"][0] > 0


def test_the_flop_count_takes_no_trace_or_compile_of_its_own(monkeypatch):
    # The count asks the train call fit already compiled: no new trace (which, closing over
    # device-resident data, embedded the dataset as a constant), no lowering, no compile.
    from jax._src import monitoring

    events, during, calls = [], [], []

    def listen(name, secs, **kwargs):
        events.append(name)

    real = flop_rate.count

    def recording(engine, call, args):
        before = len(events)
        real(engine, call, args)
        calls.append(len(events) - before)
        during.extend(events[before:])

    monkeypatch.setattr(flop_rate, "count", recording)
    strategy = phalanx.Strategy()
    batch = 16 * strategy.num_replicas_in_sync
    rows = batch * 64
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 256)).astype(np.float32)  # 64 batches of 256 features
    y = rng.integers(0, 4, rows).astype(np.int32)
    with strategy.scope():
        model = phalanx.Model(Dense((256, 8, 4), nnx.Rngs(0)))
        model.compile("sgd", phalanx.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    monitoring.register_event_duration_secs_listener(listen)
    try:
        history = model.fit(ds, epochs=2, steps_per_epoch=2, verbose=0, device_data=True)
    finally:
        monitoring.unregister_event_duration_listener(listen)
    assert len(calls) == 1  # counted once, at the first training call
    assert any("backend_compile" in e for e in events)  # the listener heard fit's compile
    assert model.engine.cache["flops_per_step"] > 0
    assert len(history.history["model_tflops_per_second"]) == 2
    compiles = [e for e in during if "compile" in e or "trace" in e or "lower" in e]
    assert not compiles, compiles
