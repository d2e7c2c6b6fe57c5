"""The packed form of the training state: scalars by width, both ways, inside jit too."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import phalanx
from phalanx._src.train.engine.packing import Packing


def _state():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    n = jax.device_count()
    assert n > 1, "the conftest sets several CPU devices: 'sharded' must be split"
    return {
        "metrics": [jax.device_put(np.float32(3.0), repl), jax.device_put(np.int32(7), repl)],
        "opt": {
            "count": jax.device_put(np.int32(5), repl),
            "lr": jax.device_put(np.float32(0.1), repl),
            "weak": jnp.asarray(2.0),  # weakly typed: stays as it is
            "key": jax.random.key(0),  # a PRNG key: stays as it is
            "sharded": jax.device_put(np.arange(2 * n, dtype=np.float32), rows),  # stays
            "scale": jax.device_put(jnp.bfloat16(-1.5), repl),
            "finite": jax.device_put(np.bool_(True), repl),
            "small": jax.device_put(np.int8(-3), repl),
            "half": jax.device_put(np.float16(0.25), repl),
        },
        "params": {
            "bias": jax.device_put(np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5, repl),
            "one": jax.device_put(np.float32([4.5]), repl),  # an array of one element: stays
        },
    }


def _assert_same(back, leaves):
    assert len(back) == len(leaves)
    for got, want in zip(back, leaves, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        if jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))
        else:
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_scalars_pack_by_width_and_come_back_unchanged():
    leaves, treedef = jax.tree.flatten(_state())
    packing = Packing.of(treedef, leaves, metric_leaves=2)
    packed = packing.pack(leaves)
    # metrics: float32 and int32 in one uint32 vector; the rest: key, sharded, weak and both
    # parameter arrays as they are, then one vector per width in leaf order: 32 (count, lr),
    # bool (finite), 16 (half, scale), 8 (small).
    assert packing.metric_count == 1
    assert [(str(v.dtype), v.shape) for v in (packed[0], *packed[-4:])] == [
        ("uint32", (2,)),
        ("uint32", (2,)),
        ("bool", (1,)),
        ("uint16", (2,)),
        ("uint8", (1,)),
    ]
    assert len(packed) == 1 + 5 + 4
    for back in (packing.leaves(packed), jax.jit(packing.unpack)(packed)):
        _assert_same(back, leaves)
    bias, one = leaves[-2:]
    assert packing.leaves(packed)[-2] is bias and packing.leaves(packed)[-1] is one  # as is


def test_zeroing_a_packed_vector_zeroes_each_of_its_scalars():
    leaves, treedef = jax.tree.flatten(_state())
    packing = Packing.of(treedef, leaves, metric_leaves=2)
    packed = packing.pack(leaves)
    zeroed = [jnp.zeros_like(packed[0]), *packed[1:]]  # as `reset_metrics` does
    total, count = packing.leaves(zeroed)[:2]
    assert (total.dtype, float(total), count.dtype, int(count)) == (np.float32, 0.0, np.int32, 0)


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
    packed, packing = model.engine.leaves()
    leaves = jax.tree.leaves(model.engine.state)
    assert len(packed) < len(leaves)  # Adam's count, the metric sums... travel as vectors
    before = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert model.engine.leaves()[1] is packing  # the same packing: nothing recompiles
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
