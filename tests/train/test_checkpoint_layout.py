"""The checkpoint layout: replicated leaves packed per dtype, the others copied as they are,
and everything restored in the target's shardings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from phalanx._src.train.checkpoint.layout import Layout

N = jax.device_count()


def _state(mesh, sharded_axis):
    repl, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(sharded_axis))
    put = jax.device_put
    return {
        "params": {"w": put(jnp.arange(12.0).reshape(4, 3), repl), "b": put(jnp.ones(3), repl)},
        "count": put(jnp.int32(7), repl),
        "moments": put(jnp.arange(2.0 * N).reshape(N, 2), rows),
        "key": put(jax.random.key(3), repl),
    }


def _values(state):
    """Host copies of every leaf, PRNG keys as their raw data."""

    def value(a):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended):
            a = jax.random.key_data(a)
        return np.array(a)  # a copy: a view of a CPU buffer would block its donation

    return jax.tree.map(value, state)


def test_replicated_leaves_are_packed_per_dtype_and_the_others_kept():
    mesh = jax.make_mesh((N,), ("data",))
    state = _state(mesh, "data")
    layout = Layout.of(state)
    arrays = layout.pack(jax.tree.leaves(state))
    # Flattening order: count, key, moments, params/b, params/w.
    if N == 1:  # "sharded" over one device is replicated: the moments are packed too
        assert layout.places == (("p0", 0), ("l1", 0), ("p1", 0), ("p1", 2), ("p1", 5))
        assert sorted(arrays) == ["l1", "p0", "p1"]
        packed = [np.arange(2.0), np.ones(3), np.arange(12.0)]
    else:
        assert layout.places == (("p0", 0), ("l1", 0), ("l2", 0), ("p1", 0), ("p1", 3))
        assert sorted(arrays) == ["l1", "l2", "p0", "p1"]
        assert arrays["l2"].sharding.is_equivalent_to(state["moments"].sharding, 2)
        packed = [np.ones(3), np.arange(12.0)]
    np.testing.assert_array_equal(arrays["p1"], np.concatenate(packed))
    assert arrays["p1"].sharding.is_fully_replicated
    assert arrays["p0"].dtype == jnp.int32 and arrays["p0"].shape == (1,)


def _next(a):
    return (
        jax.random.fold_in(a, 1) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended) else a + 1
    )


def test_packed_arrays_are_new_buffers_that_outlive_a_donation():
    state = _state(jax.make_mesh((N,), ("data",)), "data")
    expected = _values(state)
    layout = Layout.of(state)
    arrays = layout.pack(jax.tree.leaves(state))
    # A training step: it donates every buffer of the state it is given, and overwrites it.
    jax.jit(lambda s: jax.tree.map(_next, s), donate_argnums=0)(state)
    assert all(a.is_deleted() for a in jax.tree.leaves(state))
    restored = layout.unpack(arrays, state)
    jax.tree.map(np.testing.assert_array_equal, _values(restored), expected)


def test_unpack_places_leaves_in_the_targets_shardings():
    saved = _state(jax.make_mesh((N,), ("data",)), "data")
    layout = Layout.from_description(Layout.of(saved).describe())  # as read from disk
    arrays = Layout.of(saved).pack(jax.tree.leaves(saved))
    # The target: fewer devices, parameters sharded, the moments replicated.
    devices = jax.devices()[: max(1, N // 2)]
    mesh = jax.make_mesh((len(devices),), ("half",), devices=devices)
    target = _state(mesh, None)
    target["params"]["w"] = jax.device_put(
        jnp.zeros((4, 3)), NamedSharding(mesh, P("half" if 4 % len(devices) == 0 else None))
    )
    restored = layout.unpack(_read(arrays, layout.abstract(target)), target)
    jax.tree.map(np.testing.assert_array_equal, _values(restored), _values(saved))
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
        assert got.sharding == want.sharding


def _read(arrays, abstract):
    """What Orbax's restore does with the stored arrays: place them as `abstract` says."""
    assert sorted(arrays) == sorted(abstract)
    for name, spec in abstract.items():
        assert (arrays[name].shape, arrays[name].dtype) == (spec.shape, spec.dtype), name
    return {name: jax.device_put(arrays[name], abstract[name].sharding) for name in arrays}


def test_a_state_of_another_structure_is_refused_with_the_differing_leaves():
    mesh = jax.make_mesh((N,), ("data",))
    layout = Layout.of(_state(mesh, "data"))
    other = _state(mesh, "data")
    other["params"]["w"] = jnp.zeros((5, 3))
    with pytest.raises(ValueError, match=r"\['params'\]\['w'\]: \(4, 3\) vs \(5, 3\)"):
        layout.abstract(other)
