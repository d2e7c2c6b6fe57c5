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


_FLOAT = np.dtype(np.float64)
_TEXT = str | bytes


def _is_text(value: Any) -> bool:
    return isinstance(value, str | bytes)


def _plain(text: str | bytes) -> str | bytes:
    """NumPy's str_/bytes_ scalars as Python's own str/bytes (what the pipeline hands on)."""
    if type(text) is str or type(text) is bytes:
        return text
    return str(text) if isinstance(text, str) else bytes(text)


def host_array(leaf: Any) -> np.ndarray:
    """`leaf` as a NumPy array, strings and bytes as an object array of Python str/bytes.

    Why object arrays: NumPy's fixed-width `U`/`S` arrays truncate a longer string stored
    into them later (a cache filled chunk by chunk) and drop trailing NUL bytes (a JPEG's or
    a record's bytes), so on the host every string leaf is an object array, as tf.data's
    `as_numpy_iterator()` gives a string tensor.
    """
    if isinstance(leaf, np.ndarray):
        array = leaf
    elif _is_text(leaf):
        return np.array(_plain(leaf), dtype=object)  # a 0-d array: the exact str/bytes
    else:
        array = np.asarray(leaf)
        if array.dtype.kind in "US" and isinstance(leaf, list | tuple):
            exact = np.array(leaf, dtype=object)  # NumPy's `S` drops trailing NUL bytes
            if exact.shape == array.shape:
                return exact
    if array.dtype.kind in "US":
        return array.astype(object)
    return array


def host_leaf(leaf: Any) -> Any:
    """One leaf of one element as the pipeline hands it on: a Python str/bytes for a string
    scalar, else `host_array(leaf)`."""
    # The common cases first: this runs for every leaf of every mapped row.
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.kind not in "OSU":
            return leaf
    elif isinstance(leaf, _TEXT):
        return _plain(leaf)
    elif not isinstance(leaf, list | tuple):
        array = np.asarray(leaf)
        if array.dtype.kind not in "OSU":
            return array
    array = host_array(leaf)
    if array.ndim == 0 and array.dtype.kind == "O":
        return array.item()
    return array


def stack(values: list[Any] | tuple[Any, ...]) -> np.ndarray:
    """Elements' leaves stacked along a new first axis; strings into an object array."""
    if not any(
        isinstance(v, _TEXT | list | tuple) or getattr(v, "dtype", _FLOAT).kind in "OUS"
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
            f"{name} is ragged: its rows have different shapes ({_row_shapes(leaf)}). "
            "Every example must have the same shape; pad the rows to one length (e.g. "
            "numpy.pad) or split them into separate arrays."
        ) from None


def to_numpy_tree(tree: Any, root: str) -> Any:
    """Converts every leaf of `tree` for the host pipeline (`host_leaf`), with `to_numpy`'s
    errors.

    The fast path skips naming leaves (it runs once per mapped row); names are only
    computed to explain a failure.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_list)
    try:
        return treedef.unflatten([host_leaf(leaf) for leaf in leaves])
    except (ValueError, TypeError, RuntimeError):
        pass  # Fall through to the named conversion, which explains the problem.
    named, treedef = named_leaves(tree, root)
    return treedef.unflatten([to_numpy(name, leaf) for name, leaf in named])


# -- the device boundary ------------------------------------------------------------------


def _is_numeric_leaf(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    if isinstance(dtype, np.dtype):
        return is_numeric(dtype)
    if isinstance(leaf, jax.Array):
        return True  # JAX's own extended dtypes (PRNG keys) are already device values
    return isinstance(leaf, int | float | complex) and not _is_text(leaf)


def _holds(array: np.ndarray) -> str:
    """Words for what a non-numeric array holds, with an example value."""
    if array.dtype.kind != "O":
        return f"dtype {array.dtype}"
    flat = array.reshape(-1)
    kinds = sorted({type(v).__name__ for v in flat[:64]})
    sample = f", e.g. {flat[0]!r:.40}" if flat.size else ""
    return f"Python objects of type {', '.join(kinds) or 'none'}{sample}"


def _ragged(array: np.ndarray) -> bool:
    """Whether an object array holds arrays or lists (rows of their own) rather than scalars."""
    return array.dtype.kind == "O" and any(
        isinstance(v, np.ndarray | list | tuple) for v in array.reshape(-1)[:64]
    )


def check_device_batch(batch: Any, where: str, root: str = "element") -> None:
    """Refuses a batch whose leaves are not numbers, where it is about to go to the devices.

    Strings, bytes and Python objects are legal everywhere in a host pipeline; XLA takes
    only numbers and bools, so the device boundary (fit / evaluate / predict input,
    `experimental_distribute_dataset`, `DevicePrefetcher`, `as_batches`) calls this on every
    batch. The check is a dtype test per leaf; names are computed only to explain a failure.

    Args:
      batch: a pytree of arrays (one batch, or all the arrays of an in-memory dataset).
      where: words for the error message, e.g. "fit's input".
      root: the name of the whole batch in the message ("element", or "x" to name the
        members of an `(x, y[, sample_weight])` tuple as Keras does).

    Raises:
      TypeError: a leaf holds strings, bytes or other Python objects, named by its path in
        the element (`element[0]['text']`).
      ValueError: a leaf holds ragged rows (an object array of arrays of different shapes).

    Example:
      >>> check_device_batch((np.zeros((2, 3)), np.array(["a", "b"], object)), "fit's input")
      Traceback (most recent call last):
      TypeError: fit's input: element[1] holds Python objects of type str, e.g. 'a' ...
    """
    if isinstance(batch, np.ndarray) and is_numeric(batch.dtype):
        return  # the common case (row numbers, one array): no tree walk
    if all(_is_numeric_leaf(leaf) for leaf in jax.tree.leaves(batch)):
        return
    named, _ = named_leaves(batch, root)
    for name, leaf in named:
        if _is_numeric_leaf(leaf):
            continue
        array = host_array(leaf) if not _is_text(leaf) else np.array(leaf, dtype=object)
        if is_numeric(array.dtype):
            continue  # a nested list of numbers converts as it is
        if _ragged(array):
            raise ValueError(
                f"{where}: {name} is ragged: its rows have different shapes "
                f"({_row_shapes(array)}). Every example must have the same shape; pad the rows "
                "to one length (padded_batch, or numpy.pad in `map`) or split them into "
                "separate arrays."
            )
        raise TypeError(
            f"{where}: {name} holds {_holds(array)}; XLA takes only numbers and bools, so it "
            "cannot go to the devices. Turn it into numbers in `map` first, e.g. with a "
            "StringLookup or a vocabulary (`ds.map(lambda text, y: (lookup(text), y))`), or "
            "encode the strings as integer ids before passing the arrays."
        )


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
