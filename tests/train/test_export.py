"""`Model.export`: NNX and Keras models leave as a TF SavedModel and an ONNX file that a
process with TensorFlow or ONNX Runtime, and without jax or phalanx, serves at batch 1, 7
and 64 with `predict`'s numbers; weights stored once; bad calls fail before writing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import phalanx
from phalanx.data import TensorSpec

pytest.importorskip("tensorflow", reason="the `export` extra (TensorFlow) writes SavedModels")
pytest.importorskip("onnxruntime", reason="the `export` extra (onnxruntime) runs ONNX files")
keras = pytest.importorskip("keras", reason="the Keras models need the `keras` extra")

SERVER = os.path.join(os.path.dirname(__file__), "serve_exported.py")
BATCHES = (1, 7, 64)
TOLERANCE = 1e-5
FORMATS = {"tf_saved_model": "", "onnx": ".onnx"}


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(32, 512, rngs=rngs)
        self.norm = nnx.BatchNorm(512, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(512, 512, rngs=rngs)

    def __call__(self, x):
        return self.head(self.drop(jax.nn.relu(self.norm(self.dense(x)))))


class TinyLM(nnx.Module):
    """Embedding, causal attention, RMSNorm, GELU: the LM benchmark's operations."""

    def __init__(self, rngs, vocab=50, d=16, heads=2):
        self.heads = heads
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, rngs=rngs)
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, rngs=rngs)
        self.head = nnx.Linear(4 * d, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(self.norm(x)).reshape(b, t, 3 * self.heads, -1), 3, 2)
        x = x + jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
        return self.head(jax.nn.gelu(self.up(x)))


def _keras_cnn():
    image = keras.Input((12, 12, 3), name="image")
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.AveragePooling2D(3, strides=1, padding="same")(h)
    h = keras.layers.Dropout(0.4)(keras.layers.GlobalAveragePooling2D()(h))
    return keras.Model(image, keras.layers.Dense(5, activation="softmax")(h))


def _keras_two_inputs():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(4)(a), b])
    return keras.Model({"a": a, "b": b}, {"score": keras.layers.Dense(1)(h), "echo": b})


def _data(kind, rows, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return rng.normal(size=(rows, 32)).astype(np.float32)
    if kind == "lm":
        return rng.integers(0, 50, (rows, 9)).astype(np.int32)
    if kind == "cnn":
        return rng.normal(size=(rows, 12, 12, 3)).astype(np.float32)
    return {"a": rng.normal(size=(rows, 3)).astype(np.float32),
            "b": rng.normal(size=(rows, 2)).astype(np.float32)}  # fmt: skip


def _models():
    """name: (phalanx.Model, data kind, export kwargs); the MLP and CNN have seen fit."""
    mlp = phalanx.Model(MLP(nnx.Rngs(0)))
    mlp.compile(optimizer="adam", loss="mse")
    mlp.fit(_data("mlp", 32), np.zeros((32, 512), np.float32), batch_size=16, verbose=0)
    lm = phalanx.Model(TinyLM(nnx.Rngs(1)))
    lm.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    cnn = phalanx.Model(_keras_cnn())
    cnn.compile(optimizer="adam", loss="categorical_crossentropy")
    cnn.fit(_data("cnn", 16), np.eye(5, dtype=np.float32)[np.arange(16) % 5], verbose=0)
    two = phalanx.Model(_keras_two_inputs())
    two.compile(optimizer="sgd", loss="mse")
    signature = {"input_signature": TensorSpec((None, 9), np.int32, name="tokens")}
    return {"mlp": (mlp, "mlp", {}), "lm": (lm, "lm", signature), "cnn": (cnn, "cnn", {}),
            "two": (two, "two", {})}  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory, child_env_module):
    """Every model exported in both formats, then served by another process."""
    folder = tmp_path_factory.mktemp("exported")
    jobs, expected, models = [], {}, _models()
    for name, (model, kind, kwargs) in models.items():
        for fmt, suffix in FORMATS.items():
            model.export(folder / f"{name}{suffix}", format=fmt, verbose=False, **kwargs)
        feeds = {}
        for rows in BATCHES:
            x = _data(kind, rows, seed=rows)
            expected[(name, rows)] = model.predict(x, verbose=0)
            names = ["tokens"] if name == "lm" else ["image"] if name == "cnn" else ["inputs"]
            inputs = x if isinstance(x, dict) else dict(zip(names, [x], strict=True))
            feeds.update({f"{rows}/{k}": v for k, v in inputs.items()})
        np.savez(folder / f"{name}.in.npz", **feeds)
        for fmt, suffix in FORMATS.items():
            out = folder / f"{name}.{fmt}.out.npz"
            jobs.append(
                [fmt, str(folder / f"{name}{suffix}"), str(folder / f"{name}.in.npz"), str(out)]
            )
    (folder / "jobs.json").write_text(json.dumps(jobs))
    done = subprocess.run(
        [sys.executable, SERVER, str(folder / "jobs.json")],
        capture_output=True, text=True, env=child_env_module, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "blocked: []" in done.stdout  # jax, flax, phalanx never imported there
    return folder, expected, models


@pytest.fixture(scope="module")
def child_env_module():
    env = dict(os.environ)
    env.pop("PHALANX_CPU_DEVICES", None)
    return env


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("name", ["mlp", "lm", "cnn", "two"])
def test_served_outputs_equal_predict_at_batch_1_7_64(served, name, fmt):
    folder, expected, _ = served
    out = np.load(folder / f"{name}.{fmt}.out.npz")
    for rows in BATCHES:
        want = expected[(name, rows)]
        pairs = [(out[f"{rows}/output_0"], want)] if not isinstance(want, dict) else [
            (out[f"{rows}/{key}"], value) for key, value in want.items()
        ]  # fmt: skip
        if fmt == "tf_saved_model" and not isinstance(want, dict):
            pairs.append((out[f"{rows}/serve"], want))  # the `serve` endpoint too
        for got, value in pairs:
            assert got.dtype == np.float32 and got.shape == value.shape
            np.testing.assert_allclose(got, value, rtol=0, atol=TOLERANCE)


def test_weights_are_stored_once(served):
    folder, _, models = served
    model = models["mlp"][0]
    weights = model.get_weights()
    parameter_bytes = sum(w.nbytes for w in weights)
    stored = phalanx.train.load_checkpoint(str(folder / "mlp" / "variables" / "variables"))
    values = [stored.get_tensor(k) for k in stored.names() if k.endswith("VARIABLE_VALUE")]
    floats = sorted(w.tobytes() for w in weights if w.dtype.kind == "f")
    assert sorted(v.tobytes() for v in values if v.dtype.kind == "f") == floats  # once, bitwise
    assert sum(v.nbytes for v in values) <= parameter_bytes  # (the dropout key: a constant)
    size = sum(f.stat().st_size for f in (folder / "mlp").rglob("*") if f.is_file())
    assert size <= 2 * parameter_bytes + (2 << 20)
    onnx = pytest.importorskip("onnx")
    proto = onnx.load(str(folder / "mlp.onnx"))
    assert len(proto.graph.initializer) >= len(weights)
    assert (folder / "mlp.onnx").stat().st_size <= 2 * parameter_bytes + (2 << 20)
    assert [i.name for i in proto.graph.input] == ["inputs"]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # any batch size


def _small(precision="float32"):
    model = phalanx.Model(nnx.Sequential(nnx.Linear(3, 2, rngs=nnx.Rngs(0))))
    model.compile(optimizer="sgd", loss="mse", precision=precision)
    return model


def test_bad_calls_fail_before_anything_is_written(tmp_path, monkeypatch):
    from phalanx._src.train.export import onnx_export, versions

    model = _small()
    target = tmp_path / "m"
    with pytest.raises(ValueError, match=r"format='litert' is not one phalanx writes.*'onnx'"):
        model.export(target, format="litert")
    with pytest.raises(ValueError, match=r"does not know the model's inputs.*input_signature="):
        model.export(target)
    with pytest.raises(TypeError, match=r"input_signature is a int.*TensorSpec"):
        model.export(target, input_signature=3)
    with pytest.raises(ValueError, match=r"known rank with a batch dimension"):
        model.export(target, input_signature=TensorSpec(None))
    with pytest.raises(ValueError, match=r"does not take inputs of the exported signature"):
        model.export(target, input_signature=TensorSpec((None, 5)))
    with pytest.raises(ValueError, match=r"computing in float32.*precision='mixed_bfloat16'"):
        _small("mixed_bfloat16").export(
            target, format="onnx", input_signature=TensorSpec((None, 3))
        )
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(
        versions.ExportDependencyError, match=r"needs TensorFlow.*phalanx\[export\]"
    ):
        model.export(target, input_signature=TensorSpec((None, 3)))
    monkeypatch.undo()

    def wrong(path, inputs, names, batch):
        return [np.zeros((len(jax.tree.leaves(batch)[0]), 2), np.float32) + 1]

    monkeypatch.setattr(onnx_export, "run", wrong)
    with pytest.raises(RuntimeError, match=r"computes output 0 differently.*nothing was written"):
        model.export(tmp_path / "m.onnx", format="onnx", input_signature=TensorSpec((None, 3)))
    assert os.listdir(tmp_path) == []  # no artifact, no temporary folder


def test_a_tensorflow_too_old_for_this_jax_is_named(tmp_path, monkeypatch):
    from tensorflow.compiler.tf2xla.python import xla as tfxla

    from phalanx._src.train.export import versions

    monkeypatch.setattr(tfxla, "call_module_maximum_supported_version", lambda: 4)
    with pytest.raises(versions.ExportDependencyError, match=r"TensorFlow \S+ runs XlaCallModule "
                       r"versions up to 4, but jax \S+ writes versions \d+ to \d+"):  # fmt: skip
        _small().export(tmp_path / "m", input_signature=TensorSpec((None, 3)))
    assert os.listdir(tmp_path) == []


def test_an_operation_onnx_does_not_cover_is_named(tmp_path):
    class Scanned(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((3, 3)))

        def __call__(self, x):
            return jax.lax.scan(lambda h, _: (jnp.tanh(h @ self.w[...]), None), x, length=2)[0]

    model = phalanx.Model(Scanned())
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"does not cover the primitive 'scan'.*tf_saved_model"):
        model.export(tmp_path / "s.onnx", format="onnx", input_signature=TensorSpec((None, 3)))
    assert os.listdir(tmp_path) == []
