"""One SGD / Adam step in global view and per replica equals one device on the same batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import phalanx

GLOBAL_BATCH = 24  # divides 1, 2, 3, 4 and 8 replicas
# Strategies over the first n devices: the 8-device run already covers 3 replicas, so these
# are not run again at 3 devices (`multidevice`); the test on every device is.
REPLICA_COUNTS = [n for n in (1, 2, 3, 4, 8) if n <= jax.device_count()]
OPTIMIZERS = {"sgd": lambda: optax.sgd(0.1), "adam": lambda: optax.adam(1e-2)}


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH, 12)).astype(np.float32)
    y = rng.integers(0, 5, size=GLOBAL_BATCH).astype(np.int32)
    return x, y


def _params():
    k1, k2 = jax.random.split(jax.random.key(1))
    return {
        "w1": jax.random.normal(k1, (12, 16)) * 0.3,
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(k2, (16, 5)) * 0.3,
        "b2": jnp.zeros(5),
    }


def _per_example_loss(params, x, y):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return optax.softmax_cross_entropy_with_integer_labels(h @ params["w2"] + params["b2"], y)


def _one_device(tx):
    x, y = _data()
    params = _params()
    grads = jax.grad(lambda p: _per_example_loss(p, x, y).mean())(params)
    updates, _ = tx.update(grads, tx.init(params), params)
    return grads, optax.apply_updates(params, updates)


def _close(a, b, atol):
    for (path, u), v in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True
    ):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=atol, err_msg=str(path))


@pytest.mark.parametrize("replicas", REPLICA_COUNTS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_global_view_step(replicas, name):
    tx = OPTIMIZERS[name]()
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    params = strategy.replicate(_params())
    opt_state = strategy.replicate(tx.init(params))
    (batch,) = list(strategy.experimental_distribute_dataset([_data()]))

    @jax.jit
    def step(params, opt_state, batch):
        x, y = batch
        grads = jax.grad(lambda p: _per_example_loss(p, x, y).mean())(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return grads, optax.apply_updates(params, updates)

    grads, new_params = step(params, opt_state, batch)
    want_grads, want_params = _one_device(tx)
    _close(grads, want_grads, 1e-6)
    _close(new_params, want_params, 1e-5)


@pytest.mark.parametrize("replicas", REPLICA_COUNTS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_per_replica_step_with_pytrees(replicas, name):
    tx = OPTIMIZERS[name]()
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    params = strategy.replicate(_params())
    (batch,) = list(strategy.experimental_distribute_dataset([_data()]))

    def replica_step(params, batch):
        x, y = batch
        loss_fn = lambda p: phalanx.compute_average_loss(_per_example_loss(p, x, y))  # noqa: E731
        grads = jax.grad(loss_fn)(params)
        return phalanx.get_replica_context().all_reduce("sum", grads)

    grads = strategy.run(replica_step, args=(params, batch))
    assert not any(isinstance(g, phalanx.PerReplica) for g in jax.tree.leaves(grads))
    updates, _ = tx.update(grads, tx.init(params), params)
    want_grads, want_params = _one_device(tx)
    _close(grads, want_grads, 1e-6)
    _close(optax.apply_updates(params, updates), want_params, 1e-5)


class _MLP(nnx.Module):
    def __init__(self, params):
        self.w1, self.b1 = nnx.Param(params["w1"]), nnx.Param(params["b1"])
        self.w2, self.b2 = nnx.Param(params["w2"]), nnx.Param(params["b2"])

    def __call__(self, x):
        h = jax.nn.relu(x @ self.w1[...] + self.b1[...])
        return h @ self.w2[...] + self.b2[...]


@pytest.mark.parametrize("replicas", REPLICA_COUNTS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_per_replica_step_with_nnx_in_place(replicas, name):
    tx = OPTIMIZERS[name]()
    strategy = phalanx.Strategy(devices=jax.devices()[:replicas])
    with strategy.scope():
        model = _MLP(_params())
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    assert model.w1[...].sharding.is_fully_replicated
    assert len(model.w1[...].sharding.device_set) == replicas
    (batch,) = list(strategy.experimental_distribute_dataset([_data()]))

    def replica_step(model, optimizer, batch):
        x, y = batch

        def loss_fn(model):
            per_example = optax.softmax_cross_entropy_with_integer_labels(model(x), y)
            return phalanx.compute_average_loss(per_example)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        grads = phalanx.get_replica_context().all_reduce("sum", grads)
        optimizer.update(model, grads)
        return loss

    losses = strategy.run(replica_step, args=(model, optimizer, batch))
    x, y = _data()
    want_loss = _per_example_loss(_params(), x, y).mean()
    assert float(strategy.reduce("sum", losses)) == pytest.approx(float(want_loss), rel=1e-6)
    _, want_params = _one_device(tx)
    got = {"w1": model.w1[...], "b1": model.b1[...], "w2": model.w2[...], "b2": model.b2[...]}
    _close(got, want_params, 1e-5)
    assert int(optimizer.step[...]) == 1
    assert model.w1[...].sharding.is_fully_replicated


@pytest.mark.multidevice
def test_partial_last_batch_compiles_once():
    strategy = phalanx.Strategy()
    n = strategy.num_replicas_in_sync
    x = np.arange(4 * n * 3 + n + 1, dtype=np.float32)  # 3 full batches, then a partial one
    batches = [x[i : i + 4 * n] for i in range(0, len(x), 4 * n)]
    assert len(batches[-1]) < 4 * n

    def replica_step(total, batch):
        return phalanx.get_replica_context().all_reduce("sum", phalanx.compute_average_loss(batch))

    means = [strategy.run(replica_step, args=(0.0, b)) for b in strategy.distribute(batches)]
    assert len(strategy._run_cache) == 1
    (compiled,) = strategy._run_cache.values()
    assert compiled.call._cache_size() == 1
    np.testing.assert_allclose([float(m) for m in means], [b.mean() for b in batches], rtol=1e-6)

    global_step = jax.jit(lambda b: jnp.sum(jnp.where(phalanx.get_batch_mask(b), b[0], 0.0)))
    sums = [float(global_step(b)) for b in strategy.distribute([(b,) for b in batches])]
    assert global_step._cache_size() == 1
    np.testing.assert_allclose(sums, [b.sum() for b in batches])
