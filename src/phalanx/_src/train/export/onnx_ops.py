"""ONNX nodes for jax's inference primitives: `RULES[name](graph, eqn, inputs) -> outputs`.

Each rule reads the equation's parameters and operand shapes (`eqn.invars[i].aval`) and
emits nodes through `onnx_graph.Graph`. Layouts follow jax's `dimension_numbers`: a
convolution or pooling window is transposed to ONNX's channels-first order and back
(ONNX Runtime folds the transposes of constant kernels). Where ONNX differs from XLA the
rule says so: an out-of-range gather index is an error in ONNX Runtime, where jax fills or
clamps; `round` rounds half away from zero unless jax asked for half to even.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.train.export.onnx_graph import Graph, UnsupportedError
from phalanx._src.train.export.onnx_shapes import SHAPE_RULES

Rule = Callable[[Graph, Any, list[str]], Any]
RULES: dict[str, Rule] = {}


def _shape(eqn: Any, index: int = 0) -> tuple:
    return tuple(eqn.invars[index].aval.shape)


def _out(eqn: Any) -> Any:
    return eqn.outvars[0].aval


def _type(graph: Graph, dtype: Any) -> int:
    return graph.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _axes(graph: Graph, axes: Any) -> str:
    return graph.const(np.array([int(a) for a in axes], np.int64))


def _simple(op: str) -> Rule:
    return lambda graph, eqn, x: graph.node(op, x)


for _name, _op in {
    "neg": "Neg", "exp": "Exp", "log": "Log", "tanh": "Tanh", "logistic": "Sigmoid",
    "sqrt": "Sqrt", "abs": "Abs", "sign": "Sign", "floor": "Floor", "ceil": "Ceil",
    "sin": "Sin", "cos": "Cos", "tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan",
    "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh",
    "erf": "Erf", "stop_gradient": "Identity", "copy": "Identity", "copy_p": "Identity",
    "add": "Add", "add_any": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max",
    "min": "Min", "pow": "Pow", "eq": "Equal", "lt": "Less", "le": "LessOrEqual",
    "gt": "Greater", "ge": "GreaterOrEqual",
}.items():  # fmt: skip
    RULES[_name] = _simple(_op)


def _logical(bool_op: str, int_op: str) -> Rule:
    def rule(graph: Graph, eqn: Any, x: list[str]) -> str:
        return graph.node(bool_op if _out(eqn).dtype == np.bool_ else int_op, x)

    return rule


RULES["and"] = _logical("And", "BitwiseAnd")
RULES["or"] = _logical("Or", "BitwiseOr")
RULES["xor"] = _logical("Xor", "BitwiseXor")
RULES["not"] = _logical("Not", "BitwiseNot")
RULES["ne"] = lambda g, e, x: g.node("Not", [g.node("Equal", x)])
RULES["rem"] = lambda g, e, x: g.node("Mod", x, fmod=1)  # C's: the dividend's sign, as jax
RULES["rsqrt"] = lambda g, e, x: g.node("Reciprocal", [g.node("Sqrt", x)])
RULES["square"] = lambda g, e, x: g.node("Mul", [x[0], x[0]])
RULES["log1p"] = lambda g, e, x: g.node("Log", [g.node("Add", [x[0], g.const(_one(e))])])
RULES["expm1"] = lambda g, e, x: g.node("Sub", [g.node("Exp", x), g.const(_one(e))])
RULES["erfc"] = lambda g, e, x: g.node("Sub", [g.const(_one(e)), g.node("Erf", x)])
RULES["exp2"] = lambda g, e, x: g.node("Pow", [g.const(_one(e) * 2), x[0]])
RULES["is_finite"] = lambda g, e, x: g.node(
    "Not", [g.node("Or", [g.node("IsInf", x), g.node("IsNaN", x)])]
)
RULES["convert_element_type"] = lambda g, e, x: g.node(
    "Cast", x, to=_type(g, e.params["new_dtype"])
)
RULES["clamp"] = lambda g, e, x: g.node("Min", [g.node("Max", [x[1], x[0]]), x[2]])


def _one(eqn: Any) -> np.ndarray:
    return np.array(1, eqn.invars[0].aval.dtype)


def _integer_pow(graph: Graph, eqn: Any, x: list[str]) -> str:
    power = eqn.params["y"]
    if power == 2:
        return graph.node("Mul", [x[0], x[0]])
    return graph.node("Pow", [x[0], graph.const(np.array(power, eqn.invars[0].aval.dtype))])


def _round(graph: Graph, eqn: Any, x: list[str]) -> str:
    if int(eqn.params.get("rounding_method", 0)) == 1:  # to nearest even: ONNX's Round
        return graph.node("Round", x)
    half = graph.const(np.array(0.5, eqn.invars[0].aval.dtype))
    magnitude = graph.node("Floor", [graph.node("Add", [graph.node("Abs", x), half])])
    return graph.node("Mul", [graph.node("Sign", x), magnitude])


def _select_n(graph: Graph, eqn: Any, x: list[str]) -> str:
    which, cases = x[0], x[1:]
    if _out(eqn).dtype == np.bool_ and len(cases) == 2:  # ONNX Runtime has no bool Where
        chosen = graph.node("And", [which, cases[1]])
        other = graph.node("And", [graph.node("Not", [which]), cases[0]])
        return graph.node("Or", [chosen, other])
    if eqn.invars[0].aval.dtype == np.bool_:
        return graph.node("Where", [which, cases[1], cases[0]])
    result = cases[0]
    for index, case in enumerate(cases[1:], 1):
        chosen = graph.node(
            "Equal", [which, graph.const(np.array(index, eqn.invars[0].aval.dtype))]
        )
        result = graph.node("Where", [chosen, case, result])
    return result


RULES["integer_pow"] = _integer_pow
RULES["round"] = _round
RULES["select_n"] = _select_n


def _dot_general(graph: Graph, eqn: Any, x: list[str]) -> str:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = _shape(eqn, 0), _shape(eqn, 1)
    out = _out(eqn)
    a, b = x
    if np.dtype(eqn.invars[0].aval.dtype) != np.dtype(out.dtype):  # accumulate as jax does
        a = graph.node("Cast", [a], to=_type(graph, out.dtype))
        b = graph.node("Cast", [b], to=_type(graph, out.dtype))
    if not lb and len(rhs) == 2 and tuple(lc) == (len(lhs) - 1,) and tuple(rc) == (0,):
        return graph.node("MatMul", [a, b])  # x @ W: the usual dense layer
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    left = [next(letters) for _ in lhs]
    right = [next(letters) for _ in rhs]
    for i, j in [*zip(lc, rc, strict=True), *zip(lb, rb, strict=True)]:
        right[j] = left[i]
    batch = [left[i] for i in lb]
    free_l = [left[i] for i in range(len(lhs)) if i not in lc and i not in lb]
    free_r = [right[j] for j in range(len(rhs)) if j not in rc and j not in rb]
    equation = f"{''.join(left)},{''.join(right)}->{''.join(batch + free_l + free_r)}"
    return graph.node("Einsum", [a, b], equation=equation)


def _conv(graph: Graph, eqn: Any, x: list[str]) -> str:
    p = eqn.params
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    if any(d != 1 for d in p["lhs_dilation"]) or p["batch_group_count"] != 1:
        raise UnsupportedError(
            "the ONNX translation covers convolutions without input dilation (transposed "
            "convolutions) or batch groups; export with format='tf_saved_model'"
        )
    pads = [int(lo) for lo, _ in p["padding"]] + [int(hi) for _, hi in p["padding"]]
    if min(pads) < 0:
        raise UnsupportedError("a convolution with negative padding: format='tf_saved_model'")
    a = graph.node("Transpose", [x[0]], perm=list(lhs_spec))
    w = graph.node("Transpose", [x[1]], perm=list(rhs_spec))
    y = graph.node(
        "Conv",
        [a, w],
        strides=list(p["window_strides"]),
        pads=pads,
        dilations=list(p["rhs_dilation"]),
        group=int(p["feature_group_count"]),
    )
    return graph.node("Transpose", [y], perm=[int(i) for i in np.argsort(out_spec)])


RULES["dot_general"] = _dot_general
RULES["conv_general_dilated"] = _conv


def _reduce(op: str) -> Rule:
    def rule(graph: Graph, eqn: Any, x: list[str]) -> str:
        axes = eqn.params["axes"]
        if not axes:
            return graph.node("Identity", x)
        return graph.node(op, [x[0], _axes(graph, axes)], keepdims=0)

    return rule


def _reduce_logical(op: str) -> Rule:
    def rule(graph: Graph, eqn: Any, x: list[str]) -> str:
        as_int = graph.node("Cast", x, to=_type(graph, np.int32))
        reduced = _reduce(op)(graph, eqn, [as_int])
        return graph.node("Cast", [reduced], to=_type(graph, np.bool_))

    return rule


def _arg(op: str) -> Rule:
    def rule(graph: Graph, eqn: Any, x: list[str]) -> str:
        index = graph.node(op, x, axis=int(eqn.params["axes"][0]), keepdims=0)
        return graph.node("Cast", [index], to=_type(graph, eqn.params["index_dtype"]))

    return rule


RULES.update(
    reduce_sum=_reduce("ReduceSum"),
    reduce_max=_reduce("ReduceMax"),
    reduce_min=_reduce("ReduceMin"),
    reduce_prod=_reduce("ReduceProd"),
    reduce_and=_reduce_logical("ReduceMin"),
    reduce_or=_reduce_logical("ReduceMax"),
    argmax=_arg("ArgMax"),
    argmin=_arg("ArgMin"),
)
RULES["cumsum"] = lambda g, e, x: g.node(
    "CumSum",
    [x[0], g.const(np.array(e.params["axis"], np.int64))],
    reverse=int(e.params["reverse"]),
)

RULES.update(SHAPE_RULES)
