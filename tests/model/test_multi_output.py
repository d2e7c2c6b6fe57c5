"""Multi-output models: per-output losses, loss_weights and Keras's per-output log names."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx


class TwoHeads(nnx.Module):
    """Dict inputs {'a', 'b'} -> {'cls': 3 logits, 'reg': 1 value}."""

    def __init__(self, rngs: nnx.Rngs, as_tuple: bool = False):
        self.body = nnx.Linear(6, 8, rngs=rngs)
        self.cls = nnx.Linear(8, 3, rngs=rngs)
        self.reg = nnx.Linear(8, 1, rngs=rngs)
        self.as_tuple = as_tuple

    def __call__(self, x):
        h = jax.nn.relu(self.body(jax.numpy.concatenate([x["a"], x["b"]], axis=-1)))
        if self.as_tuple:
            return self.cls(h), self.reg(h)
        return {"cls": self.cls(h), "reg": self.reg(h)}


def _data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "a": rng.normal(size=(n, 4)).astype(np.float32),
        "b": rng.normal(size=(n, 2)).astype(np.float32),
    }
    y_cls = rng.integers(0, 3, size=(n,)).astype(np.int32)
    y_reg = rng.normal(size=(n, 1)).astype(np.float32)
    return x, y_cls, y_reg


def _sce(y, logits):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def _reference(module, x, y_cls, y_reg, w_cls, w_reg):
    out = module(x)
    cls, reg = (out["cls"], out["reg"]) if isinstance(out, dict) else out
    cls_loss = np.asarray(_sce(y_cls, cls))
    reg_loss = np.asarray(((reg - y_reg) ** 2)[:, 0])
    acc = np.mean(np.argmax(np.asarray(cls), -1) == y_cls)
    total = np.mean(w_cls * cls_loss + w_reg * reg_loss)
    return total, cls_loss.mean(), reg_loss.mean(), acc


@pytest.mark.multidevice
def test_dict_outputs_log_keras_names_and_weighted_total():
    x, y_cls, y_reg = _data()
    strategy = phalanx.Strategy()
    with strategy.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(0)))
        model.compile(
            optimizer="sgd",
            loss={
                "cls": phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
                "reg": "mse",
            },
            loss_weights={"cls": 1.0, "reg": 0.5},
            metrics={"cls": ["accuracy"], "reg": ["mae"]},
        )
    expected = _reference(model.module, x, y_cls, y_reg, 1.0, 0.5)
    logs = model.evaluate(x, {"cls": y_cls, "reg": y_reg}, batch_size=16, return_dict=True)
    assert list(logs) == ["loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"]
    np.testing.assert_allclose(
        [logs["loss"], logs["cls_loss"], logs["reg_loss"], logs["cls_accuracy"]],
        expected,
        rtol=1e-5,
    )
    history = model.fit(x, {"cls": y_cls, "reg": y_reg}, batch_size=16, epochs=2, verbose=0)
    assert {"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"} <= set(history.history)


def test_tuple_outputs_with_list_losses_and_default_names(one_device):
    x, y_cls, y_reg = _data()
    with one_device.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(1), as_tuple=True))
        model.compile(
            optimizer="sgd",
            loss=[phalanx.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
            loss_weights=[2.0, 1.0],
            metrics=[["accuracy"], None],
        )
    expected = _reference(model.module, x, y_cls, y_reg, 2.0, 1.0)
    logs = model.evaluate(x, (y_cls, y_reg), batch_size=10, return_dict=True)
    assert list(logs) == ["loss", "output_1_loss", "output_2_loss", "output_1_accuracy"]
    np.testing.assert_allclose(list(logs.values()), expected, rtol=1e-5)


def test_output_with_no_loss_is_not_trained_but_measured(one_device):
    x, y_cls, y_reg = _data()
    with one_device.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(2)))
        model.compile(
            optimizer="sgd",
            loss={"cls": None, "reg": "mse"},
            # 'accuracy' would need a loss to pick the kind: name it.
            metrics={"cls": "sparse_categorical_accuracy"},
        )
    before = np.asarray(model.module.cls.kernel[...])
    logs = model.fit(x, {"cls": y_cls, "reg": y_reg}, batch_size=8, epochs=1, verbose=0)
    # One loss: no per-output loss tracker (Keras adds them only for several losses).
    assert (
        set(logs.history) >= {"loss", "cls_sparse_categorical_accuracy"}
        and "reg_loss" not in logs.history
    )
    np.testing.assert_array_equal(np.asarray(model.module.cls.kernel[...]), before)


def test_configuration_errors_name_the_outputs(one_device):
    with one_device.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(0)))
        with pytest.raises(ValueError, match=r"loss_weights keys \['size'\]"):
            model.compile(loss={"cls": "mse", "reg": "mse"}, loss_weights={"size": 1.0})
        with pytest.raises(ValueError, match="metrics keys"):
            model.compile(loss={"cls": "mse", "reg": "mse"}, metrics={"clss": ["mae"]})
        with pytest.raises(ValueError, match="one float per output"):
            model.compile(loss=["mse", "mse"], loss_weights=[1.0])
        model.compile(
            optimizer="sgd",
            loss={"cls": phalanx.losses.SparseCategoricalCrossentropy(True), "reg": "mse"},
        )
    x, y_cls, _ = _data()
    with pytest.raises(ValueError, match=r"no entry 'reg'"):
        model.evaluate(x, {"cls": y_cls}, batch_size=8)


def test_single_loss_for_several_outputs_says_what_to_do(one_device):
    x, y_cls, y_reg = _data(8)
    with one_device.scope():
        model = phalanx.Model(TwoHeads(nnx.Rngs(0)))
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"several outputs \(\['cls', 'reg'\]\).*one loss per"):
        model.evaluate(x, {"cls": y_cls, "reg": y_reg}, batch_size=8)


def test_float_loss_weight_scales_a_single_loss(one_device):
    from conftest import build, make_data

    x, y = make_data(16)
    plain, scaled = build(one_device, seed=5), build(one_device, seed=5, loss_weights=2.5)
    a = plain.evaluate(x, y, batch_size=8, return_dict=True)
    b = scaled.evaluate(x, y, batch_size=8, return_dict=True)
    np.testing.assert_allclose(b["loss"], 2.5 * a["loss"], rtol=1e-6)
    assert b["accuracy"] == a["accuracy"]  # 'accuracy' still knows the sparse loss
