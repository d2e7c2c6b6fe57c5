"""The strategy layer across two processes x two CPU devices (four replicas).

Each body runs in both processes after `phalanx.cluster.resolve()`; every process checks the
numbers it can read itself, so a wrong answer in either process fails the test.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from multiprocess_harness import run_multiprocess

import phalanx

pytestmark = pytest.mark.multiprocess


def _host(value) -> np.ndarray:
    """A strategy result as NumPy; it must be readable by this process on its own."""
    return np.asarray(value)


# ---- 1. topology ------------------------------------------------------------------------------
def _topology_body() -> None:
    strategy = phalanx.Strategy()
    assert strategy.num_replicas_in_sync == 4
    assert strategy.num_local_replicas == 2
    assert [d.process_index for d in strategy.devices] == [0, 0, 1, 1]
    assert not strategy.data_sharding.is_fully_addressable


def test_strategy_spans_both_processes():
    run_multiprocess(_topology_body)


# ---- 2. strategy.reduce -----------------------------------------------------------------------
def _reduce_body() -> None:
    strategy = phalanx.Strategy()
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.arange(4) + 4 * ctx.replica_id_in_sync_group
    )
    # Replica r holds [4r, 4r+1, 4r+2, 4r+3]; replicas 0, 1 live in process 0, 2, 3 in process 1.
    np.testing.assert_array_equal(
        _host(strategy.reduce("sum", values, axis=None)), [24, 28, 32, 36]
    )
    np.testing.assert_allclose(_host(strategy.reduce("mean", values, axis=None)), [6, 7, 8, 9])
    assert _host(strategy.reduce("sum", values, axis=0)) == 120  # sum(range(16))
    assert _host(strategy.reduce("mean", values, axis=0)) == 7.5
    np.testing.assert_array_equal(
        _host(strategy.reduce("max", values, axis=None)), [12, 13, 14, 15]
    )
    assert _host(strategy.reduce("min", values, axis=0)) == 0

    local = strategy.experimental_local_results(values)
    first = 2 * jax.process_index()
    assert len(local) == 2
    for offset, part in enumerate(local):
        np.testing.assert_array_equal(_host(part), np.arange(4) + 4 * (first + offset))


def test_reduce_across_processes():
    run_multiprocess(_reduce_body)


# ---- 3. ReplicaContext.all_reduce inside strategy.run -----------------------------------------
def _all_reduce_body() -> None:
    strategy = phalanx.Strategy()

    def step(scale):
        ctx = phalanx.get_replica_context()
        mine = (ctx.replica_id_in_sync_group + 1).astype(np.float32)  # 1, 2, 3, 4
        return {
            "sum": ctx.all_reduce("sum", mine),
            "mean": ctx.all_reduce("mean", mine),
            "max": ctx.all_reduce("max", mine * scale),
            "mine": mine,
        }

    out = strategy.run(step, args=(np.float32(2.0),))
    assert float(out["sum"]) == 10.0
    assert float(out["mean"]) == 2.5
    assert float(out["max"]) == 8.0
    assert isinstance(out["mine"], phalanx.PerReplica)
    first = 2 * jax.process_index()
    local = [float(v) for v in strategy.experimental_local_results(out["mine"])]
    assert local == [first + 1.0, first + 2.0]
    # A mirrored run result is one copy per replica: SUM counts it four times.
    assert float(strategy.reduce("sum", out["sum"], axis=None)) == 40.0
    assert float(strategy.reduce("sum", out["mine"], axis=None)) == 10.0


def test_all_reduce_in_run_across_processes():
    run_multiprocess(_all_reduce_body)


# ---- 4. process-local batches -----------------------------------------------------------------
def _rows(process: int, n: int, start: int = 0) -> np.ndarray:
    """Process `process`'s `n` local rows: row i of process p is [100p + i] * 3, from `start`."""
    ids = 100 * process + start + np.arange(n)
    return np.repeat(ids[:, None], 3, axis=1).astype(np.float32) + np.arange(3)


def _local_batches_body() -> None:
    strategy = phalanx.Strategy()
    me = jax.process_index()
    # A full batch of 4 rows per process, then the last one, spread as tf.distribute spreads
    # 5 rows over 2 processes: 3 rows, then 2.
    partial_rows = (3, 2)
    local = [_rows(me, 4), _rows(me, partial_rows[me], start=4)]
    batches = list(strategy.experimental_distribute_dataset(local))
    assert len(batches) == 2
    full, partial = batches

    assert full.shape == (8, 3)
    assert not full.is_fully_addressable
    everything = np.concatenate([_rows(p, 4) for p in (0, 1)])
    np.testing.assert_allclose(_host(strategy.reduce("sum", full, axis=0)), everything.sum(0))
    np.testing.assert_allclose(_host(strategy.reduce("mean", full, axis=0)), everything.mean(0))

    assert partial.shape == (8, 3)  # padded to the first batch's shape
    mask = phalanx.get_batch_mask(partial)
    assert mask is not None and mask.shape == (8,)
    real = np.concatenate([_rows(p, partial_rows[p], start=4) for p in (0, 1)])
    assert len(real) == 5
    np.testing.assert_allclose(_host(strategy.reduce("sum", partial, axis=0)), real.sum(0))
    np.testing.assert_allclose(
        _host(strategy.reduce("mean", partial, axis=0)), real.mean(0), rtol=1e-6
    )

    # Inside run, each replica sees its share and its mask: the masked count is 5 rows.
    def count_rows(batch):
        ctx = phalanx.get_replica_context()
        return ctx.all_reduce("sum", ctx.mask.astype(np.float32).sum())

    assert float(strategy.run(count_rows, args=(partial,))) == 5.0
    assert float(strategy.run(count_rows, args=(full,))) == 8.0


def _partial_first_batch_body() -> None:
    """When the first batch is already partial (3 | 2 rows), the processes still agree on one
    global shape, so shape-dependent collectives (an all_gather) line up."""
    strategy = phalanx.Strategy()
    me = jax.process_index()
    partial_rows = (3, 2)
    (batch,) = strategy.experimental_distribute_dataset([_rows(me, partial_rows[me])])
    assert batch.shape == (8, 3)  # ceil(3 / 2) = 2 rows per replica, everywhere
    real = np.concatenate([_rows(p, partial_rows[p]) for p in (0, 1)])
    np.testing.assert_allclose(
        _host(strategy.reduce("mean", batch, axis=0)), real.mean(0), rtol=1e-6
    )

    def gather(batch):
        ctx = phalanx.get_replica_context()
        return ctx.all_gather(batch), ctx.all_gather(ctx.mask)

    rows, mask = strategy.run(gather, args=(batch,))
    for part, keep in zip(
        strategy.experimental_local_results(rows),
        strategy.experimental_local_results(mask),
        strict=True,
    ):
        np.testing.assert_array_equal(_host(part)[_host(keep)], real)


def test_process_local_batches_become_global_batches():
    run_multiprocess(_local_batches_body)


def test_a_partial_first_batch_has_one_global_shape():
    run_multiprocess(_partial_first_batch_body)


# ---- 5. a phalanx Dataset, split over processes -----------------------------------------------
def _dataset_body() -> None:
    strategy = phalanx.Strategy()
    n, batch = 29, 8  # three full global batches and a partial one of 5
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2) ** 1.5
    ds = phalanx.data.Dataset.from_tensor_slices(x).batch(batch)
    dist = strategy.experimental_distribute_dataset(ds)

    expected = [x[i : i + batch].sum(0) for i in range(0, n, batch)]
    sums = [_host(strategy.reduce("sum", b, axis=0)) for b in dist]
    assert len(sums) == len(expected) == 4
    np.testing.assert_allclose(np.stack(sums), np.stack(expected), rtol=1e-6)

    # Each process was fed only its share: ceil(8 / 2) = 4 rows of a full batch, 3 and 2 of
    # the last one.
    me = jax.process_index()
    shares = [np.asarray(b) for b in ds.process_split(me, 2)]
    assert [len(s) for s in shares] == [4, 4, 4, (3, 2)[me]]
    first = next(iter(dist))
    mine = np.concatenate(
        [
            np.asarray(s.data)
            for s in sorted(first.addressable_shards, key=lambda s: s.index[0].start)
        ]
    )
    np.testing.assert_array_equal(mine, x[4 * me : 4 * me + 4])


def test_phalanx_dataset_reads_only_each_process_share():
    run_multiprocess(_dataset_body)


# ---- 6. Model.fit ------------------------------------------------------------------------------
class _MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(6, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


_LOSS = phalanx.losses.SparseCategoricalCrossentropy(from_logits=True)


def _fit_history(strategy: phalanx.Strategy, device_data: bool | str) -> dict[str, list]:
    """Fits a tiny MLP with fixed seeds; returns its history, weights, evaluation, predictions."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(52, 6)).astype(np.float32)
    y = np.abs(x[:, :3]).argmax(1).astype(np.int32)
    with strategy.scope():
        model = phalanx.Model(_MLP(nnx.Rngs(0)))
        model.compile(
            optimizer=optax.sgd(0.3),
            loss=_LOSS,
            metrics=["accuracy"],
        )
    # 52 rows in batches of 16: three full batches and a partial one of 4, reshuffled per epoch.
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(52, seed=7).batch(16)
    history = model.fit(ds, epochs=4, verbose=0, device_data=device_data).history
    # evaluate and predict read host batches (device_data=False): both input paths are used.
    evaluation = model.evaluate(x, y, batch_size=12, verbose=0, return_dict=True, device_data=False)
    predictions = model.predict(
        x[:11], batch_size=8, verbose=0, device_data=False
    )  # 8 rows, then a partial 3
    assert predictions.shape == (11, 3)
    return {
        "loss": history["loss"],
        "accuracy": history["accuracy"],
        "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
        "evaluation": [evaluation["loss"], evaluation["accuracy"]],
        "predictions": np.asarray(predictions).ravel().tolist(),
    }


def _fit_body(reference: str, device_data: bool | str) -> None:
    with open(reference) as f:
        expected = json.load(f)
    got = _fit_history(phalanx.Strategy(), device_data)
    assert len(got["loss"]) == 4
    for key in ("loss", "accuracy", "evaluation", "predictions"):
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-4, atol=1e-6, err_msg=key)
    assert len(got["weights"]) == len(expected["weights"]) == 4
    for mine, theirs in zip(got["weights"], expected["weights"], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device_data", [True, False], ids=["on_device_rows", "host_batches"])
def test_fit_on_two_processes_equals_one_process(tmp_path, device_data):
    # The single-process reference feeds fit the other way, so the two input paths must agree.
    reference = _fit_history(
        phalanx.Strategy(devices=jax.devices()[:4]), device_data=not device_data
    )
    assert reference["loss"][-1] < reference["loss"][0]  # it trains
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(reference))
    run_multiprocess(_fit_body, kwargs={"reference": str(path), "device_data": device_data})


def _shuffled_arrays_fit(strategy: phalanx.Strategy) -> list[float]:
    """fit on arrays with the default shuffle (no seed) from NumPy's global seed 0 in
    process 0 (and another seed in every other process)."""
    np.random.seed(jax.process_index())
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = np.abs(x[:, :3]).argmax(1).astype(np.int32)
    with strategy.scope():
        model = phalanx.Model(_MLP(nnx.Rngs(0)))
        model.compile(optimizer=optax.sgd(0.3), loss=_LOSS)
    return model.fit(x, y, batch_size=16, epochs=3, verbose=0).history["loss"]


def _shuffled_arrays_body(reference: list[float]) -> None:
    np.testing.assert_allclose(_shuffled_arrays_fit(phalanx.Strategy()), reference, rtol=1e-5)


def test_without_a_seed_every_process_shuffles_as_process_0():
    # Each process draws its own seed; all must use process 0's, or each would read its share
    # of a differently shuffled batch: examples seen twice or never, silently.
    saved = np.random.get_state()
    try:
        reference = _shuffled_arrays_fit(phalanx.Strategy(devices=jax.devices()[:4]))
    finally:
        np.random.set_state(saved)
    run_multiprocess(_shuffled_arrays_body, kwargs={"reference": reference})


def _default_device_data_body() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=20).astype(np.int32)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(8)
    losses = []
    for kwargs in ({}, {"device_data": False}):  # the default (device_data="auto"), the host path
        with phalanx.Strategy().scope():
            model = phalanx.Model(_MLP(nnx.Rngs(0)))
            model.compile(optimizer=optax.sgd(0.3), loss=_LOSS)
        losses.append(model.fit(ds, epochs=1, verbose=0, **kwargs).history["loss"])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def test_fit_with_default_device_data_on_two_processes():
    run_multiprocess(_default_device_data_body)


@pytest.mark.slow
def test_fit_on_four_processes_of_two_devices_equals_eight_devices(tmp_path):
    # The 4 x 2 pod shape against one process with 8 devices: same history, weights, outputs.
    reference = _fit_history(phalanx.Strategy(devices=jax.devices()[:8]), device_data=False)
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(reference))
    run_multiprocess(
        _fit_body,
        num_processes=4,
        cpu_devices=2,
        timeout=180,
        kwargs={"reference": str(path), "device_data": True},
    )
