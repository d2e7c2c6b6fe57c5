"""ONNX nodes for jax's shape primitives, windows and gathers (see `onnx_ops`).

Target shapes may hold the symbolic batch: `Graph.shape` builds them at run time. A
broadcast expands only the dimensions that grow (ONNX's Expand keeps a dimension given as
1), so most need no run-time size at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.train.export.onnx_graph import Graph, UnsupportedError

INT64_MAX = np.iinfo(np.int64).max
SHAPE_RULES: dict[str, Callable[[Graph, Any, list[str]], Any]] = {}


def _rule(name: str) -> Callable:
    def register(fn: Callable) -> Callable:
        SHAPE_RULES[name] = fn
        return fn

    return register


def _shape(eqn: Any, index: int = 0) -> tuple:
    return tuple(eqn.invars[index].aval.shape)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an undecidable comparison of symbolic sizes
        return False


def _ints(graph: Graph, values: Any) -> str:
    return graph.const(np.array([int(v) for v in values], np.int64))


def broadcast(graph: Graph, x: str, shape: tuple, target: tuple, dims: tuple) -> str:
    """`x` of `shape` placed at `dims` of `target` and broadcast to it."""
    missing = [i for i in range(len(target)) if i not in dims]
    if missing:
        x = graph.node("Unsqueeze", [x, _ints(graph, missing)])
    placed = [shape[dims.index(i)] if i in dims else 1 for i in range(len(target))]
    grow = [1 if _same(have, want) else want for have, want in zip(placed, target, strict=True)]
    if all(_same(g, 1) for g in grow):
        return x
    return graph.node("Expand", [x, graph.shape(tuple(grow))])


@_rule("broadcast_in_dim")
def _broadcast_in_dim(graph: Graph, eqn: Any, x: list[str]) -> str:
    dims = tuple(int(d) for d in eqn.params["broadcast_dimensions"])
    return broadcast(graph, x[0], _shape(eqn), tuple(eqn.params["shape"]), dims)


@_rule("reshape")
def _reshape(graph: Graph, eqn: Any, x: list[str]) -> str:
    if eqn.params.get("dimensions") is not None:
        raise UnsupportedError("a reshape with `dimensions`: export with 'tf_saved_model'")
    return graph.node("Reshape", [x[0], graph.shape(tuple(eqn.params["new_sizes"]))])


@_rule("squeeze")
def _squeeze(graph: Graph, eqn: Any, x: list[str]) -> str:
    return graph.node("Squeeze", [x[0], _ints(graph, eqn.params["dimensions"])])


@_rule("transpose")
def _transpose(graph: Graph, eqn: Any, x: list[str]) -> str:
    return graph.node("Transpose", x, perm=[int(p) for p in eqn.params["permutation"]])


@_rule("concatenate")
def _concatenate(graph: Graph, eqn: Any, x: list[str]) -> str:
    return graph.node("Concat", x, axis=int(eqn.params["dimension"]))


@_rule("split")
def _split(graph: Graph, eqn: Any, x: list[str]) -> list[str]:
    sizes = eqn.params["sizes"]
    return graph.node(
        "Split", [x[0], _ints(graph, sizes)], outputs=len(sizes), axis=int(eqn.params["axis"])
    )


@_rule("pad")
def _pad(graph: Graph, eqn: Any, x: list[str]) -> str:
    config = eqn.params["padding_config"]
    if any(interior for _, _, interior in config):
        raise UnsupportedError("interior padding: export with format='tf_saved_model'")
    grow = [max(lo, 0) for lo, _, _ in config] + [max(hi, 0) for _, hi, _ in config]
    out = graph.node("Pad", [x[0], _ints(graph, grow), x[1]], mode="constant")
    if min(lo for lo, _, _ in config) < 0 or min(hi for _, hi, _ in config) < 0:
        starts = [max(-lo, 0) for lo, _, _ in config]
        ends = [hi if hi < 0 else INT64_MAX for _, hi, _ in config]
        out = graph.node("Slice", [out, _ints(graph, starts), _ints(graph, ends)])
    return out


@_rule("slice")
def _slice(graph: Graph, eqn: Any, x: list[str]) -> str:
    shape = _shape(eqn)
    limits = tuple(
        INT64_MAX if _same(limit, size) else limit
        for limit, size in zip(eqn.params["limit_indices"], shape, strict=True)
    )
    strides = eqn.params["strides"] or (1,) * len(shape)
    inputs = [x[0], graph.shape(tuple(eqn.params["start_indices"])), graph.shape(limits)]
    return graph.node("Slice", [*inputs, _ints(graph, range(len(shape))), _ints(graph, strides)])


@_rule("dynamic_slice")
def _dynamic_slice(graph: Graph, eqn: Any, x: list[str]) -> str:
    shape, sizes = _shape(eqn), tuple(eqn.params["slice_sizes"])
    starts = []
    for axis, start in enumerate(x[1:]):  # clamped into range, as jax does
        begin = graph.node("Cast", [start], to=graph.onnx.TensorProto.INT64)
        begin = graph.node("Reshape", [begin, _ints(graph, [1])])
        top = graph.node("Sub", [graph.dim(shape[axis]), _ints(graph, [sizes[axis]])])
        starts.append(graph.node("Min", [graph.node("Max", [begin, _ints(graph, [0])]), top]))
    begin = graph.node("Concat", starts, axis=0)
    end = graph.node("Add", [begin, graph.shape(sizes)])
    return graph.node("Slice", [x[0], begin, end])


@_rule("iota")
def _iota(graph: Graph, eqn: Any, x: list[str]) -> str:
    dtype = np.dtype(eqn.params["dtype"])
    shape, axis = tuple(eqn.params["shape"]), int(eqn.params["dimension"])
    kind = graph.onnx.helper.np_dtype_to_tensor_dtype(dtype)
    limit = graph.node("Squeeze", [graph.node("Cast", [graph.dim(shape[axis])], to=kind)])
    line = graph.node(
        "Range", [graph.const(np.array(0, dtype)), limit, graph.const(np.array(1, dtype))]
    )
    return broadcast(graph, line, (shape[axis],), shape, (axis,))


@_rule("gather")
def _gather(graph: Graph, eqn: Any, x: list[str]) -> str:
    """`jnp.take` along one axis (an embedding lookup, `x[ids]`) as ONNX's Gather."""
    numbers = eqn.params["dimension_numbers"]
    operand, indices = _shape(eqn, 0), _shape(eqn, 1)
    (axis,) = numbers.start_index_map if len(numbers.start_index_map) == 1 else (None,)
    sizes = tuple(eqn.params["slice_sizes"])
    if (
        axis is None
        or tuple(numbers.collapsed_slice_dims) != (axis,)
        or numbers.operand_batching_dims
        or not _same(indices[-1], 1)
        or sizes[axis] != 1
        or any(not _same(sizes[i], operand[i]) for i in range(len(operand)) if i != axis)
    ):
        raise UnsupportedError(
            f"a gather other than a lookup along one axis ({numbers}); export with "
            "format='tf_saved_model'"
        )
    ids = graph.node("Squeeze", [x[1], _ints(graph, [len(indices) - 1])])
    out = graph.node("Gather", [x[0], ids], axis=int(axis))
    # ONNX: operand dims before the axis, the indices' dims, the rest; jax: `offset_dims`.
    batch = len(indices) - 1
    onnx_order = [("o", i) for i in range(axis)] + [("i", i) for i in range(batch)]
    onnx_order += [("o", i) for i in range(axis + 1, len(operand))]
    rank = len(_out_shape(eqn))
    kept = iter([("o", i) for i in range(len(operand)) if i != axis])
    batch_dims = iter([("i", i) for i in range(batch)])
    jax_order = [next(kept) if d in numbers.offset_dims else next(batch_dims) for d in range(rank)]
    if jax_order == onnx_order:
        return out
    return graph.node("Transpose", [out], perm=[onnx_order.index(label) for label in jax_order])


def _out_shape(eqn: Any) -> tuple:
    return tuple(eqn.outvars[0].aval.shape)


def _window(op: str, scale: bool) -> Callable:
    """Pooling (`reduce_window_max` / `_sum`) over the spatial axes, channels-first."""

    def rule(graph: Graph, eqn: Any, x: list[str]) -> str:
        p = eqn.params
        window, strides, padding = p["window_dimensions"], p["window_strides"], p["padding"]
        if any(d != 1 for d in (*p["base_dilation"],)):
            raise UnsupportedError("a pooling window with base dilation: 'tf_saved_model'")
        spatial = [
            i
            for i in range(len(window))
            if window[i] != 1 or strides[i] != 1 or tuple(padding[i]) != (0, 0)
        ]
        other = [i for i in range(len(window)) if i not in spatial]
        if len(other) != 2 or not spatial:
            raise UnsupportedError(
                f"a pooling window over axes {spatial} of a rank-{len(window)} array (ONNX pools "
                "the axes after a batch and a channel axis); export with 'tf_saved_model'"
            )
        perm = other + spatial
        dilations = [int(p["window_dilation"][i]) for i in spatial]
        if scale and any(d != 1 for d in dilations):  # AveragePool has none before opset 19
            raise UnsupportedError("a dilated sum pooling: export with 'tf_saved_model'")
        y = graph.node(
            op,
            [graph.node("Transpose", x, perm=perm)],
            kernel_shape=[int(window[i]) for i in spatial],
            strides=[int(strides[i]) for i in spatial],
            pads=[int(padding[i][0]) for i in spatial] + [int(padding[i][1]) for i in spatial],
            **({"count_include_pad": 1} if scale else {"dilations": dilations}),
        )
        y = graph.node("Transpose", [y], perm=[int(i) for i in np.argsort(perm)])
        if scale:  # AveragePool counts the padding in: times the window size is the sum
            size = int(np.prod([window[i] for i in spatial]))
            y = graph.node("Mul", [y, graph.const(np.array(size, eqn.invars[0].aval.dtype))])
        return y

    return rule


SHAPE_RULES["reduce_window_max"] = _window("MaxPool", scale=False)
SHAPE_RULES["reduce_window_sum"] = _window("AveragePool", scale=True)
