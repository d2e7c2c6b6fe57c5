"""The packed form of the training state: scalars by dtype, both ways, inside jit too."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import phalanx
from phalanx._src.train.packing import Packing


def _state():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    n = jax.device_count()
    return {
        "metrics": [jax.device_put(np.float32(3.0), repl), jax.device_put(np.int32(7), repl)],
        "opt": {
            "count": jax.device_put(np.int32(5), repl),
            "lr": jax.device_put(np.float32(0.1), repl),
            "weak": jnp.asarray(2.0),  # weakly typed: stays as it is
            "key": jax.random.key(0),  # a PRNG key: stays as it is
            "sharded": jax.device_put(np.arange(2 * n, dtype=np.float32), rows),
        },
        "params": jax.device_put(np.ones((3, 2), np.float32), repl),
    }


def test_scalars_pack_by_dtype_and_come_back_unchanged():
    leaves, treedef = jax.tree.flatten(_state())
    packing = Packing.of(treedef, leaves, metric_leaves=2)
    packed = packing.pack(leaves)
    # metrics: one float32 and one int32 vector; the rest: weak, key, sharded, params as they
    # are, then one int32 and one float32 vector.
    assert packing.metric_count == 2
    assert len(packed) == 2 + 4 + 2 < len(leaves) + 1
    for back in (packing.leaves(packed), jax.jit(packing.unpack)(packed)):
        assert len(back) == len(leaves)
        for got, want in zip(back, leaves, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            if jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
                np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))
            else:
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert packing.leaves(packed)[-1] is packed[-3]  # arrays (params, last) pass as they are


def test_fit_keeps_the_state_packed_between_calls():
    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x):
            return self.dense(x)

    model = phalanx.Model(MLP(nnx.Rngs(0)))
    model.compile(optax.adam(1e-2), "mse", metrics=["mae"])
    x = np.ones((16, 4), np.float32)
    y = np.zeros((16, 3), np.float32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    packed, packing = model._state_leaves()
    leaves = jax.tree.leaves(model._state)
    assert len(packed) < len(leaves)  # Adam's count, the metric sums... travel as vectors
    before = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert model._state_leaves()[1] is packing  # the same packing: nothing recompiles
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
