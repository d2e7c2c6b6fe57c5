"""Input checks that fail early: clear errors for bad arrays, batches and batch sizes.

Every check runs on the host when a dataset or an iterable of batches is built (or when a
batch arrives from a foreign source), so a mistake surfaces as a message that names the
offending leaf, what it holds and what to do, before JAX traces or compiles anything.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import numpy as np

# Names for the members of a top-level (x, y[, sample_weight]) tuple, as Keras users say them.
_TUPLE_NAMES = ("x", "y", "sample_weight")
# Array kinds XLA can take: bool, signed/unsigned integers, floats, complex.
_NUMERIC_KINDS = frozenset("biufc")


def _is_list(value: Any) -> bool:
    # tf.data treats a Python list as one tensor, not as a pytree node; so do we.
    return isinstance(value, list)


def named_leaves(tree: Any, root: str = "x") -> tuple[list[tuple[str, Any]], Any]:
    """Flattens `tree` into (name, leaf) pairs and its treedef.

    Names read like the user's code: the members of a plain 2- or 3-tuple rooted at "x" are
    `x`, `y`, `sample_weight`; anything else is `root` followed by its path
    (`x['image']`, `x.label`, `tensors[1]`).
    """
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_list)
    tuple_names = root == "x" and type(tree) is tuple and 2 <= len(tree) <= 3
    named = []
    for path, leaf in with_path:
        if tuple_names:
            name = _TUPLE_NAMES[path[0].idx] + jax.tree_util.keystr(path[1:])
        else:
            name = root + jax.tree_util.keystr(path)
        named.append((name, leaf))
    return named, treedef


def is_numeric(dtype: np.dtype) -> bool:
    """Whether XLA can take arrays of `dtype` (numbers, bools and ml_dtypes' bfloat16 etc.)."""
    return dtype.kind in _NUMERIC_KINDS or dtype.type.__module__.startswith("ml_dtypes")


def _row_shapes(leaf: Any) -> str:
    try:
        shapes = list(dict.fromkeys(str(np.shape(row)) for row in leaf))
    except ValueError:
        return "rows that are themselves ragged"
    more = ", ..." if len(shapes) > 3 else ""
    return "row shapes " + ", ".join(shapes[:3]) + more


def to_numpy(name: str, leaf: Any) -> np.ndarray:
    """Converts one leaf (NumPy, JAX, PyTorch, TensorFlow or a nested list) to a NumPy array.

    Raises:
      ValueError: the leaf is ragged (rows of different shapes) or a 0-d scalar is not allowed.
      TypeError: the leaf's dtype is not numeric (strings, Python objects).
    """
    if isinstance(leaf, np.ndarray):
        array = leaf
    elif hasattr(leaf, "detach") and hasattr(leaf, "cpu"):
        # PyTorch: np.asarray fails on tensors that require grad or live on a GPU.
        array = np.asarray(leaf.detach().cpu().numpy())
    elif callable(getattr(leaf, "numpy", None)) and not isinstance(leaf, jax.Array):
        array = np.asarray(leaf.numpy())  # TensorFlow eager tensors.
    else:
        try:
            array = np.asarray(leaf)
        except ValueError:
            raise ValueError(
                f"{name} is ragged: its rows have different shapes ({_row_shapes(leaf)}). "
                "Every example must have the same shape; pad the rows to one length (e.g. "
                "numpy.pad) or split them into separate arrays."
            ) from None
    if not is_numeric(array.dtype):
        what = "Python objects (often ragged rows)" if array.dtype.kind == "O" else "non-numbers"
        raise TypeError(
            f"{name} has dtype {array.dtype}, which holds {what}; XLA only takes numbers and "
            "bools. Convert it first: encode strings as integer ids (a vocabulary lookup), and "
            "pad ragged rows into one numeric array."
        )
    return array


def to_numpy_tree(tree: Any, root: str) -> Any:
    """Converts every leaf of `tree` to a NumPy array, with `to_numpy`'s errors.

    The fast path skips naming leaves (it runs once per mapped row); names are only
    computed to explain a failure.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_list)
    try:
        arrays = [leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf) for leaf in leaves]
        if all(is_numeric(a.dtype) for a in arrays):
            return treedef.unflatten(arrays)
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
      ValueError, TypeError: as `to_numpy` and `check_rows`, prefixed by `where`.
    """
    named, treedef = named_leaves(batch)
    try:
        arrays = [(name, to_numpy(name, leaf)) for name, leaf in named]
        check_rows(arrays, allow_empty=True)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}") from None
    return treedef.unflatten([a for _, a in arrays])
