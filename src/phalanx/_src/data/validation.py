"""Input checks that fail early: clear errors for bad arrays, batches and batch sizes.

Every check runs on the host when a dataset or an iterable of batches is built (or when a
batch arrives from a foreign source), so a mistake surfaces as a message that names the
offending leaf, what it holds and what to do, before JAX traces or compiles anything.

Strings, bytes and Python objects are legal in a host pipeline (file names, a JPEG's bytes,
a sentence until `map` turns it into ids): an element's string leaf is a Python str or
bytes, a batch of them an object array. Only `check_device_batch`, called where batches go
to the devices, refuses them.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import numpy as np

from phalanx._src.strategy.device_batch import (
    TEXT,
    check_device_batch,
    host_array,
    is_list,
    named_leaves,
    plain_text,
    row_shapes,
)

_FLOAT = np.dtype(np.float64)


def host_leaf(leaf: Any) -> Any:
    """One leaf of one element as the pipeline hands it on: a Python str/bytes for a string
    scalar, else `host_array(leaf)`."""
    # The common cases first: this runs for every leaf of every mapped row.
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.kind not in "OSU":
            return leaf
    elif isinstance(leaf, TEXT):
        return plain_text(leaf)
    elif not isinstance(leaf, list | tuple):
        array = np.asarray(leaf)
        if array.dtype.kind not in "OSU":
            return array
    array = host_array(leaf)
    if array.ndim == 0 and array.dtype.kind == "O":
        return array.item()
    return array


def stack(values: list[Any] | tuple[Any, ...], recycler: Any = None) -> np.ndarray:
    """Elements' leaves stacked along a new first axis; strings into an object array.
    `recycler` (a `recycle.Recycler`): large numeric batches go into its reused arrays."""
    if recycler is not None and (out := recycler.stack(values)) is not None:
        return out
    if not any(
        isinstance(v, TEXT | list | tuple) or getattr(v, "dtype", _FLOAT).kind in "OUS"
        for v in values
    ):
        return np.stack(values)  # numbers (Python numbers have no dtype: numeric)
    arrays = [host_array(v) for v in values]
    if not any(a.dtype.kind == "O" for a in arrays):
        return np.stack(arrays)  # lists of numbers
    shapes = sorted({a.shape for a in arrays})
    if len(shapes) > 1:  # as np.stack refuses; an object array would broadcast silently
        raise ValueError(f"cannot stack elements of different shapes {shapes} into one array")
    out = np.empty((len(arrays), *arrays[0].shape), dtype=object)
    for i, array in enumerate(arrays):
        out[i] = array.item() if array.ndim == 0 else array
    return out


def to_numpy(name: str, leaf: Any) -> np.ndarray:
    """Converts one leaf (NumPy, JAX, PyTorch, TensorFlow or a nested list) to a NumPy array.

    Strings and bytes become object arrays (`host_array`); they are legal on the host and
    refused only at the device boundary (`check_device_batch`).

    Raises:
      ValueError: the leaf is ragged (rows of different shapes).
    """
    if isinstance(leaf, np.ndarray):
        return host_array(leaf)
    if hasattr(leaf, "detach") and hasattr(leaf, "cpu"):
        # PyTorch: np.asarray fails on tensors that require grad or live on a GPU.
        return np.asarray(leaf.detach().cpu().numpy())
    if callable(getattr(leaf, "numpy", None)) and not isinstance(leaf, jax.Array):
        return host_array(leaf.numpy())  # TensorFlow eager tensors (tf.string: bytes).
    try:
        return host_array(leaf)
    except ValueError:
        raise ValueError(
            f"{name} is ragged: its rows have different shapes ({row_shapes(leaf)}). "
            "Every example must have the same shape; pad the rows to one length (e.g. "
            "numpy.pad) or split them into separate arrays."
        ) from None


def to_numpy_tree(tree: Any, root: str) -> Any:
    """Converts every leaf of `tree` for the host pipeline (`host_leaf`), with `to_numpy`'s
    errors.

    The fast paths skip naming leaves (this runs once per mapped row): an array, or a
    tuple of arrays (`(image, label)`), needs no tree walk; names are only computed to
    explain a failure.
    """
    if type(tree) is np.ndarray and tree.dtype.kind not in "OSU":
        return tree
    if type(tree) is tuple and all(
        type(leaf) is np.ndarray and leaf.dtype.kind not in "OSU" for leaf in tree
    ):
        return tree
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_list)
    try:
        return treedef.unflatten([host_leaf(leaf) for leaf in leaves])
    except (ValueError, TypeError, RuntimeError):
        pass  # Fall through to the named conversion, which explains the problem.
    named, treedef = named_leaves(tree, root)
    return treedef.unflatten([to_numpy(name, leaf) for name, leaf in named])


def check_rows(named: list[tuple[str, np.ndarray]], allow_empty: bool = False) -> int:
    """Returns the common number of rows of the arrays, or raises a ValueError naming them.

    Raises:
      ValueError: no arrays, a 0-d array, lengths that disagree, or zero rows (unless
        `allow_empty`: a foreign pipeline may hand one process an empty share of a batch).
    """
    if not named:
        raise ValueError("the data holds no arrays; pass an array, a tuple (x, y) or a dict.")
    first_name, first = named[0]
    for name, array in named:
        if array.ndim == 0:
            raise ValueError(
                f"{name} is a scalar (shape ()); every array needs a leading axis of examples, "
                f"e.g. {name}.reshape(1) for a single example."
            )
        if array.shape[0] != first.shape[0]:
            raise ValueError(
                f"{first_name} has {first.shape[0]} rows but {name} has {array.shape[0]}; every "
                "array must hold one row per example. Check that they come from the same split "
                "and were not filtered separately."
            )
    if first.shape[0] == 0 and not allow_empty:
        raise ValueError(
            f"the dataset is empty: {first_name} has 0 rows (shape {first.shape}); pass at "
            "least one example."
        )
    return int(first.shape[0])


def check_positive(value: Any, what: str, example: str) -> int:
    """Returns `value` as an int if it is a positive integer, else raises a clear error."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a positive integer, got {value!r}; e.g. {example}.")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what} must be a positive integer, got {value!r} ({type(value).__name__}); "
            f"e.g. {example}."
        ) from None
    if number <= 0:
        raise ValueError(f"{what} must be a positive integer, got {number}; e.g. {example}.")
    return number


def check_batch_size(batch_size: Any) -> int:
    """Returns `batch_size` as an int, or raises for 0, negatives and non-integers."""
    return check_positive(batch_size, "batch_size", "batch_size=32")


def check_batch(batch: Any, where: str) -> Any:
    """Converts one incoming batch to NumPy leaves and checks it like a dataset.

    Args:
      batch: a pytree of array-likes, as yielded by a foreign pipeline.
      where: words for the error message, e.g. "batch 3 of the DataLoader".

    Returns:
      The same structure with NumPy leaves.

    Raises:
      ValueError, TypeError: as `to_numpy`, `check_rows` and `check_device_batch` (these
        batches feed the devices), prefixed by `where`.
    """
    named, treedef = named_leaves(batch)
    try:
        arrays = [(name, to_numpy(name, leaf)) for name, leaf in named]
        check_rows(arrays, allow_empty=True)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}") from None
    out = treedef.unflatten([a for _, a in arrays])
    check_device_batch(out, where, root="x")
    return out
