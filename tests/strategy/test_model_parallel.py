"""Model parallelism (issue 24): `Strategy(model_parallel=M)` lays the devices out as
`N/M` replicas of `M` devices, and the model's own annotations split its layers over them.

The invariants over the model families run at `data 4 x model 2` in
tests/model/test_families.py; this file covers the strategy itself: the mesh, the
annotations and rules, custom loops, checkpoints across layouts, memory, and refusals.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx
from phalanx._src.strategy.sharding import memory_report, state_memory
from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer
from phalanx._src.train.summary import summary_text

N = jax.device_count()
needs_model_axis = pytest.mark.skipif(
    N < 4 or N % 2, reason="model_parallel=2 needs an even device count of at least 4"
)
RULES = [("mlp", "model"), ("embed", None)]


def _part(*names):
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


class Wide(nnx.Module):
    """An MLP annotated in logical names (`RULES` map them): up splits its output, down its
    input, as Megatron splits an MLP."""

    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(8, 16, kernel_init=_part("embed", "mlp"), rngs=rngs)
        self.down = nnx.Linear(16, 4, kernel_init=_part("mlp", "embed"), rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def _data(n: int = 40, seed: int = 0):
    x = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)
    return x, x[:, :4].argmax(1).astype(np.int32)


def _model(strategy: phalanx.Strategy, seed: int = 0, **compile_kwargs) -> phalanx.Model:
    with strategy.scope():
        model = phalanx.Model(Wide(nnx.Rngs(seed)))
        model.compile(
            optimizer="adam",
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            **compile_kwargs,
        )
    return model


def _shard_fraction(array: jax.Array) -> float:
    return array.addressable_shards[0].data.size / array.size


@needs_model_axis
def test_the_mesh_groups_consecutive_devices_and_counts_data_replicas():
    strategy = phalanx.Strategy(model_parallel=2)
    assert dict(strategy.mesh.shape) == {"data": N // 2, "model": 2}
    assert strategy.num_replicas_in_sync == N // 2
    assert strategy.num_local_replicas == N // 2
    assert strategy.model_parallel == 2
    grid = strategy.mesh.devices
    assert [list(row) for row in grid] == [
        list(jax.devices()[2 * r : 2 * r + 2]) for r in range(N // 2)
    ]
    assert "model_parallel=2" in repr(strategy)
    assert phalanx.Strategy().model_parallel == 1


def test_an_annotated_model_builds_and_trains_without_a_model_axis():
    # One device and data parallelism alone: the annotations mean replicated.
    x, y = _data()
    losses = []
    for strategy in (
        phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES),
        phalanx.Strategy(axis_rules=RULES),
    ):
        model = _model(strategy)
        kernel = model.engine.state["params"]["up"]["kernel"].get_value()
        assert kernel.sharding.is_fully_replicated
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
        losses.append(history.history["loss"])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


@needs_model_axis
@pytest.mark.parametrize("state_sharding", ["replicated", "zero1", "fsdp"])
def test_fit_on_a_data_x_model_mesh_equals_one_device(state_sharding):
    x, y = _data()
    one = _model(phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES))
    split = _model(
        phalanx.Strategy(model_parallel=2, axis_rules=RULES, state_sharding=state_sharding),
        steps_per_execution=2,
    )
    fits = [m.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False) for m in (one, split)]
    np.testing.assert_allclose(fits[1].history["loss"], fits[0].history["loss"], rtol=1e-5)
    for a, b in zip(split.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split.evaluate(x, y, verbose=0), one.evaluate(x, y, verbose=0))
    np.testing.assert_allclose(split.predict(x, verbose=0), one.predict(x, verbose=0), atol=1e-6)
    # Each model group's devices hold half of each annotated kernel and of its Adam moments;
    # zero1 / fsdp split the optimizer state / parameters over the data axis as well.
    state = split.engine.state
    up = state["params"]["up"]["kernel"].get_value()
    data_split = N // 2 if state_sharding == "fsdp" else 1
    assert _shard_fraction(up) == 1 / (2 * data_split)
    moments = [
        leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(state["opt"])[0]
        if "'up'" in jax.tree_util.keystr(path) and "'kernel'" in jax.tree_util.keystr(path)
    ]
    assert moments
    opt_split = 1 if state_sharding == "replicated" else N // 2
    assert all(_shard_fraction(m) == 1 / (2 * opt_split) for m in moments)
    bias = state["params"]["up"]["bias"].get_value()  # not annotated: only fsdp splits it
    assert _shard_fraction(bias) == 1 / data_split


@needs_model_axis
def test_gradient_accumulation_on_a_split_model_equals_the_whole_batch():
    x, y = _data()
    one = _model(phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES))
    one.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    split = _model(
        phalanx.Strategy(model_parallel=2, axis_rules=RULES), gradient_accumulation_steps=2
    )
    split.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)  # 2 halves an update
    for a, b in zip(split.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _custom_loop(strategy: phalanx.Strategy, x, y):
    """The seeds' custom loop: a step that closes over the model and optimizer. Returns
    (global losses, the model, the steps' all-reduced replica counts, the per-replica rows)."""
    with strategy.scope():
        model = Wide(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    dataset = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(10)
    rows = []

    def step(batch):
        bx, by = batch
        rows.append(bx.shape[0])  # the replica's share of the global batch

        def loss_fn(model):
            logits = model(bx)
            per_example = optax.softmax_cross_entropy_with_integer_labels(logits, by)
            return phalanx.compute_average_loss(per_example)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)  # summed over the data axis, as apply_gradients
        return loss, phalanx.get_replica_context().all_reduce("sum", 1.0)

    @phalanx.function
    def train(batch):
        loss, count = strategy.run(step, args=(batch,))
        return strategy.reduce("sum", loss, axis=None), count

    outs = [train(b) for b in strategy.experimental_distribute_dataset(dataset)]
    return [float(o[0]) for o in outs], model, [float(o[1]) for o in outs], rows


@needs_model_axis
def test_a_custom_loop_closing_over_a_split_model_equals_one_device():
    x, y = _data(24)
    one = _custom_loop(phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES), x, y)
    strategy = phalanx.Strategy(model_parallel=2, axis_rules=RULES)
    losses, model, counts, rows = _custom_loop(strategy, x, y)
    np.testing.assert_allclose(losses, one[0], rtol=1e-5)
    got, want = nnx.state(model, nnx.Param), nnx.state(one[1], nnx.Param)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    replicas = strategy.num_replicas_in_sync
    assert rows[0] == -(-10 // replicas)  # each replica sees its data shard
    assert counts == [replicas] * len(counts)  # all_reduce spans the data axis
    assert _shard_fraction(model.up.kernel[...]) == 1 / 2


@needs_model_axis
def test_a_checkpoint_written_on_4x2_restores_on_other_layouts(tmp_path):
    x, y = _data()
    written = _model(phalanx.Strategy(model_parallel=2, axis_rules=RULES))
    written.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    checkpointer = TrainCheckpointer(tmp_path / "ck", asynchronous=False)
    checkpointer.save(1, written.engine, {"epoch": 0})
    checkpointer.close()
    want = [np.asarray(a) for a in jax.tree.leaves(written.engine.state)]
    targets = [
        phalanx.Strategy(axis_rules=RULES),  # N x 1
        phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES),
    ]
    if N % 4 == 0:
        targets.append(phalanx.Strategy(model_parallel=4, axis_rules=RULES))  # 2 x 4 on 8
    for strategy in targets:
        fresh = _model(strategy, seed=7)
        fresh.load_checkpoint(tmp_path / "ck")
        got = [np.asarray(a) for a in jax.tree.leaves(fresh.engine.state)]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        kernel = fresh.engine.state["params"]["up"]["kernel"].get_value()
        assert _shard_fraction(kernel) == 1 / strategy.model_parallel
        fresh.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)  # trains on


@needs_model_axis
def test_a_custom_loop_checkpoint_restores_onto_a_split_model(tmp_path):
    with phalanx.Strategy(devices=jax.devices()[:1], axis_rules=RULES).scope():
        model = Wide(nnx.Rngs(0))
    phalanx.Checkpoint(model=model).save(tmp_path / "ck")
    strategy = phalanx.Strategy(model_parallel=2, axis_rules=RULES)
    with strategy.scope():
        fresh = Wide(nnx.Rngs(1))
    phalanx.Checkpoint(model=fresh).restore(phalanx.latest_checkpoint(tmp_path))
    np.testing.assert_array_equal(
        np.asarray(fresh.up.kernel[...]), np.asarray(model.up.kernel[...])
    )
    assert _shard_fraction(fresh.up.kernel[...]) == 1 / 2


@needs_model_axis
def test_memory_report_counts_each_layout_per_device():
    model = _model(phalanx.Strategy(model_parallel=2, axis_rules=RULES))
    report = memory_report(model)
    assert report["model_parallel"] == 2
    state = model.engine.state

    def on_one_device(tree):
        return sum(a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(tree))

    assert report["sharded"]["params"] == on_one_device(state["params"])
    assert report["sharded"]["optimizer"] == on_one_device(state["opt"])
    assert report["sharded"]["total"] < report["replicated"]["total"]
    assert report["layouts"]["fsdp"]["params"] < report["layouts"]["replicated"]["params"]
    text = summary_text(model)
    assert f"(replicated, model_parallel=2): params {report['sharded']['params']:,} B" in text
    # From shapes only: both kernels halve, the biases do not.
    kernels = 4 * (8 * 16 + 16 * 4)
    biases = 4 * (16 + 4)
    abstract = {"params": state["params"], "opt": {}}
    assert state_memory(abstract, 4, "replicated", 2, RULES)["params"] == kernels / 2 + biases


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model_parallel": 3 if N % 3 else 5}, "must divide the device count"),
        ({"model_parallel": 0}, "at least 1"),
        ({"model_parallel": "2"}, "positive int"),
        ({"axis_rules": {"mlp": "model"}}, "list of \\(logical name, mesh axis\\) pairs"),
        ({"axis_rules": [("mlp", 3)]}, "is not a \\(logical name, mesh axis or None\\) pair"),
    ],
)
def test_a_strategy_that_cannot_be_laid_out_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        phalanx.Strategy(**kwargs)


def test_an_unmapped_or_indivisible_annotation_is_refused_when_built():
    unmapped = r"'embed' is neither a mesh axis.*axis_rules=\[\('embed'"
    with pytest.raises(ValueError, match=unmapped), phalanx.Strategy().scope():
        Wide(nnx.Rngs(0))
    if N >= 4 and N % 2 == 0:
        uneven = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
        strategy = phalanx.Strategy(model_parallel=2)
        uneven_split = "axis 1 of size 5 does not split over 2 devices"
        with pytest.raises(ValueError, match=uneven_split), strategy.scope():
            nnx.Linear(4, 5, kernel_init=uneven, rngs=nnx.Rngs(0))


@pytest.mark.skipif(N < 2, reason="needs 2 devices")
def test_strategy_run_with_one_model_group_is_refused():
    strategy = phalanx.Strategy(model_parallel=N)
    with pytest.raises(ValueError, match="at least 2 replicas under model parallelism"):
        strategy.run(lambda: 1.0)
