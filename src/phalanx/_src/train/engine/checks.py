"""Bad input at the model's boundary: clear errors before a batch reaches the compiled step.

Four mistakes otherwise surface deep inside XLA, or not at all:

- batches without labels (x alone) for `fit`, `evaluate` or `validation_data`: the loss
  had nothing to compare with and read 0.0, which EarlyStopping then trusted;

- features whose shape does not fit the model (flax raises "dot_general requires contracting
  dimensions to have the same shape" from inside the step's trace);
- integer labels outside `[0, num_classes)` for a sparse cross-entropy (the loss silently
  becomes NaN or garbage);
- non-integer float labels for a sparse cross-entropy (silently truncated).

How: the model's forward pass is traced abstractly (`jax.eval_shape`, no compile, no device
work) once per input signature (shapes without the batch, dtypes), cached by the engine; a
failure there is translated into a `ValueError` naming the shapes received and what the
model takes. The output shapes give the number of classes, against which the labels are
checked on the host with vectorised NumPy:

- array inputs and in-memory `phalanx.data.Dataset`s: all labels once, before the first step
  (`check_data`);
- any other dataset: each host batch as the loop takes it (`watch`), so the error comes at
  the first batch that holds a bad label. Batches already on a device (jax.Array leaves)
  are not inspected: reading them would wait for the device.

Nothing runs inside the compiled step, so there is no per-step device sync.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from phalanx._src.strategy import device_batch
from phalanx._src.train.api import losses as losses_lib
from phalanx._src.train.engine.step import unpack

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine

_SHAPE_WORDS = re.compile(r"shape|dimension|rank|size", re.IGNORECASE)
_KEY = "boundary_check"  # engine.cache[(_KEY, signature)] -> output spec
_CONV_KEY = "convolution"  # engine.cache[_CONV_KEY] -> whether the forward pass convolves
# Who reads the data ('fit', 'validation', 'evaluate'): its name, and how to give it labels.
_DATA_NAMES = {"fit": "fit's data", "validation": "validation_data", "evaluate": "evaluate's data"}
_PASS_LABELS = {
    "fit": "model.fit(x, y, ...), or a dataset yielding (x, y) batches",
    "validation": "validation_data=(x_val, y_val), or a dataset yielding (x, y) batches",
    "evaluate": "model.evaluate(x, y, ...), or a dataset yielding (x, y) batches "
    "(model.predict(x) is the one that takes x alone)",
}


def _signature(x: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(x)
    return (str(treedef), tuple((tuple(np.shape(a))[1:], str(a.dtype)) for a in leaves))


def _describe(x: Any) -> str:
    shapes = jax.tree.map(lambda a: f"{tuple(np.shape(a))} {getattr(a, 'dtype', '')}".strip(), x)
    return str(shapes)


def _first_layers(module: Any) -> str:
    """What the model's first weight layer takes, for an NNX module; '' if unknown."""
    try:
        from flax import nnx

        for path, node in nnx.iter_graph(module):
            name = ".".join(str(p) for p in path) or "the model"
            kind = type(node).__name__
            if isinstance(node, nnx.Linear | nnx.LinearGeneral | nnx.Conv):
                what = "channels" if isinstance(node, nnx.Conv) else "features"
                takes = f"{node.in_features} {what} on the last axis"
            elif isinstance(node, nnx.Embed):
                takes = f"integer ids in [0, {node.num_embeddings})"
            else:
                continue
            return f"its first weight layer `{name}` ({kind}) takes {takes}"
    except Exception:  # a description must never hide the real error
        return ""
    return ""


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)


def output_spec(engine: Engine, x: Any) -> Any:
    """The model's output shapes and dtypes for inputs like `x` (cached per signature).

    Args:
      engine: a compiled model's `Engine`.
      x: a batch of inputs (arrays or `jax.ShapeDtypeStruct`s), batch first.

    Returns:
      A pytree of `jax.ShapeDtypeStruct` with the structure of the model's output.

    Raises:
      ValueError: the model cannot take inputs of these shapes; the message names the shapes
        received and what the model takes.
    """
    key = (_KEY, _signature(x))
    cached = engine.cache.get(key)
    if cached is not None:
        return cached
    rows = jax.tree.leaves(x)[0].shape[0]
    adapter = engine.adapter  # the model as pure functions of (params, rest)

    def forward(params: Any, rest: Any, inputs: Any) -> Any:
        mask = jnp.ones((rows,), jnp.float32)
        return adapter.apply(params, rest, inputs, training=False, mask=mask)[0]

    state = engine.abstract_state()  # shapes only: the packed state is not unpacked
    try:
        # One trace gives the output shapes and, from the program, `has_convolution`.
        traced, spec = jax.make_jaxpr(forward, return_shape=True)(
            _abstract(state["params"]), _abstract(state["rest"]), _abstract(x)
        )
    except (TypeError, ValueError, IndexError) as err:
        if not _SHAPE_WORDS.search(str(err)):
            raise  # not about shapes: the model's own error, unchanged
        raise _shape_error(engine, x, err) from err
    engine.cache[key] = spec
    engine.cache[_CONV_KEY] = _convolves(traced.jaxpr)
    engine.input_spec = _abstract(x)  # for model.summary()
    return spec


def has_convolution(engine: Engine, x: Any) -> bool:
    """Whether the model's forward pass on inputs like `x` has a convolution, from the trace
    `output_spec` made (or makes now, once)."""
    if _CONV_KEY not in engine.cache:
        output_spec(engine, x)
    return engine.cache[_CONV_KEY]


def _convolves(jaxpr: Any) -> bool:
    """Whether `jaxpr`, or a program nested in it (jit, scan, cond, custom_vjp), convolves."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "conv_general_dilated":
            return True
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(inner, "eqns") and _convolves(inner):
                    return True
    return False


def _shape_error(engine: Engine, x: Any, err: Exception) -> Exception:
    reason = (
        str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
    )
    known = [k[1] for k in engine.cache if isinstance(k, tuple) and k and k[0] == _KEY]
    takes = _first_layers(getattr(engine.adapter, "model", None))
    parts = [f"the model cannot take inputs of shape {_describe(x)} (batch first): {reason}."]
    if takes:
        parts.append(f"The model: {takes}.")
    if known:
        parts.append(f"It ran before on inputs with per-example shapes {known[0][1]}.")
    parts.append(
        "Check that the feature arrays have the shape the model was built for (only the "
        "batch dimension may differ), or rebuild the model for these inputs."
    )
    return ValueError(" ".join(parts))


def _sparse_losses(loss: Any) -> list[tuple[int | None, str | None]]:
    """`(index, output name)` of each sparse cross-entropy in `loss` ((None, None): single)."""
    if _is_sparse(loss):
        return [(None, None)]
    entries = getattr(loss, "entries", None)  # multi_output.MultiOutputLoss
    if entries is None:
        return []
    return [(index, name) for index, name, inner, _ in entries if _is_sparse(inner)]


def _is_sparse(loss: Any) -> bool:
    """phalanx's sparse cross-entropy, or Keras's through the bridge (`KerasLoss`)."""
    loss = getattr(loss, "base", loss)  # a single loss scaled by a float loss_weights
    return isinstance(loss, losses_lib.SparseCategoricalCrossentropy) or (
        getattr(loss, "implied_accuracy", None) == "sparse_categorical_accuracy"
    )


def check_labels(loss: Any, y: Any, y_pred_spec: Any) -> None:
    """Raises a ValueError for labels a sparse cross-entropy in `loss` cannot use.

    Args:
      loss: the compiled loss (single or `MultiOutputLoss`).
      y: host labels (NumPy), structured as the loss expects.
      y_pred_spec: the model's output shapes (from `output_spec`).

    Raises:
      ValueError: labels outside [0, num_classes) or float labels with a fractional part.
    """
    for index, name in _sparse_losses(loss):
        if index is None:
            labels, spec, where = y, y_pred_spec, "labels"
        else:
            labels, spec = loss.output_loss(index, name, y, y_pred_spec)
            where = f"labels of output {name!r}"
        if not isinstance(labels, np.ndarray) or not hasattr(spec, "shape"):
            continue  # on a device already, or not an array: not inspected (see module doc)
        _check_sparse(labels, int(spec.shape[-1]), where)


def _check_sparse(labels: np.ndarray, classes: int, where: str) -> None:
    flat = labels.reshape(-1)
    if flat.size == 0:
        return
    if np.issubdtype(flat.dtype, np.floating):
        fractional = np.flatnonzero(flat != np.floor(flat))
        if fractional.size:
            shown = flat[fractional[:3]].tolist()
            raise ValueError(
                f"{where} for sparse_categorical_crossentropy must be class indices, but "
                f"{fractional.size} of them are not whole numbers, e.g. {shown}; pass integer "
                "class ids (for one-hot or soft labels use 'categorical_crossentropy')"
            )
    low, high = flat.min(), flat.max()
    if low < 0 or high >= classes:
        bad = flat[(flat < 0) | (flat >= classes)]
        raise ValueError(
            f"{where} for sparse_categorical_crossentropy must be in [0, {classes}) (the "
            f"model outputs {classes} classes), but {bad.size} are not, e.g. "
            f"{bad[:3].tolist()} (min {low}, max {high}); remap the labels to 0..{classes - 1} "
            "or give the model's last layer more units"
        )


def require_labels(engine: Engine, x: Any, y: Any, phase: str) -> None:
    """Raises a ValueError when `y` is None: every compiled model has a loss, which needs
    labels (without them the loss would read 0.0).

    Args:
      engine: a compiled model's `Engine`.
      x, y: the features and labels of a batch (or of all the arrays).
      phase: who reads the data: 'fit', 'validation' or 'evaluate'.
    """
    if y is not None:
        return
    loss = getattr(engine.steps.loss, "name", None) or "the loss"
    received = _describe(x) if x is not None else "nothing"
    raise ValueError(
        f"{_DATA_NAMES.get(phase, 'the data')} has no labels: each batch is x alone "
        f"({received}), but the model's loss {loss!r} needs y_true (without it the loss "
        f"would read 0.0). Pass the labels: {_PASS_LABELS.get(phase, _PASS_LABELS['fit'])}"
    )


def check_batch(engine: Engine, batch: Any, phase: str = "fit") -> None:
    """Checks one host batch (or all the arrays) at the model's boundary; see the module doc.

    Raises:
      ValueError: no labels, features the model cannot take, or labels a sparse loss cannot
        use.
    """
    # Strings first: the abstract trace below would fail on them with XLA's words.
    device_batch.check_device_batch(batch, "a batch going to the model")
    x, y, _ = unpack(batch)
    require_labels(engine, x, y, phase)
    if x is None or not jax.tree.leaves(x):
        return
    spec = output_spec(engine, x)
    if y is not None:
        check_labels(engine.steps.loss, y, spec)


def check_data(engine: Engine, data: Any, phase: str = "fit") -> bool:
    """All the arrays of an in-memory dataset, once, before the first step.

    `phase`: who reads the data ('fit', 'validation', 'evaluate'), for the messages.

    Returns:
      Whether `data` was one (its batches then need no `watch`).

    Raises:
      ValueError: as `check_batch`.
    """
    view = getattr(data, "row_indices", None)
    found = view() if callable(view) else None
    if found is None:
        return False
    _, arrays = found
    batch = getattr(data, "batch_size", None)
    rows = batch if isinstance(batch, int) and batch > 0 else 1
    x, y, _ = unpack(arrays)
    require_labels(engine, x, y, phase)
    if x is None or not jax.tree.leaves(x):
        return True
    # The forward is traced with one batch's shape; the labels are checked all at once.
    spec = output_spec(
        engine, jax.tree.map(lambda a: jax.ShapeDtypeStruct((rows, *np.shape(a)[1:]), a.dtype), x)
    )
    if y is not None:
        check_labels(engine.steps.loss, y, spec)
    return True


def _host(tree: Any) -> bool:
    return all(isinstance(a, np.ndarray) for a in jax.tree.leaves(tree))


class _Watched:
    """Passes a host-batch iterator through, checking each batch first (see `watch`)."""

    boundary_checked = True  # seen through other wrappers' __getattr__ (see `watch`)

    def __init__(self, engine: Engine, iterator: Iterator[Any], phase: str) -> None:
        self._engine = engine
        self._iterator = iterator
        self._phase = phase

    def __iter__(self) -> _Watched:
        return self

    def __next__(self) -> Any:
        batch = next(self._iterator)
        if _host(batch):
            check_batch(self._engine, batch, self._phase)
        else:  # on a device already: only its structure, which needs no wait
            x, y, _ = unpack(batch)
            require_labels(self._engine, x, y, self._phase)
        return batch

    def __getattr__(self, name: str) -> Any:  # get_state, set_state, close, checkpointable
        if name == "next_many":  # every batch goes through __next__, to be checked
            raise AttributeError(name)
        return getattr(self._iterator, name)


def watch(
    engine: Engine, iterator: Iterator[Any], source: Any, checked: bool, phase: str = "fit"
) -> Iterator[Any]:
    """`iterator`, checking each host batch, unless its data was checked whole (`checked`)
    or it yields row numbers into on-device arrays (`source`). `phase`: who reads it ('fit',
    'validation', 'evaluate'), for the messages."""
    if checked or source is not None or getattr(iterator, "boundary_checked", False):
        return iterator
    return _Watched(engine, iterator, phase)
