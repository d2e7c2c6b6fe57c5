"""An exported function as an ONNX model, translated from its jaxpr without jax2onnx.

`to_onnx(onnx, fn, weights, inputs)` traces `fn(weights, inputs)` with a symbolic batch
size (`jax.export.symbolic_shape`), so one graph serves every batch, and emits it
(`onnx_graph.emit` with the rules of `onnx_ops` and `onnx_shapes`). Weights become
initializers, stored once (`save` puts them in a `<file>.data` beside the model when they
pass protobuf's 2 GiB).

Why not an existing converter: jax2onnx's metadata pins `orbax-checkpoint<0.11.37`
(phalanx needs >= 0.12.8), so an extra cannot list it; tf2onnx cannot read the
`XlaCallModule` op jax2tf's SavedModels hold. Translating the inference primitives
(matrix products, convolutions, pooling, reductions, elementwise math, shape operations,
gathers of embeddings) takes a few hundred lines; an unsupported primitive is named in the
error, with format='tf_saved_model' as the way out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from phalanx._src.train.export import versions
from phalanx._src.train.export.function import Weight
from phalanx._src.train.export.onnx_graph import Graph, emit
from phalanx._src.train.export.onnx_ops import RULES
from phalanx._src.train.export.signature import Inputs, output_names

OPSET = 18  # reductions take their axes as an input from 18 on
EXTERNAL = 1 << 31  # protobuf's limit on one message: larger models keep weights beside it


def _value_info(onnx: Any, name: str, aval: Any) -> Any:
    shape = [d if isinstance(d, int) else str(d).replace("b", "batch") for d in aval.shape]
    dtype = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(aval.dtype))
    return onnx.helper.make_tensor_value_info(name, dtype, shape)


def to_onnx(
    onnx: Any, fn: Callable[[list[Any], Any], Any], weights: list[Weight], inputs: Inputs
) -> tuple[Any, list[str]]:
    """The ModelProto of `fn(weights, inputs)` and its outputs' names."""
    polymorphic = jax.tree.leaves(inputs.polymorphic())
    shapes = jax.export.symbolic_shape(", ".join(s.strip("()") for s in polymorphic))
    abstract, start = [], 0
    for spec in inputs.leaves:
        abstract.append(jax.ShapeDtypeStruct(shapes[start : start + len(spec.shape)], spec.dtype))
        start += len(spec.shape)
    tree = jax.tree.structure(inputs.specs, is_leaf=lambda x: hasattr(x, "shape"))
    example = jax.tree.unflatten(tree, abstract)
    values = [jax.ShapeDtypeStruct(w.value.shape, w.value.dtype) for w in weights]
    closed, shapes_out = jax.make_jaxpr(fn, return_shape=True)(values, example)
    graph = Graph(onnx)
    used = _used(closed.jaxpr)
    arguments = [graph.const(w.value, w.name) if used[i] else "" for i, w in enumerate(weights)]
    for name, spec in zip(inputs.names, abstract, strict=True):
        graph.register(name, tuple(spec.shape))
    outputs = emit(graph, closed.jaxpr, list(closed.consts), arguments + list(inputs.names), RULES)
    names = output_names(jax.tree.unflatten(jax.tree.structure(shapes_out), outputs))
    for produced, name in zip(outputs, names, strict=True):  # the outputs by their names
        graph.nodes.append(onnx.helper.make_node("Identity", [produced], [name]))
    proto = onnx.helper.make_graph(
        graph.nodes,
        "phalanx_export",
        [_value_info(onnx, n, a) for n, a in zip(inputs.names, abstract, strict=True)],
        [_value_info(onnx, n, a) for n, a in zip(names, closed.out_avals, strict=True)],
        graph.initializers,
    )
    model = onnx.helper.make_model(
        proto,
        opset_imports=[onnx.helper.make_opsetid("", OPSET)],
        producer_name="phalanx",
    )
    model.ir_version = min(model.ir_version, 9)  # readable by ONNX Runtime releases since 1.17
    return model, names


def _used(jaxpr: Any) -> list[bool]:
    """Which of the weights (the first invars, before the inputs) the program reads."""
    read = {v for eqn in jaxpr.eqns for v in eqn.invars if not hasattr(v, "val")}
    read |= {v for v in jaxpr.outvars if not hasattr(v, "val")}
    return [v in read for v in jaxpr.invars]


def save(onnx: Any, model: Any, path: str) -> None:
    """Writes `model` to `path`: one file, or with its weights in `<path>.data` beside it
    when they pass protobuf's 2 GiB limit."""
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size < EXTERNAL - (64 << 20):
        onnx.save_model(model, path)
        return
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=os.path.basename(path) + ".data",
        size_threshold=1024,
    )


def run(path: str, inputs: Inputs, names: list[str], batch: Any) -> list[np.ndarray]:
    """The ONNX file at `path` on `batch` in ONNX Runtime; the outputs in `names`' order."""
    runtime = versions.onnxruntime()
    session = runtime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = dict(zip(inputs.names, jax.tree.leaves(batch), strict=True))
    return [np.asarray(a) for a in session.run(names, feed)]
