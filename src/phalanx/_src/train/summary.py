"""`Model.summary()`: layers, output shapes, parameter counts and bytes, device memory.

Output shapes need an input shape. They come from, in order: the `x` sample given, the
`input_shape` given (one example's shape, without the batch axis, or a dict / tuple of
them), or the inputs the model last saw in `fit` / `evaluate` (its first batch). Without
any, the table lists layers and parameters and says how to get the shapes. Shapes come
from an abstract trace (`jax.eval_shape`): nothing is computed or compiled.

The memory lines give the bytes of parameters and optimizer state that each device holds,
as laid out by the strategy (`phalanx._src.strategy.sharding.memory_report`: replicated, or
split by ZeRO-1 / FSDP and by `model_parallel`) and under the other `state_sharding` modes,
and the non-trainable state (batch statistics, RNG counters).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from phalanx._src.strategy.sharding import memory_report
from phalanx._src.train.engine import checks

_MARKUP = re.compile(r"\[/?[a-z ]+\]")  # rich's markup in nnx.tabulate's reprs


def _size(tree: Any) -> tuple[int, int]:
    """(values, bytes) of the arrays in `tree`."""
    count = nbytes = 0
    for leaf in jax.tree.leaves(tree):
        n = int(np.prod(np.shape(leaf)))
        count += n
        nbytes += n * jnp.dtype(leaf.dtype).itemsize
    return count, nbytes


def _human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.2f} GB"


def _is_shape(s: Any) -> bool:
    return isinstance(s, tuple | list) and all(isinstance(d, int) for d in s)


def _input_spec(model: Any, x: Any, input_shape: Any, dtype: Any) -> Any:
    if x is not None:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), x)
    if input_shape is not None:
        return jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((1, *s), jnp.dtype(dtype)),
            input_shape,
            is_leaf=_is_shape,
        )
    return model.engine.input_spec


def _layer_rows(module: Any, spec: Any, depth: int | None) -> list[tuple[str, str, str]]:
    """(path, type, output shape) per module call, from flax's `nnx.tabulate` under an
    abstract trace."""
    from flax import nnx

    rows: list[Any] = []

    def keep(info: Any) -> bool:
        rows.append(info)
        return False

    def trace(inputs: Any) -> None:
        nnx.tabulate(module, inputs, row_filter=keep)

    jax.eval_shape(trace, spec)
    out = []
    for info in rows:
        if depth is not None and len(info.path) > depth:
            continue
        path = "/".join(str(p) for p in info.path) or "(model)"
        out.append((path, info.type.__name__, _shape_text(info.outputs)))
    return out


def _shape_text(outputs: Any) -> str:
    """`float32[8,3]`, or `{cls: float32[8,3], reg: float32[8,1]}` for structured outputs."""
    if isinstance(outputs, dict):
        return "{" + ", ".join(f"{k}: {_shape_text(v)}" for k, v in outputs.items()) + "}"
    if isinstance(outputs, list | tuple):
        return "(" + ", ".join(_shape_text(v) for v in outputs) + ")"
    return _MARKUP.sub("", str(outputs))


def _params_by_path(module: Any) -> dict[tuple, tuple[str, int, int]]:
    """{path: (type name, parameter count, bytes)} for every submodule (and the model)."""
    from flax import nnx

    found = {}
    for path, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Module):
            count, nbytes = _size(nnx.state(node, nnx.Param))
            found[tuple(str(p) for p in path)] = (type(node).__name__, count, nbytes)
    return dict(sorted(found.items(), key=lambda item: (len(item[0]) > 0, item[0])))


def _memory_lines(model: Any) -> list[str]:
    """Per-device bytes of parameters and optimizer state: as laid out now, then under each
    `state_sharding` at the same `model_parallel` (`memory_report`)."""
    report = memory_report(model)
    where = str(report["state_sharding"])
    if report["model_parallel"] > 1:
        where += f", model_parallel={report['model_parallel']}"
    now = report["sharded"]
    lines = [
        f"Device memory per device ({where}): params {now['params']:,} B + "
        f"optimizer {now['optimizer']:,} B = {now['total']:,} B ({_human(now['total'])})"
    ]
    others = [
        f"{mode} {_human(each['total'])}"
        for mode, each in report["layouts"].items()
        if mode != report["state_sharding"]
    ]
    lines.append("  other state_sharding layouts: " + ", ".join(others))
    return lines


def summary_text(
    model: Any,
    x: Any = None,
    *,
    input_shape: Any = None,
    dtype: Any = "float32",
    depth: int | None = None,
) -> str:
    """The summary `Model.summary` prints; see the module docstring.

    Args:
      model: a compiled `phalanx.Model`.
      x: a sample batch of inputs (only shapes and dtypes are used).
      input_shape: one example's input shape without the batch axis (or a dict / tuple of
        shapes for several inputs), used when `x` is None.
      dtype: the dtype of inputs given by `input_shape`.
      depth: the deepest submodule level listed (None: all).

    Returns:
      The summary as text.

    Raises:
      ValueError: an input shape the model cannot take (see `checks.output_spec`).
    """
    from flax import nnx

    module = model.module
    name = type(module).__name__
    strategy = model.strategy
    lines = [f'Model: "{name}" on {strategy.num_replicas_in_sync} replica(s)']
    spec = _input_spec(model, x, input_shape, dtype)
    rows: list[tuple[str, str, str, str, str]] = []
    if spec is not None:
        checks.output_spec(model.engine, spec)  # a clear error for shapes the model cannot take
    if isinstance(module, nnx.Module):
        sizes = _params_by_path(module)
        if spec is not None:
            for path, kind, out in _layer_rows(module, spec, depth):
                key = () if path == "(model)" else tuple(path.split("/"))
                _, count, nbytes = sizes.get(key, ("", 0, 0))
                rows.append((path, kind, out, f"{count:,}", _human(nbytes)))
        else:
            for key, (kind, count, nbytes) in sizes.items():
                if depth is not None and len(key) > depth:
                    continue
                rows.append(("/".join(key) or "(model)", kind, "?", f"{count:,}", _human(nbytes)))
    elif hasattr(module, "layers") and hasattr(module, "count_params"):  # a Keras model
        rows = [_keras_row(layer) for layer in module.layers]
    if rows:
        header = ("Layer (path)", "Type", "Output shape", "Params", "Bytes")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
        table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        head = "  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True))
        rule = "-" * len(head)
        lines += [rule, head, rule, *table, rule]
    if spec is None:
        lines.append(
            "Output shapes unknown: pass x= (a sample batch) or input_shape=, or call after "
            "fit / evaluate has seen a batch."
        )
    params, params_bytes = _size(model.engine.state["params"])
    rest, rest_bytes = _size(model.engine.state["rest"])
    opt, opt_bytes = _size(model.engine.state["opt"])
    lines += [
        f"Total params: {params + rest:,} ({_human(params_bytes + rest_bytes)})",
        f"Trainable params: {params:,} ({_human(params_bytes)})",
        f"Non-trainable state: {rest:,} ({_human(rest_bytes)})",
        f"Optimizer state: {opt:,} ({_human(opt_bytes)})",
        *_memory_lines(model),
    ]
    return "\n".join(line.rstrip() for line in lines)


def _keras_row(layer: Any) -> tuple[str, str, str, str, str]:
    """A Keras layer's row: its output shape as Keras built it (None: the batch axis)."""
    try:
        shape = str(tuple(layer.output.shape))
    except (AttributeError, ValueError):  # a subclassed model's layers have no `output`
        shape = "?"
    weights = [(int(np.prod(w.shape)), jnp.dtype(w.dtype).itemsize) for w in layer.weights]
    count = sum(n for n, _ in weights)
    return (
        layer.name,
        type(layer).__name__,
        shape,
        f"{count:,}",
        _human(sum(n * b for n, b in weights)),
    )


def print_summary(model: Any, print_fn: Callable[[str], Any] | None = None, **kwargs) -> None:
    """Prints `summary_text(model, **kwargs)` with `print_fn` (default `print`)."""
    (print_fn or print)(summary_text(model, **kwargs))
