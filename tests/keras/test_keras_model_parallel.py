"""Keras 3 models under model parallelism: `phalanx.Model(keras_model, layout_map=...)`.

A layout map (issue 24) splits a Keras model's kernels over the `model` axis of
`Strategy(model_parallel=2)`: 4 replicas of 2 devices on 8 fake devices. Fit and evaluate then
give one device's numbers, each device holds half of every split variable and of its Adam
moments, and the same model and map train unchanged on a data-only strategy, where `model`
means replicated; a checkpoint written model-parallel restores on one device. A
`keras.distribution.LayoutMap` works as a dict does; a layout that does not fit its variable is
refused at construction, naming the variable's path.
"""

from __future__ import annotations

import functools

import jax
import keras
import numpy as np
import pytest
from flax import nnx

import phalanx

pytestmark = pytest.mark.multidevice

N, BATCH, EPOCHS = 48, 24, 2  # 2 steps an epoch; 24 rows split over 8, 4, 3 or 1 replicas
# Model parallelism needs an even device count of at least 4 (2 replicas of 2 devices).
LAYOUTS = {"data": {}}
if jax.device_count() >= 4 and jax.device_count() % 2 == 0:
    LAYOUTS["model2"] = {"model_parallel": 2}


def _mlp() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(4),
        ]
    )


def _embedding() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(20, 8),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(4),
        ]
    )


# name: (build, layout_map, how many variables it splits, input maker)
FAMILIES = {
    # Column-parallel: each device computes half of every layer's units, and normalises
    # them with its half of BatchNormalization's weights and moving statistics.
    "mlp": (
        _mlp,
        {
            ".*dense.*kernel": (None, "model"),
            ".*dense.*bias": ("model",),
            ".*batch_normalization.*": ("model",),
        },
        8,
        lambda rng: rng.normal(size=(N, 12)).astype(np.float32),
    ),
    # The embedding table's features, then the Dense kernel's rows (row-parallel).
    "embedding": (
        _embedding,
        {".*embedding.*/embeddings": (None, "model"), ".*dense.*kernel": ("model", None)},
        2,
        lambda rng: rng.integers(0, 20, (N, 6)).astype(np.int32),
    ),
}
cases = pytest.mark.parametrize(
    "family,layout", [(f, layout) for f in FAMILIES for layout in LAYOUTS]
)


@functools.cache
def _initial(family: str) -> list[np.ndarray]:
    return FAMILIES[family][0]().get_weights()


def _data(family: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = FAMILIES[family][3](rng)
    return x, rng.integers(0, 4, N).astype(np.int32)


def _model(family: str, strategy: phalanx.Strategy, layout_map=None) -> phalanx.Model:
    net = FAMILIES[family][0]()
    net.set_weights(_initial(family))
    model = phalanx.Model(net, strategy=strategy, layout_map=layout_map)
    loss = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="adam", loss=loss)
    return model


@functools.cache
def _run(family: str, layout: str | None, layout_map_kind: str = "dict"):
    """`(model, fit losses, evaluate loss, weights)`: `layout` None is one device, no map."""
    if layout is None:
        model = _model(family, phalanx.Strategy(devices=jax.devices()[:1]))
    else:
        layout_map = FAMILIES[family][1]
        if layout_map_kind == "LayoutMap":
            layout_map = _keras_layout_map(layout_map)
        model = _model(family, phalanx.Strategy(**LAYOUTS[layout]), layout_map)
    x, y = _data(family)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    evaluated = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)["loss"]
    return model, history.history["loss"], evaluated, model.get_weights()


def _keras_layout_map(layouts: dict) -> keras.distribution.LayoutMap:
    """`layouts` as Keras's own LayoutMap (on a Keras mesh, which phalanx does not use):
    tuples, and TensorLayouts for the biases."""
    mesh = keras.distribution.DeviceMesh((jax.device_count(),), ("model",), jax.devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in layouts.items():
        bias = key.endswith("bias")
        layout_map[key] = keras.distribution.TensorLayout(axes) if bias else axes
    return layout_map


def _assert_same(run, reference) -> None:
    _, losses, evaluated, weights = run
    _, ref_losses, ref_evaluated, ref_weights = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    np.testing.assert_allclose(evaluated, ref_evaluated, rtol=1e-5)
    for mine, theirs in zip(weights, ref_weights, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


# ---- the same numbers -------------------------------------------------------------------------
@cases
def test_fit_and_evaluate_equal_one_device(family, layout):
    run = _run(family, layout)
    model_parallel = LAYOUTS[layout].get("model_parallel", 1)
    assert run[0].strategy.num_replicas_in_sync == jax.device_count() // model_parallel
    assert run[1][-1] < run[1][0]  # it trains
    _assert_same(run, _run(family, None))


def test_a_keras_layout_map_works_as_a_dict_does():
    layout = "model2" if "model2" in LAYOUTS else "data"
    run = _run("mlp", layout, "LayoutMap")
    _assert_same(run, _run("mlp", None))
    split = [p for p in run[0].engine.state["params"] if isinstance(p, nnx.Variable)]
    kernel, vector = (None, "model"), ("model",)
    assert [p.get_metadata()["out_sharding"] for p in split] == [
        kernel,
        *[vector] * 3,
        kernel,
        vector,
    ]


# ---- where the bytes live ---------------------------------------------------------------------
def _halved(shape: tuple[int, ...], axes: tuple) -> tuple[int, ...]:
    return tuple(
        size // 2 if axis == "model" else size for size, axis in zip(shape, axes, strict=True)
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_each_device_holds_half_of_a_split_variable_and_of_its_moments(family):
    if "model2" not in LAYOUTS:
        pytest.skip("model_parallel=2 needs an even device count of at least 4")
    state = _run(family, "model2")[0].engine.state
    split = [p for p in [*state["params"], *state["rest"]] if isinstance(p, nnx.Variable)]
    assert len(split) == FAMILIES[family][2]
    for variable in split:
        value, axes = variable.get_value(), variable.get_metadata()["out_sharding"]
        assert value.addressable_shards[0].data.shape == _halved(value.shape, axes)
    # Adam's two moments of each split parameter are split as it is; the rest are whole.
    params = [p for p in state["params"] if isinstance(p, nnx.Variable)]
    opt = [leaf for leaf in jax.tree.leaves(state["opt"]) if hasattr(leaf, "sharding")]
    assert sum(not leaf.sharding.is_fully_replicated for leaf in opt) == 2 * len(params)


def test_a_checkpoint_written_model_parallel_restores_on_other_layouts(tmp_path):
    # Restoring needs the same layout_map (on a mesh without `model`, it means replicated).
    layout = "model2" if "model2" in LAYOUTS else "data"
    layout_map = FAMILIES["mlp"][1]
    model = _model("mlp", phalanx.Strategy(**LAYOUTS[layout]), layout_map)
    x, y = _data("mlp")
    saver = phalanx.callbacks.ModelCheckpoint(str(tmp_path / "ckpt"))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[saver])
    for strategy in (phalanx.Strategy(), phalanx.Strategy(devices=jax.devices()[:1])):
        other = _model("mlp", strategy, layout_map)
        other.load_checkpoint(str(tmp_path / "ckpt"))
        for mine, theirs in zip(other.get_weights(), model.get_weights(), strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_without_a_layout_map_the_state_holds_plain_arrays():
    state = _run("mlp", None)[0].engine.state
    assert not any(isinstance(p, nnx.Variable) for p in state["params"])


# ---- refused, before anything compiles --------------------------------------------------------
REFUSED = [
    ({".*dense.*kernel": (None, None, "model")}, ValueError, r"dense.*/kernel' of shape \(12, 16\)"
     r" is annotated \(None, None, 'model'\): more axis names"),
    ({".*dense.*kernel": (None, "tensor")}, ValueError, r"dense.*/kernel' .*'tensor' is neither"),
    ({".*kernel": (None, "model"), ".*dense.*kernel": ("model",)}, ValueError,
     r"dense.*/kernel' matches several layout_map keys"),
    ({".*kernel": "model"}, ValueError, r"layout_map\['.\*kernel'\] is 'model'; a layout is"),
    ({"(": (None, "model")}, ValueError, r"layout_map key '\(' is not a regex"),
    ([(".*kernel", (None, "model"))], TypeError, r"layout_map must be a dict .* got list"),
]  # fmt: skip


@pytest.mark.parametrize("layout_map,error,message", REFUSED)
def test_a_bad_layout_map_is_refused_naming_the_variable(layout_map, error, message):
    with pytest.raises(error, match=message):
        phalanx.Model(_mlp(), strategy=phalanx.Strategy(), layout_map=layout_map)


def test_a_size_the_model_axis_does_not_divide_is_refused_naming_the_variable():
    n = jax.device_count()
    if n == 1:
        pytest.skip("needs a model axis of more than one device")
    strategy = phalanx.Strategy(model_parallel=2 if n % 2 == 0 else n)
    odd = keras.Sequential([keras.Input((12,)), keras.layers.Dense(5, name="odd")])
    message = (
        r"Keras variable '.*odd/kernel' of shape \(12, 5\) .* its axis 1 of size 5 does not "
        r"split over model .* or change layout_map\['.\*kernel'\]"
    )
    with pytest.raises(ValueError, match=message):
        phalanx.Model(odd, strategy=strategy, layout_map={".*kernel": (None, "model")})


def test_an_nnx_module_takes_no_layout_map():
    module = nnx.Linear(2, 4, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="layout_map is for Keras models; a Linear carries"):
        phalanx.Model(module, layout_map={".*kernel": (None, "model")})
