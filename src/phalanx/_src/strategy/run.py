"""`strategy.run`: a function once per replica, under `jax.shard_map`, with TF's semantics.

What a replica function sees:
  * distributed batches and `PerReplica` values: this replica's share;
  * everything else (parameters, optimizer state, NNX modules, constants): this replica's own
    copy. As in tf.distribute, a gradient taken inside the function is the replica's local
    gradient, and `ReplicaContext.all_reduce` sums real per-replica values;
    `nnx.Optimizer.update` sums unreduced gradients itself, as `apply_gradients` does
    (gradients.py);
  * NNX objects, and Keras 3 models, optimizers and metrics (keras_state.py), that the
    function reads from its closure or globals (lifting.py) travel with the ones passed as
    arguments and are written back the same way;
  * under model parallelism (`Strategy(model_parallel=M)`) the function is manual over the
    data axis only: it sees whole layers, which XLA splits over the model axis.

What comes back:
  * a leaf that is the same on every replica by construction (the result of an all_reduce,
    or computed only from such values) as a plain replicated `jax.Array` (tf's mirrored
    value: `strategy.reduce` SUMs it once per replica, MEAN returns it);
  * any other leaf as a `PerReplica`;
  * NNX modules passed in (models, optimizers, metrics) are updated in place, each variable
    by the rule `aggregation.py` registers for its type (`phalanx.register_variable_aggregation`
    adds one): parameters and optimizer state take replica 0's value, as tf.distribute's
    mirrored variables do; BatchNorm statistics (`nnx.BatchStat`) the mean over replicas, as
    tf's ON_READ variables with MEAN aggregation; metric state (`nnx.metrics.MetricState`)
    the sum of every replica's increments. RNG keys are never reduced: inside the function
    each replica draws from its key folded with its replica index (different masks on
    different replicas, and at every step as the shared counter advances, reproducible from
    the seed), and the stored key is left as it was.
  * BatchNorm inside `run` normalises with each replica's own batch statistics, as TF
    computes them (fit uses the global batch instead).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from phalanx._src.strategy import aggregation, gradients, lifting, missing_keys, padding
from phalanx._src.strategy.replica_context import ReplicaContext, replica_scope
from phalanx._src.strategy.values import (
    DISTRIBUTED,
    MIRRORED,
    MaskedBatch,
    PerReplica,
    find_mask,
    unmask,
)

if TYPE_CHECKING:
    from phalanx._src.strategy.base import StrategyLike

_DATA, _REPLICATED, _PER_REPLICA, _NODE, _STATIC = "data", "replicated", "per_replica", "node", ""


def _is_node(node: Any) -> bool:
    return nnx.graph.is_graph_node(node)


def _stop(node: Any) -> bool:
    return isinstance(node, MaskedBatch | PerReplica) or _is_node(node)


class _Same:
    """A cache-key part compared by identity; it keeps its object alive while cached."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


_PLAIN = (int, float, bool, complex, str, bytes, type(None))


def function_key(fn: Any, depth: int = 0) -> Any:
    """What a replica function's compiled call depends on: its code and what it captures.

    TF programs define the step anew on every call (`def step_fn(inputs)` inside a
    `tf.function`); a new function object with the same code, the same captured objects
    (by identity) and the same captured numbers reuses the compiled call instead of
    compiling again.
    """
    if not isinstance(fn, types.FunctionType) or depth > 2:
        return _Same(fn)

    def part(value: Any) -> Any:
        if isinstance(value, _PLAIN):
            return (type(value), value)
        if isinstance(value, types.FunctionType):
            return function_key(value, depth + 1)
        return _Same(value)

    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(part(cell.cell_contents))
        except ValueError:  # a cell not yet filled
            cells.append(None)
    defaults = tuple(map(part, fn.__defaults__ or ()))
    kwdefaults = tuple((k, part(v)) for k, v in sorted((fn.__kwdefaults__ or {}).items()))
    return (fn.__code__, _Same(fn.__globals__), tuple(cells), defaults, kwdefaults)


def _is_varying(x: jax.Array, axis: str) -> bool:
    return axis in jax.typeof(x).manual_axis_type.varying


def _to_varying(x: jax.Array, axis: str) -> jax.Array:
    return x if _is_varying(x, axis) else lax.pcast(x, axis, to="varying")


class _Plan:
    """How one call's arguments enter the replica function; hashable for the compile cache."""

    def __init__(self, strategy: StrategyLike, fn: Callable, args: tuple, kwargs: dict) -> None:
        data_ids: set[int] = set()

        def strip(node: Any) -> Any:
            if isinstance(node, MaskedBatch):
                plain = unmask(node)
                data_ids.update(id(leaf) for leaf in jax.tree.leaves(plain))
                return plain
            return node

        self.mask = find_mask((args, kwargs))
        tree = jax.tree.map(strip, (tuple(args), dict(kwargs)), is_leaf=_stop)
        leaves, self.treedef = jax.tree.flatten(tree, is_leaf=_stop)
        self.kinds: list[str] = []
        self.statics: list[Any] = []
        self.arrays: list[Any] = []
        nodes = []
        axis = strategy.axis_name
        for leaf in leaves:
            if _is_node(leaf):
                kind = _NODE
                nodes.append(leaf)
            elif isinstance(leaf, PerReplica):
                kind = _PER_REPLICA
                self.arrays.append(leaf.stacked)
            elif isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float | bool):
                sharded = id(leaf) in data_ids or DISTRIBUTED.mask_of(leaf) is not None
                if not sharded and isinstance(leaf, jax.Array):
                    sharding = getattr(leaf, "sharding", None)
                    sharded = (
                        isinstance(sharding, NamedSharding)
                        and len(sharding.spec) > 0
                        and sharding.spec[0] == axis
                    )
                kind = _DATA if sharded else _REPLICATED
                self.arrays.append(leaf)
            else:
                kind = _STATIC
                self.statics.append(leaf)
            self.kinds.append(kind)
        # The NNX objects fn reaches through its closure and globals travel with the ones
        # passed as arguments, in one split (objects shared between them stay shared).
        self.found = lifting.find_state(fn, "strategy.run", tuple(self.statics))
        self.num_arg_nodes = len(nodes)
        self.lifted_index = lifting.join(nodes, self.found)
        self.nodes = nodes
        self.graphdef, self.node_state = nnx.split(nodes) if nodes else (None, None)

    def key(self, fn: Callable) -> tuple:
        shapes = tuple((np.shape(a), str(jnp.result_type(a))) for a in self.arrays)
        try:
            statics = tuple(self.statics)
            hash(statics)
        except TypeError:
            statics = tuple(id(s) for s in self.statics)
        mask_shape = None if self.mask is None else tuple(self.mask.shape)
        lifted = tuple(self.found.labels)
        return (
            function_key(fn),
            self.treedef,
            tuple(self.kinds),
            statics,
            self.graphdef,
            lifted,
            shapes,
            mask_shape,
        )


def _check_outputs(out: Any) -> None:
    """Raises a TypeError naming the first output leaf that is not an array or a number:
    what `run` returns comes back as per-replica or mirrored arrays, and nothing else can."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        if isinstance(leaf, jax.Array | np.ndarray | np.generic | bool | int | float | complex):
            continue
        if hasattr(leaf, "__jax_array__"):  # an nnx.Variable, for one
            continue
        shown = repr(leaf)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        where = f"output {jax.tree_util.keystr(path)}" if path else "output"
        raise TypeError(
            f"strategy.run: the function returned {shown} (a {type(leaf).__name__}) as its "
            f"{where}; what it returns must be arrays or numbers, or a tuple / list / dict of "
            "them (they come back as PerReplica or mirrored values). Return the arrays only, "
            "e.g. return {'loss': loss}, and keep strings and other Python values outside "
            "the function"
        )


def _node_write_back(var_types: list[type], old: list, new: list, axis: str) -> list:
    """New values of module variables, made identical on every replica (see aggregation.py)."""
    out = []
    for var_type, before, after in zip(var_types, old, new, strict=True):
        if not _is_varying(after, axis):
            out.append(after)
        else:
            out.append(
                aggregation.combine(aggregation.variable_aggregation(var_type), before, after, axis)
            )
    return out


def _variables(state: Any) -> list[nnx.Variable]:
    return jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))


class _Compiled:
    """The jitted shard_map of one replica function for one argument plan."""

    def __init__(self, strategy: StrategyLike, fn: Callable, plan: _Plan) -> None:
        self.strategy = strategy
        self.fn = fn
        self.name = getattr(fn, "__qualname__", None) or repr(fn)
        self.treedef = plan.treedef
        self.kinds = plan.kinds
        self.statics = plan.statics
        self.graphdef = plan.graphdef
        self.found = plan.found
        self.num_arg_nodes = plan.num_arg_nodes
        self.lifted_index = plan.lifted_index
        self.has_mask = plan.mask is not None
        self.reads_mask = False  # set by the probe: does the step leave padding out?
        self.var_types = [type(v) for v in _variables(plan.node_state)] if plan.nodes else []
        self.out_varying: list[bool] | None = None
        self.out_treedef = None
        self._probe(plan)
        self.call = jax.jit(self._shard_mapped(probe=False))

    def _in_specs(self) -> tuple:
        axis = self.strategy.axis_name
        arrays = [P(axis) if k in (_DATA, _PER_REPLICA) else P() for k in self.kinds]
        arrays = [
            spec for spec, k in zip(arrays, self.kinds, strict=True) if k not in (_NODE, _STATIC)
        ]
        return (P(), arrays, P(axis))

    def _body(self, probe: bool) -> Callable:
        axis = self.strategy.axis_name

        def body(node_state: Any, arrays: list, mask: Any) -> Any:
            arrays = iter(arrays)
            entry_state = node_state
            node_state = jax.tree.map(lambda x: _to_varying(jnp.asarray(x), axis), node_state)
            for var in _variables(node_state):
                if aggregation.variable_aggregation(type(var)) == "per_replica_rng":
                    var.set_value(aggregation.per_replica_key(var.get_value(), axis))
            merged = nnx.merge(self.graphdef, node_state) if self.graphdef is not None else []
            # optimizer.update sums unreduced gradients, as apply_gradients does in TF.
            gradients.aggregate_optimizers(merged, axis)
            nodes, statics = iter(merged[: self.num_arg_nodes]), iter(self.statics)
            copies = [merged[i] for i in self.lifted_index]
            leaves = []
            for kind in self.kinds:
                if kind == _NODE:
                    leaves.append(next(nodes))
                elif kind == _STATIC:
                    leaves.append(next(statics))
                elif kind == _PER_REPLICA:
                    leaves.append(next(arrays)[0])
                elif kind == _DATA:
                    leaves.append(next(arrays))
                else:
                    leaves.append(_to_varying(jnp.asarray(next(arrays)), axis))
            args, kwargs = jax.tree.unflatten(self.treedef, leaves)
            context = ReplicaContext(self.strategy, axis, mask)
            with (
                replica_scope(context),
                lifting.redirected(self.found, copies, "strategy.run"),
                missing_keys.naming_keys((args, kwargs), f"strategy.run({self.name})"),
            ):
                out = self.fn(*args, **kwargs)
            _check_outputs(out)
            out_leaves, out_treedef = jax.tree.flatten(out)
            out_leaves = [jnp.asarray(x) for x in out_leaves]
            new_state = None
            if self.graphdef is not None:
                new_state = nnx.state(merged)
                old_vars, new_vars = _variables(entry_state), _variables(new_state)
                values = _node_write_back(
                    self.var_types,
                    [v.get_value() for v in old_vars],
                    [v.get_value() for v in new_vars],
                    axis,
                )
                for var, value in zip(new_vars, values, strict=True):
                    var.set_value(value)
            if probe:
                # Rows returned as rows keep their mask (PerReplica): the step is padding-safe.
                rows = None if mask is None else mask.shape[0]
                per_row = bool(out_leaves) and all(
                    x.ndim and x.shape[0] == rows for x in out_leaves
                )
                self.reads_mask = context.mask_read or per_row
                self.out_treedef = out_treedef
                self.out_varying = [_is_varying(x, axis) for x in out_leaves]
                return [_to_varying(x, axis)[None] for x in out_leaves], new_state
            stacked = [
                x[None] if varying else x
                for x, varying in zip(out_leaves, self.out_varying, strict=True)
            ]
            return stacked, new_state

        return body

    def _shard_mapped(self, probe: bool) -> Callable:
        axis = self.strategy.axis_name
        if probe:
            out_specs: Any = (P(axis), P())
        else:
            out_specs = ([P(axis) if v else P() for v in self.out_varying], P())
        # Manual over the data axis only: under model parallelism, each replica's function
        # sees whole (global-view) layers, and XLA splits their work over the model axis.
        return jax.shard_map(
            self._body(probe),
            mesh=self.strategy.mesh,
            in_specs=self._in_specs(),
            out_specs=out_specs,
            axis_names={axis},
        )

    def _probe(self, plan: _Plan) -> None:
        jax.eval_shape(self._shard_mapped(probe=True), plan.node_state, plan.arrays, plan.mask)


def run(strategy: StrategyLike, fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
    """Runs `fn(*args, **kwargs)` once per replica; see the module docstring."""
    if not callable(fn):
        raise TypeError(f"strategy.run needs a function, got {fn!r}")
    if strategy.model_parallel > 1 and strategy.num_replicas_in_sync == 1:
        # XLA's SPMD partitioner refuses an all-reduce over a one-device manual axis beside
        # an automatic one (RET_CHECK 'Cross-partition allreduce must be in (partial) manual
        # partitioning mode', jax 0.10.2), and every step has one.
        raise ValueError(
            f"strategy.run needs at least 2 replicas under model parallelism; this strategy "
            f"puts all {len(strategy.devices)} devices in one model group "
            f"(model_parallel={strategy.model_parallel}). Use a smaller model_parallel, "
            "e.g. half the devices, or Model.fit, which has no such limit"
        )
    while True:  # bound arguments, and an NNX object's bound method's self, are arguments
        if isinstance(fn, functools.partial):
            args, kwargs = (*fn.args, *args), {**fn.keywords, **(kwargs or {})}
            fn = fn.func
        elif isinstance(fn, types.MethodType) and _is_node(fn.__self__):
            args, fn = (fn.__self__, *args), fn.__func__
        else:
            break
    plan = _Plan(strategy, fn, tuple(args), dict(kwargs or {}))
    key = plan.key(fn)
    compiled = strategy._run_cache.get(key)
    if compiled is None:
        try:
            compiled = _Compiled(strategy, fn, plan)
        except (flax_errors.TraceContextError, ValueError, TypeError) as error:
            # A TF idiom that ends in a raw JAX / Flax error: an NNX object reached by a way
            # phalanx did not search, a tape-style gradient of no arguments.
            clear = lifting.translated("strategy.run", error)
            if clear is None:
                raise
            raise clear from error
        strategy._run_cache[key] = compiled
    compiled.found = plan.found  # the slots to redirect if jit traces the step again
    if plan.mask is not None and not compiled.reads_mask:
        padding.step_ignores_mask(fn, plan.mask)
    stacked, new_state = compiled.call(plan.node_state, plan.arrays, plan.mask)
    if plan.nodes:
        try:
            nnx.update(plan.nodes, new_state)
        except flax_errors.TraceContextError as error:
            raise ValueError(
                "strategy.run was called inside jax.jit (or another JAX transform) with a step "
                "that changes Flax NNX objects, whose new values cannot leave that trace. "
                "Decorate the outer function with @phalanx.function instead of @jax.jit (as "
                "@tf.function is written): it carries the objects through the compiled call"
            ) from error
    mask = plan.mask
    outputs = []
    for value, varying in zip(stacked, compiled.out_varying, strict=True):
        if not varying:
            MIRRORED.register(value)
            outputs.append(value)
            continue
        rows_mask = None
        if mask is not None and value.ndim >= 2:
            replicas = value.shape[0]
            if value.shape[1] * replicas == mask.shape[0]:
                rows_mask = mask.reshape(replicas, -1)
        outputs.append(PerReplica(value, rows_mask))
    return jax.tree.unflatten(compiled.out_treedef, outputs)
