"""The train-state layouts of Strategy(state_sharding=...): validation, per-leaf specs,
placement, and per-device bytes computed from shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import phalanx
from phalanx._src.strategy.sharding import leaf_spec, state_memory

N = jax.device_count()


def test_unknown_mode_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"state_sharding must be one of .*'zero2'"):
        phalanx.Strategy(state_sharding="zero2")
    assert phalanx.Strategy().state_sharding == "replicated"


def test_leaf_spec_splits_the_largest_divisible_axis():
    assert leaf_spec((10, 512), 8, "data") == P(None, "data")
    assert leaf_spec((64, 32), 8, "data") == P("data")
    assert leaf_spec((24, 24), 8, "data") == P("data")  # a tie: the first axis
    assert leaf_spec((10,), 8, "data") == P()  # no divisible axis: replicated
    assert leaf_spec((), 8, "data") == P()
    assert leaf_spec((16, 16), 1, "data") == P()


def _state():
    params = {"w": jnp.ones((6, 24)), "b": jnp.ones((5,))}
    return {
        "params": params,
        "opt": optax.adam(1e-3).init(params),
        "rest": {"key": jax.random.key(0), "stat": jnp.zeros((24,))},
        "metrics": {"sum": jnp.zeros(())},
    }


@pytest.mark.multidevice
@pytest.mark.parametrize("mode", ["replicated", "zero1", "fsdp"])
def test_place_train_state_lays_out_each_part(mode):
    strategy = phalanx.Strategy(state_sharding=mode)
    placed = strategy.place_train_state(_state())
    sharded_parts = {"replicated": (), "zero1": ("opt",), "fsdp": ("params", "opt")}[mode]
    for part, tree in placed.items():
        for leaf in jax.tree.leaves(tree):
            want = leaf_spec(leaf.shape, N, "data") if part in sharded_parts else P()
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                want = P()  # RNG keys are never split
            assert leaf.sharding.spec == want, (part, leaf.shape)
            assert len(leaf.sharding.device_set) == N
    w = placed["params"]["w"]
    np.testing.assert_array_equal(np.asarray(w), np.ones((6, 24)))
    # A subset of the parts (as set_weights and the learning-rate setter pass) works too.
    only_opt = strategy.place_train_state({"opt": placed["opt"]})
    assert jax.tree.map(lambda a: a.sharding, only_opt["opt"]) == jax.tree.map(
        lambda a: a.sharding, placed["opt"]
    )


def test_state_memory_from_shapes_only():
    params = {
        "w": jax.ShapeDtypeStruct((1024, 4096), jnp.float32),
        "b": jax.ShapeDtypeStruct((10,), jnp.float32),  # not divisible: stays whole
    }
    opt = jax.eval_shape(optax.adam(1e-3).init, params)
    state = {"params": params, "opt": opt}
    full_w, b, count = 1024 * 4096 * 4, 10 * 4, 4
    replicated = state_memory(state, 64, "replicated")
    assert replicated == {
        "params": full_w + b,
        "optimizer": 2 * (full_w + b) + count,
        "total": 3 * (full_w + b) + count,
    }
    zero1 = state_memory(state, 64, "zero1")
    assert zero1["params"] == full_w + b
    assert zero1["optimizer"] == 2 * (full_w // 64 + b) + count
    fsdp = state_memory(state, 64, "fsdp")
    assert fsdp["params"] == full_w // 64 + b
    assert fsdp["total"] == fsdp["params"] + zero1["optimizer"]
    with pytest.raises(ValueError, match="state_sharding must be one of"):
        state_memory(state, 8, "zero3")
