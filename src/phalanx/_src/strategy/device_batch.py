"""What may cross to the devices: numbers only, checked where batches leave the host.

Strings, bytes and Python objects are legal in a host pipeline (file names, a JPEG's bytes,
a sentence until `map` turns it into ids); XLA takes only numbers and bools. Every place
where batches go to the devices (fit / evaluate / predict input,
`experimental_distribute_dataset`, `DevicePrefetcher`, `as_batches`) calls
`check_device_batch`, which names the offending leaf by its path in the element. The
helpers that turn host leaves into arrays (`host_array`) and name them (`named_leaves`)
live here too, so that the data room's own checks (`phalanx._src.data.validation`) and the
strategy's distributed input share them; this module imports no other phalanx module.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# Names for the members of a top-level (x, y[, sample_weight]) tuple, as Keras users say them.
_TUPLE_NAMES = ("x", "y", "sample_weight")
# Array kinds XLA can take: bool, signed/unsigned integers, floats, complex.
_NUMERIC_KINDS = frozenset("biufc")


def is_list(value: Any) -> bool:
    # tf.data treats a Python list as one tensor, not as a pytree node; so do we.
    return isinstance(value, list)


def named_leaves(tree: Any, root: str = "x") -> tuple[list[tuple[str, Any]], Any]:
    """Flattens `tree` into (name, leaf) pairs and its treedef.

    Names read like the user's code: the members of a plain 2- or 3-tuple rooted at "x" are
    `x`, `y`, `sample_weight`; anything else is `root` followed by its path
    (`x['image']`, `x.label`, `tensors[1]`).
    """
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_list)
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


def row_shapes(leaf: Any) -> str:
    try:
        shapes = list(dict.fromkeys(str(np.shape(row)) for row in leaf))
    except ValueError:
        return "rows that are themselves ragged"
    more = ", ..." if len(shapes) > 3 else ""
    return "row shapes " + ", ".join(shapes[:3]) + more


TEXT = str | bytes


def is_text(value: Any) -> bool:
    return isinstance(value, str | bytes)


def plain_text(text: str | bytes) -> str | bytes:
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
    elif is_text(leaf):
        return np.array(plain_text(leaf), dtype=object)  # a 0-d array: the exact str/bytes
    else:
        array = np.asarray(leaf)
        if array.dtype.kind in "US" and isinstance(leaf, list | tuple):
            exact = np.array(leaf, dtype=object)  # NumPy's `S` drops trailing NUL bytes
            if exact.shape == array.shape:
                return exact
    if array.dtype.kind in "US":
        return array.astype(object)
    return array


def _is_numeric_leaf(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    if isinstance(dtype, np.dtype):
        return is_numeric(dtype)
    if isinstance(leaf, jax.Array):
        return True  # JAX's own extended dtypes (PRNG keys) are already device values
    return isinstance(leaf, int | float | complex) and not is_text(leaf)


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
        array = host_array(leaf) if not is_text(leaf) else np.array(leaf, dtype=object)
        if is_numeric(array.dtype):
            continue  # a nested list of numbers converts as it is
        if _ragged(array):
            raise ValueError(
                f"{where}: {name} is ragged: its rows have different shapes "
                f"({row_shapes(array)}). Every example must have the same shape; pad the rows "
                "to one length (padded_batch, or numpy.pad in `map`) or split them into "
                "separate arrays."
            )
        raise TypeError(
            f"{where}: {name} holds {_holds(array)}; XLA takes only numbers and bools, so it "
            "cannot go to the devices. Turn it into numbers in `map` first, e.g. with a "
            "StringLookup or a vocabulary (`ds.map(lambda text, y: (lookup(text), y))`), or "
            "encode the strings as integer ids before passing the arrays."
        )
