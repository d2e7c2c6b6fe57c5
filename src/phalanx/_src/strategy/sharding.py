"""Where the train state lives: replicated, or sharded over the data axis (ZeRO-1, FSDP).

`Strategy(state_sharding=...)` picks one of three modes:

- `"replicated"` (default): every replica holds the whole train state, as tf.distribute's
  mirrored variables.
- `"zero1"`: optimizer state sharded over the replicas (ZeRO stage 1). Parameters stay
  replicated; XLA reduce-scatters the gradients into the sharded optimizer update and
  all-gathers the parameter updates.
- `"fsdp"`: parameters sharded as well (FSDP, ZeRO stage 3). Each replica stores 1/N of every
  shardable parameter; the compiled step all-gathers them where they are used.

Each array leaf is split along one axis whose size is divisible by the replica count (the
largest such axis, the first on a tie), so Adam's moments get the same layout as their
parameters and the update needs no communication. A leaf with no such axis (scalars, a bias
of 10 on 8 replicas) stays replicated. The model's other variables (batch statistics, RNG
state) and the metric sums are always replicated. The numbers are the same in every mode:
only where the bytes live changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MODES = ("replicated", "zero1", "fsdp")
# Which parts of the train state each mode shards (the others are replicated).
_SHARDED_PARTS = {"replicated": (), "zero1": ("opt",), "fsdp": ("params", "opt")}


def check_mode(mode: Any) -> str:
    """`mode`, validated.

    Raises:
      ValueError: for anything but 'replicated', 'zero1' or 'fsdp'.
    """
    if mode is None:
        return "replicated"
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(
            f"state_sharding must be one of {MODES}, got {mode!r}; e.g. "
            "Strategy(state_sharding='zero1') shards the optimizer state over the replicas, "
            "'fsdp' the parameters too"
        )
    return mode


def _shardable(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and not jnp.issubdtype(dtype, jax.dtypes.prng_key)


def leaf_spec(shape: tuple[int, ...], num_replicas: int, axis_name: str) -> P:
    """The partition spec of one array: its largest axis divisible by `num_replicas` split
    over `axis_name`, or `P()` (replicated) when there is none or only one replica.

    Example:
      >>> leaf_spec((10, 512), 8, "data")
      PartitionSpec(None, 'data')
      >>> leaf_spec((10,), 8, "data")
      PartitionSpec()
    """
    if num_replicas == 1:
        return P()
    best = None
    for axis, size in enumerate(shape):
        if size % num_replicas == 0 and (best is None or size > shape[best]):
            best = axis
    if best is None:
        return P()
    return P(*([None] * best + [axis_name]))


def train_state_shardings(state: Mapping[str, Any], mode: str, mesh: Mesh, axis_name: str) -> Any:
    """The shardings of a train-state dict (`params`, `rest`, `opt`, `metrics`, or any
    subset of them) laid out as `mode` says: a `NamedSharding` per leaf of a sharded part,
    one replicated `NamedSharding` for each other part.

    Leaves may be arrays or `jax.ShapeDtypeStruct`s (abstract state, e.g. from
    `jax.eval_shape`).
    """
    parts = _SHARDED_PARTS[mode]
    num = mesh.shape[axis_name]
    replicated = NamedSharding(mesh, P())

    def one(leaf: Any) -> NamedSharding:
        if _shardable(leaf):
            return NamedSharding(mesh, leaf_spec(tuple(leaf.shape), num, axis_name))
        return replicated

    # A part that is not sharded gets one sharding for all its leaves (a pytree prefix, as
    # `jax.device_put` and `jax.jit(out_shardings=...)` accept), whatever its structure.
    return {
        key: jax.tree.map(one, value) if key in parts else replicated
        for key, value in state.items()
    }


def _bytes_per_device(tree: Any, num_replicas: int, sharded: bool) -> int:
    """Bytes one device holds of `tree` (the largest shard's, where a split is uneven)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = list(leaf.shape)
        spec = leaf_spec(tuple(shape), num_replicas, "data") if sharded else P()
        for axis, name in enumerate(spec):
            if name is not None:
                shape[axis] = -(-shape[axis] // num_replicas)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def state_memory(state: Mapping[str, Any], num_replicas: int, mode: str) -> dict[str, int]:
    """Per-device bytes of a train state's parameters and optimizer state under `mode`.

    Computed from shapes and dtypes only, so `state` may be abstract (`jax.eval_shape`) and
    `num_replicas` larger than the devices at hand.

    Args:
      state: a dict with `params` and `opt` (arrays or `jax.ShapeDtypeStruct`s).
      num_replicas: the data-parallel replica count to lay the state out over.
      mode: 'replicated', 'zero1' or 'fsdp'.

    Returns:
      `{"params": bytes, "optimizer": bytes, "total": bytes}` for one device.

    Example:
      >>> params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
      >>> opt = jax.eval_shape(optax.adam(1e-3).init, params)
      >>> state_memory({"params": params, "opt": opt}, 8, "zero1")["optimizer"]
      1048580
    """
    mode = check_mode(mode)
    parts = _SHARDED_PARTS[mode]
    params = _bytes_per_device(state["params"], num_replicas, "params" in parts)
    opt = _bytes_per_device(state["opt"], num_replicas, "opt" in parts)
    return {"params": params, "optimizer": opt, "total": params + opt}


def memory_report(model: Any) -> dict[str, Any]:
    """Per-device bytes of a compiled `Model`'s parameters and optimizer state, as laid out
    by its strategy's `state_sharding` and as they would be replicated; for
    `model.summary()`.

    Returns:
      `{"state_sharding": mode, "num_replicas": N, "sharded": {...}, "replicated": {...}}`,
      each of the last two as `state_memory` returns it.

    Raises:
      RuntimeError: before `model.compile()` (there is no optimizer state yet).

    Example:
      >>> memory_report(model)["sharded"]["total"]       # bytes on each device
      1648128
    """
    state = getattr(getattr(model, "engine", None), "state", None)
    if state is None:
        raise RuntimeError("call model.compile(...) before memory_report(model)")
    strategy = model.strategy
    mode = strategy.state_sharding
    num = strategy.num_replicas_in_sync
    return {
        "state_sharding": mode,
        "num_replicas": num,
        "sharded": state_memory(state, num, mode),
        "replicated": state_memory(state, num, "replicated"),
    }
