"""model.summary(): layers, output shapes, parameter counts and bytes, device memory."""

import os
import re

import jax
import numpy as np
import pytest
from conftest import build, make_data
from flax import nnx

import phalanx

# keras is imported at collection (its import sets environment variables of its own).
os.environ.setdefault("KERAS_BACKEND", "jax")
try:
    import keras
except ImportError:  # the keras extra is optional
    keras = None


def _text(model, **kwargs):
    lines = []
    model.summary(print_fn=lines.append, **kwargs)
    return lines[0]


def _bytes(tree):
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def test_layers_shapes_and_counts_from_input_shape(one_device):
    model = build(one_device, optimizer="adam")
    text = _text(model, input_shape=(12,))
    assert re.search(r"^l1\s+Linear\s+float32\[1,16\]\s+208\s+832 B$", text, re.M)
    assert re.search(r"^l2\s+Linear\s+float32\[1,5\]\s+85\s+340 B$", text, re.M)
    params = sum(leaf.size for leaf in jax.tree.leaves(model.engine.state["params"]))
    assert f"Trainable params: {params:,}" in text
    # Before any input is known the layers and counts are listed, shapes are not.
    fresh = build(one_device, optimizer="adam")
    assert "Output shapes unknown: pass x=" in _text(fresh)


def test_shapes_from_the_first_batch_fit_saw(one_device):
    model = build(one_device)
    x, y = make_data(16)
    model.fit(x, y, batch_size=8, verbose=0)
    assert re.search(r"^\(model\)\s+MLP\s+float32\[8,5\]", _text(model), re.M)


def test_wrong_sample_gets_the_boundary_error(one_device):
    model = build(one_device)
    with pytest.raises(ValueError, match=r"cannot take inputs of shape \(2, 3\)"):
        model.summary(x=np.zeros((2, 3), np.float32))


@pytest.mark.multidevice
@pytest.mark.parametrize("sharding", ["replicated", "zero1"])
def test_device_memory_is_what_one_device_holds(sharding):
    strategy = phalanx.Strategy(state_sharding=sharding)
    model = build(strategy, optimizer="adam")
    text = _text(model, input_shape=(12,))
    line = next(ln for ln in text.splitlines() if ln.startswith("Device memory per device"))
    device = strategy.devices[0]

    def held(tree):  # the bytes of the shards that really live on the first device
        return sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves(tree)
            for shard in leaf.addressable_shards
            if shard.device == device
        )

    params, opt = held(model.engine.state["params"]), held(model.engine.state["opt"])
    assert f"({sharding}): params {params:,} B + optimizer {opt:,} B" in line
    if sharding == "zero1" and strategy.num_replicas_in_sync > 1:
        assert opt < _bytes(model.engine.state["opt"])  # split, not replicated


def test_non_trainable_state_is_counted(one_device):
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(4, 3, rngs=rngs)
            self.norm = nnx.BatchNorm(3, rngs=rngs)

        def __call__(self, x):
            return self.norm(self.dense(x))

    with one_device.scope():
        model = phalanx.Model(Net(nnx.Rngs(0)))
        model.compile(optimizer="sgd", loss="mse")
    text = _text(model, x=np.zeros((2, 4), np.float32))
    assert "Non-trainable state: 6 (24 B)" in text  # BatchNorm's mean and var
    assert re.search(r"^norm\s+BatchNorm\s+float32\[2,3\]\s+6\s+24 B$", text, re.M)


def test_keras_model_layers_are_listed(one_device):
    if keras is None:
        pytest.skip("keras is not installed")
    net = keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(4, name="hidden")])
    with one_device.scope():
        model = phalanx.Model(net)
        model.compile(optimizer="sgd", loss="mse")
    text = _text(model)
    assert re.search(r"^hidden\s+Dense\s+\(None, 4\)\s+28\s+112 B$", text, re.M)
    assert "Trainable params: 28 (112 B)" in text


def test_dict_inputs_and_outputs(one_device):
    from test_multi_output import TwoHeads

    with one_device.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(0)))
        model.compile(optimizer="sgd", loss={"cls": "mse", "reg": "mse"})
    text = _text(model, input_shape={"a": (4,), "b": (2,)})
    assert re.search(
        r"^\(model\)\s+TwoHeads\s+\{cls: float32\[1,3\], reg: float32\[1,1\]\}", text, re.M
    )
