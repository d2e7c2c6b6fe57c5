"""Invariants run over every model family of `families.py` (issue 7):

trains (the loss falls); async-safe batch ends see every batch, one dispatch late; N
replicas == 1 replica; a partial batch counts its examples exactly; a mid-epoch
`BackupAndRestore` resumes bitwise; 'mixed_bfloat16' computes every matmul and convolution in
bfloat16; BatchNorm statistics ignore padding; Dropout draws new masks per step while
inference stays deterministic.

Each invariant runs on two layouts of all the devices: data parallelism alone, and (issue
24) `data x model` with `model_parallel=2`, where each replica's two devices split the
kernels the family annotates (`test_annotated_kernels_are_split` checks they do).

Compiles dominate the cost, so one reference run per family and layout (fit on all devices,
unshuffled) is shared by the invariants that only read it, and each model is as small as it
can be.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from families import FAMILIES, Family, per_example_loss
from flax import nnx
from lowered_ops import matmuls

import phalanx

pytestmark = pytest.mark.multidevice

N_TRAIN, BATCH, EPOCHS = 48, 16, 3  # 3 steps an epoch
BY_NAME = {f.name: f for f in FAMILIES}
# Model parallelism needs an even device count of at least 4 (2 replicas of 2 devices).
LAYOUTS = {"data": {}}
if jax.device_count() >= 4 and jax.device_count() % 2 == 0:
    LAYOUTS["model2"] = {"model_parallel": 2}


def _cases(families) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "family,layout",
        [(f, layout) for f in families for layout in LAYOUTS],
        ids=lambda v: v.name if isinstance(v, Family) else v,
    )


families = _cases(FAMILIES)


def _model(
    family: Family, devices=None, seed: int = 0, layout: str = "data", **compile_kwargs
) -> phalanx.Model:
    strategy = phalanx.Strategy(devices=devices, axis_rules=family.axis_rules, **LAYOUTS[layout])
    with strategy.scope():
        model = phalanx.Model(family.module(seed))
        model.compile(
            # Plain SGD, gently. Adam scales the rounding noise of parameters whose gradient
            # is zero in exact arithmetic (a key bias before softmax) up to full steps;
            # Keras's momentum keeps moving the weights at learning rate 0; at 0.1 the ResNet
            # is near the edge of stability, where float32 rounding grows past 1e-5.
            optimizer=phalanx.optimizers.get("sgd", learning_rate=0.05),
            loss=family.loss,
            **compile_kwargs,
        )
    return model


def _dataset(family: Family) -> phalanx.data.Dataset:
    return phalanx.data.Dataset.from_tensor_slices(family.data(N_TRAIN, 1)).batch(BATCH)


class _AsyncReader(phalanx.callbacks.Callback):
    """Reads every batch's logs, and says so (`async_safe`): fit runs its batch ends once
    the next step is dispatched. Records (epoch, batch, loss, steps dispatched)."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.epoch, self.seen = 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.epoch, batch, logs["loss"], self.model.train_step_count))


@dataclasses.dataclass(frozen=True)
class Run:
    model: phalanx.Model
    losses: list[float]
    weights: list[np.ndarray]  # after training, a copy
    steps: int
    batch_ends: list[tuple]  # what an async-safe reader saw (`_AsyncReader.seen`)


@functools.cache
def _reference(name: str, layout: str = "data", one_device: bool = False) -> Run:
    """`EPOCHS` epochs of `fit` over the family's unshuffled dataset, from seed 0, with an
    async-safe reader of every batch's logs (the other invariants also cover its path)."""
    family = BY_NAME[name]
    model = _model(family, jax.devices()[:1] if one_device else None, layout=layout)
    reader = _AsyncReader()
    history = model.fit(_dataset(family), epochs=EPOCHS, verbose=0, callbacks=[reader])
    losses = list(history.history["loss"])
    return Run(model, losses, model.get_weights(), model.train_step_count, reader.seen)


# ---- the invariants -------------------------------------------------------------------------
@families
def test_trains(family, layout):
    losses = _reference(family.name, layout).losses
    assert np.isfinite(losses).all(), losses
    assert (np.diff(losses) < 0).all(), losses  # every epoch lower than the one before


@families
def test_async_safe_batch_ends_see_every_batch_once_the_next_is_dispatched(family, layout):
    run = _reference(family.name, layout)
    steps = N_TRAIN // BATCH
    assert [(e, b) for e, b, *_ in run.batch_ends] == [
        (e, b) for e in range(EPOCHS) for b in range(steps)
    ]
    # The last batch's running loss is the epoch's loss, and the step after each batch
    # within its epoch was already dispatched when its hook ran.
    assert [loss for _, b, loss, _ in run.batch_ends if b == steps - 1] == run.losses
    assert [n for *_, n in run.batch_ends] == [
        e * steps + min(b + 2, steps) for e in range(EPOCHS) for b in range(steps)
    ]


@families
def test_n_replicas_equal_one_replica(family, layout):
    if jax.device_count() == 1:
        pytest.skip("needs more than one device")
    many, one = _reference(family.name, layout), _reference(family.name, one_device=True)
    model_parallel = LAYOUTS[layout].get("model_parallel", 1)
    assert many.model.strategy.num_replicas_in_sync == jax.device_count() // model_parallel
    np.testing.assert_allclose(many.losses, one.losses, rtol=1e-5)
    for a, b in zip(many.weights, one.weights, strict=True):
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        else:  # RNG counters and keys: the same draws
            np.testing.assert_array_equal(a, b)


@families
def test_partial_batch_counts_its_examples_exactly(family, layout):
    n = BATCH + 5  # a full batch, then 5 examples padded over the replicas
    x, y = family.data(n, 2)
    model = _reference(family.name, layout).model
    got = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    # By hand: the module in inference mode on all n examples at once, a plain mean.
    module = nnx.clone(model.module)
    module.eval()
    y_pred = jax.tree.map(np.asarray, module(x))
    want = per_example_loss(family.loss, y, y_pred).mean()
    np.testing.assert_allclose(got["loss"], want, rtol=1e-5)
    if isinstance(family.loss, dict):  # Keras names each output's loss '<output>_loss'
        for name, loss in family.loss.items():
            want = per_example_loss(loss, y[name], y_pred[name]).mean()
            np.testing.assert_allclose(got[f"{name}_loss"], want, rtol=1e-5)


class _StopAt(phalanx.callbacks.Callback):
    """Interrupts `fit` after batch `batch` of epoch `epoch` has trained."""

    def __init__(self, epoch: int, batch: int):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


@families
def test_resumes_bitwise_from_a_mid_epoch_backup(family, layout, tmp_path):
    # A backup every 2 steps of a 3-step epoch; stopping after the last batch of epoch 1
    # leaves the latest backup one batch behind, mid-epoch. The same object resumes, so as not
    # to compile again: it holds the later step, and only restoring the backup's weights,
    # optimizer and RNG state, step count and data position reproduces the uninterrupted run
    # bit for bit.
    backup = phalanx.callbacks.BackupAndRestore(tmp_path / "backup", save_freq=2)
    model = _model(family, layout=layout)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(_dataset(family), epochs=EPOCHS, verbose=0, callbacks=[backup, _StopAt(1, 2)])
    assert (tmp_path / "backup").exists()
    model.fit(_dataset(family), epochs=EPOCHS, verbose=0, callbacks=[backup])
    straight = _reference(family.name, layout)
    assert model.train_step_count == straight.steps
    for a, b in zip(model.get_weights(), straight.weights, strict=True):
        np.testing.assert_array_equal(a, b)


@families
def test_computes_in_bfloat16_under_the_mixed_policy(family, layout):
    model = _model(family, layout=layout, precision="mixed_bfloat16")
    x, y = family.data(BATCH, 0)
    ops = matmuls(model, (x, y))
    assert ops, "the train step has no dot or convolution"
    # A float32-only matmul is a layer the policy missed. The one float32 operand allowed is
    # the gradient of attention logits, which flax keeps in float32 (softmax stability).
    assert [op for op in ops if set(op[1]) == {"f32"}] == []
    assert all("bf16" in operands for _, operands in ops), ops


# ---- the 'Done when' checks for stateful layers -------------------------------------
@_cases([f for f in FAMILIES if f.batchnorm])
def test_batchnorm_statistics_ignore_the_padding_of_a_partial_batch(family, layout):
    # 10 examples: padded to a multiple of the replicas on all devices, exact on one.
    x, y = family.data(10, 3)
    padded, exact = _model(family, layout=layout), _model(family, jax.devices()[:1])
    padded.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    exact.fit(x, y, batch_size=10, epochs=1, verbose=0, shuffle=False)

    def statistics(model):
        return jax.tree.leaves(nnx.state(model.module, nnx.BatchStat))

    with nnx.use_eager_sharding(False):  # annotated: outside a scope, Flax needs this
        fresh = jax.tree.leaves(nnx.state(family.module(0), nnx.BatchStat))
    for got, want, before in zip(statistics(padded), statistics(exact), fresh, strict=True):
        assert not np.allclose(want, before)  # one step moved every running statistic
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@_cases([f for f in FAMILIES if f.dropout])
def test_dropout_draws_new_masks_and_inference_is_deterministic(family, layout):
    # The reference model, so nothing compiles again (the invariants above read its copies).
    model = _reference(family.name, layout).model
    model.learning_rate = 0.0
    before = jax.tree.map(np.asarray, nnx.state(model.module, nnx.Param))
    data = phalanx.data.Dataset.from_tensor_slices(family.data(BATCH, 4)).batch(BATCH)
    losses = model.fit(data, epochs=2, verbose=0).history["loss"]
    after = nnx.state(model.module, nnx.Param)
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(a, b)  # learning rate 0: only the masks changed
    assert losses[0] != losses[1], losses
    x, y = family.data(BATCH + 5, 5)
    first = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True) == first


@families
def test_annotated_kernels_are_split(family, layout):
    """Under `model_parallel=M`, each device holds 1/M of every kernel the family annotates
    (parameters and Adam-style optimizer slots alike); without a model axis, a whole one."""
    model = _reference(family.name, layout).model
    m = model.strategy.model_parallel
    assert m == LAYOUTS[layout].get("model_parallel", 1)
    params = dict(
        ("/".join(str(k.key) for k in path[:-1]), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(model.engine.state["params"])[0]
    )
    assert family.split, "the family annotates no kernel"
    for path in family.split:
        kernel = params[path]
        shard = kernel.addressable_shards[0].data
        assert shard.size * m == kernel.size, (path, shard.shape, kernel.shape)
        assert len(kernel.addressable_shards) == len(jax.local_devices())
