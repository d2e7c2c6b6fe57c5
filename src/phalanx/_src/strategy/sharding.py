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

Under model parallelism (`Strategy(model_parallel=M)`, a `data x model` mesh) each leaf
first takes the layout the model annotates (`annotations.py`: a kernel split over `model`),
and the mode then splits one of its remaining axes over `data`; Adam's moments, which carry
their parameter's annotation, follow it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from phalanx._src.strategy.annotations import AxisRules, annotation, check_rules
from phalanx._src.strategy.mesh import MODEL_AXIS

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


def leaf_spec(
    shape: tuple[int, ...], num_replicas: int, axis_name: str, base: P | None = None
) -> P:
    """The partition spec of one array: `base` (its model-axis layout, from the model's
    annotations) with the array's largest remaining axis divisible by `num_replicas` split
    over `axis_name`; `base` itself when there is none, only one replica, or `base` already
    uses `axis_name`.

    Example:
      >>> leaf_spec((10, 512), 8, "data")
      PartitionSpec(None, 'data')
      >>> leaf_spec((10,), 8, "data")
      PartitionSpec()
      >>> leaf_spec((512, 64), 4, "data", base=P(None, "model"))
      PartitionSpec('data', 'model')
    """
    base = P() if base is None else base
    entries = list(base) + [None] * (len(shape) - len(base))
    taken = {a for e in entries if e is not None for a in (e if isinstance(e, tuple) else (e,))}
    if num_replicas == 1 or axis_name in taken:
        return base
    best = None
    for axis, size in enumerate(shape):
        if entries[axis] is not None or size % num_replicas:
            continue
        if best is None or size > shape[best]:
            best = axis
    if best is None:
        return base
    entries[best] = axis_name
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


class Layout:
    """Where each leaf of a train state lives: the model's annotations (`annotations.py`)
    resolved on the mesh, plus the data axis for the parts `mode` shards.

    Args:
      mode: 'replicated', 'zero1' or 'fsdp'.
      sizes: the mesh's axis sizes, e.g. `{"data": 4, "model": 2}` (may be hypothetical).
      data_axis: the data axis's name.
      rules: `Strategy(axis_rules=...)`'s pairs.

    Example:
      >>> layout = Layout("fsdp", {"data": 4, "model": 2}, "data")
      >>> layout.bytes_per_device({"params": abstract_params, "opt": abstract_opt})
    """

    def __init__(self, mode: str, sizes: Mapping[str, int], data_axis: str, rules=()) -> None:
        self.mode = check_mode(mode)
        self.sizes = dict(sizes)
        self.data_axis = data_axis
        self.axis_rules = AxisRules(rules, self.sizes, data_axis)

    def specs(self, part: str, tree: Any) -> Any:
        """`tree` (one part of a train state) with each NNX Variable or array leaf replaced
        by its `PartitionSpec`."""
        sharded = part in _SHARDED_PARTS[self.mode]
        num = self.sizes[self.data_axis]

        def one(path: Any, leaf: Any) -> P:
            names = annotation(leaf)
            value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
            shape = tuple(getattr(value, "shape", ()))
            base = P()
            if names is not None:
                where = f"{part}{jax.tree_util.keystr(path)}"
                base = self.axis_rules.spec(names, shape, where)
            if sharded and _shardable(value):
                return leaf_spec(shape, num, self.data_axis, base)
            return base

        return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_variable)

    def shardings(self, state: Mapping[str, Any], mesh: Mesh) -> Any:
        """`state`'s shardings: one `NamedSharding` per leaf where the layout is not the
        same for all, else one replicated `NamedSharding` for the part (a pytree prefix,
        as `jax.device_put` and `jax.jit(out_shardings=...)` accept)."""
        replicated = NamedSharding(mesh, P())
        out = {}
        for key, value in state.items():
            specs = self.specs(key, value)
            if all(spec == P() for spec in jax.tree.leaves(specs, is_leaf=_is_spec)):
                out[key] = replicated
            else:
                out[key] = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)
        return out

    def bytes_per_device(self, part: str, tree: Any) -> int:
        """Bytes one device holds of `tree`, one part of a train state (the largest shard's,
        where a split is uneven). Shapes and dtypes only: `tree` may be abstract."""
        total = 0
        leaves = jax.tree.leaves(tree, is_leaf=_is_variable)
        specs = jax.tree.leaves(self.specs(part, tree), is_leaf=_is_spec)
        for leaf, spec in zip(leaves, specs, strict=True):
            value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
            shape = list(value.shape)
            for axis, entry in enumerate(spec):
                for name in entry if isinstance(entry, tuple) else (entry,):
                    if name is not None:
                        shape[axis] = -(-shape[axis] // self.sizes[name])
            total += math.prod(shape) * jnp.dtype(value.dtype).itemsize
        return total


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _is_spec(x: Any) -> bool:
    return isinstance(x, P)


def train_state_shardings(
    state: Mapping[str, Any], mode: str, mesh: Mesh, axis_name: str, rules: Any = ()
) -> Any:
    """The shardings of a train-state dict (`params`, `rest`, `opt`, `metrics`, or any
    subset of them) laid out as the model's annotations and `mode` say (`Layout`).

    Leaves may be arrays or `jax.ShapeDtypeStruct`s (abstract state, e.g. from
    `jax.eval_shape`), inside NNX Variables (which carry the annotations) or not.
    """
    return Layout(mode, dict(mesh.shape), axis_name, rules).shardings(state, mesh)


def state_memory(
    state: Mapping[str, Any],
    num_replicas: int,
    mode: str,
    model_parallel: int = 1,
    axis_rules=(),
) -> dict[str, int]:
    """Per-device bytes of a train state's parameters and optimizer state under `mode`, on
    `num_replicas` data-parallel replicas of `model_parallel` devices each.

    Computed from shapes and dtypes only, so `state` may be abstract (`jax.eval_shape`,
    `nnx.eval_shape`) and the mesh larger than the devices at hand. Parameters annotated
    with a `model` axis (or a logical name `axis_rules` maps to it) count 1/`model_parallel`.

    Args:
      state: a dict with `params` and `opt` (arrays or `jax.ShapeDtypeStruct`s, in NNX
        Variables where they carry annotations).
      num_replicas: the data-parallel replica count to lay the state out over.
      mode: 'replicated', 'zero1' or 'fsdp'.
      model_parallel: devices per model group (the model axis's size).
      axis_rules: `Strategy(axis_rules=...)`'s pairs.

    Returns:
      `{"params": bytes, "optimizer": bytes, "total": bytes}` for one device.

    Example:
      >>> params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
      >>> opt = jax.eval_shape(optax.adam(1e-3).init, params)
      >>> state_memory({"params": params, "opt": opt}, 8, "zero1")["optimizer"]
      1048580
    """
    sizes = {"data": num_replicas}
    if model_parallel > 1:
        sizes[MODEL_AXIS] = model_parallel
    layout = Layout(mode, sizes, "data", check_rules(axis_rules))
    params = layout.bytes_per_device("params", state["params"])
    opt = layout.bytes_per_device("opt", state["opt"])
    return {"params": params, "optimizer": opt, "total": params + opt}


def memory_report(model: Any) -> dict[str, Any]:
    """Per-device bytes of a compiled `Model`'s parameters and optimizer state, as laid out
    by its strategy (`state_sharding`, `model_parallel`), under each `state_sharding` at
    the same `model_parallel`, and as one full copy; for `model.summary()`.

    Returns:
      `{"state_sharding": mode, "num_replicas": N, "model_parallel": M, "sharded": {...},
      "replicated": {...}, "layouts": {mode: {...} for each mode}}`; each `{...}` as
      `state_memory` returns it ("replicated": the whole state on one device).

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
    num, m = strategy.num_replicas_in_sync, strategy.model_parallel
    layouts = {each: state_memory(state, num, each, m, strategy.axis_rules) for each in MODES}
    return {
        "state_sharding": mode,
        "num_replicas": num,
        "model_parallel": m,
        "sharded": layouts[mode],
        "replicated": state_memory(state, num, "replicated", 1, strategy.axis_rules),
        "layouts": layouts,
    }
