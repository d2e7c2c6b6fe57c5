"""The ONNX graph a jaxpr is translated into: nodes, initializers, symbolic sizes.

`emit` walks a jaxpr's equations and hands each to its rule (`onnx_ops`, `onnx_shapes`),
which emits one or a few ONNX nodes through `Graph`; calls (`jit`, `custom_jvp_call`,
remat...) are inlined. A size that depends on the batch is read at run time from a tensor
that has it (`Graph.dim`), so one graph serves every batch.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np


class UnsupportedError(ValueError):
    """The exported function uses a primitive the ONNX translation does not cover."""


class Graph:
    """The ONNX graph being built: nodes, initializers, and where each value lives."""

    def __init__(self, onnx: Any) -> None:
        self.onnx = onnx
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._counter = itertools.count()
        self._dims: dict[Any, tuple[str, int]] = {}  # symbolic size -> (tensor, axis) having it
        self._cache: dict[Any, str] = {}

    def fresh(self, hint: str = "t") -> str:
        return f"{hint}_{next(self._counter)}"

    def const(self, value: Any, name: str | None = None) -> str:
        """An initializer holding `value` (small constants are shared by value)."""
        array = np.asarray(value)
        key = None
        if name is None and array.size <= 16:
            key = (array.dtype.str, array.shape, array.tobytes())
            if key in self._cache:
                return self._cache[key]
        name = name or self.fresh("c")
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        if key is not None:
            self._cache[key] = name
        return name

    def node(self, op: str, inputs: list[str], outputs: int = 1, **attributes: Any) -> Any:
        """Emits one node; returns its output name (a list for several)."""
        names = [self.fresh(op.lower()) for _ in range(outputs)]
        self.nodes.append(self.onnx.helper.make_node(op, inputs, names, **attributes))
        return names[0] if outputs == 1 else names

    def register(self, name: str, shape: tuple) -> None:
        """Notes which symbolic sizes the tensor `name` carries (to read them at run time)."""
        for axis, size in enumerate(shape):
            if not isinstance(size, int) and size not in self._dims:
                self._dims[size] = (name, axis)

    def dim(self, size: Any) -> str:
        """A 1-element int64 tensor holding `size` (a constant, or read from a tensor)."""
        if isinstance(size, int | np.integer):
            return self.const(np.array([size], np.int64))
        if size not in self._dims:
            raise UnsupportedError(
                f"the size {size} depends on the batch in a way the ONNX translation cannot "
                "compute; export with format='tf_saved_model', or a fixed batch size"
            )
        key = ("dim", size)
        if key not in self._cache:
            tensor, axis = self._dims[size]
            self._cache[key] = self.node("Shape", [tensor], start=axis, end=axis + 1)
        return self._cache[key]

    def shape(self, sizes: tuple) -> str:
        """A 1-D int64 tensor holding `sizes` (read at run time where they are symbolic)."""
        if all(isinstance(s, int | np.integer) for s in sizes):
            return self.const(np.array(sizes, np.int64))
        return self.node("Concat", [self.dim(s) for s in sizes], axis=0)


# Calls whose body runs once, in place: inlined. Loops (scan, while) and branches (cond)
# also hold jaxprs, but are not calls: they have no rule, so they are named in the error.
CALLS = ("jit", "pjit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
         "custom_vjp_call", "custom_vjp_call_jaxpr")  # fmt: skip


def _sub_jaxpr(eqn: Any) -> Any:
    if eqn.primitive.name not in CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    return None


def emit(graph: Graph, jaxpr: Any, consts: list[Any], args: list[str], rules: dict) -> list[str]:
    """Emits `jaxpr` (its constants and arguments given as tensor names) by `rules`
    (primitive name -> rule); returns the names of its outputs."""
    env: dict[Any, str] = {}
    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = graph.const(value) if not isinstance(value, str) else value
    for var, name in zip(jaxpr.invars, args, strict=True):
        env[var] = name

    def read(var: Any) -> str:
        if hasattr(var, "val"):  # a literal
            return graph.const(np.asarray(var.val, var.aval.dtype))
        return env[var]

    for eqn in jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        inner = _sub_jaxpr(eqn)
        if inner is not None:
            closed = getattr(inner, "jaxpr", inner)
            outputs = emit(graph, closed, list(getattr(inner, "consts", [])), inputs, rules)
        elif eqn.primitive.name in rules:
            produced = rules[eqn.primitive.name](graph, eqn, inputs)
            outputs = produced if isinstance(produced, list) else [produced]
        else:
            where = " ".join(str(eqn).split())[:100]
            raise UnsupportedError(
                f"the ONNX translation does not cover the primitive {eqn.primitive.name!r} "
                f"(in {where}...); supported: {sorted(rules)}. Export with "
                "format='tf_saved_model', which runs every primitive"
            )
        for var, name in zip(eqn.outvars, outputs, strict=True):
            env[var] = name
            graph.register(name, tuple(var.aval.shape))
    return [read(v) for v in jaxpr.outvars]
