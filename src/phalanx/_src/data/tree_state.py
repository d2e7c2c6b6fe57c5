"""Small pytrees of arrays in an iterator state: JSON-ready, restored bit for bit.

An iterator state is a JSON-ready dict (checkpoints store it as JSON). `scan` carries a
state of the user's from element to element, usually a few numbers, so a restored iterator
needs that state exactly: numeric arrays keep their dtype, shape and bytes (base64), strings
and bytes their type, and tuples, lists, dicts (string keys) and None their structure.

Example:
  >>> saved = json.dumps(encode((np.float32(0.5), {"n": np.arange(3)})))
  >>> decode(json.loads(saved))   # (0.5 as float32, {"n": array([0, 1, 2])})
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np


def encode(tree: Any) -> Any:
    """`tree` as JSON-ready values (see the module docstring).

    Raises:
      TypeError: a leaf or container it cannot hold exactly (a namedtuple, an object).
    """
    # NumPy first: np.float64 is also a Python float, and its dtype must come back.
    if isinstance(tree, np.ndarray | np.generic):
        array = np.asarray(tree)
        scalar = isinstance(tree, np.generic)
        if array.dtype.kind == "O":
            return {"objects": [encode(v) for v in array.ravel()], "shape": array.shape}
        data = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()
        return {"array": data, "dtype": array.dtype.str, "shape": array.shape, "scalar": scalar}
    if tree is None or isinstance(tree, bool | int | float | str):
        return {"py": tree}
    if isinstance(tree, bytes):
        return {"bytes": base64.b64encode(tree).decode()}
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return {"tuple": [encode(v) for v in tree]}
    if isinstance(tree, list):
        return {"list": [encode(v) for v in tree]}
    if isinstance(tree, dict) and all(isinstance(k, str) for k in tree):
        return {"dict": {k: encode(v) for k, v in tree.items()}}
    raise TypeError(
        f"an iterator state cannot hold a {type(tree).__name__} exactly; keep the state a "
        "tuple, list or dict of NumPy arrays, numbers and strings"
    )


def decode(value: Any) -> Any:
    """The pytree `encode` made `value` from."""
    (kind,) = set(value) - {"dtype", "shape", "scalar"}
    if kind == "py":
        return value["py"]
    if kind == "bytes":
        return base64.b64decode(value["bytes"])
    if kind == "tuple":
        return tuple(decode(v) for v in value["tuple"])
    if kind == "list":
        return [decode(v) for v in value["list"]]
    if kind == "dict":
        return {k: decode(v) for k, v in value["dict"].items()}
    if kind == "objects":
        out = np.empty(len(value["objects"]), dtype=object)
        for i, item in enumerate(value["objects"]):
            out[i] = decode(item)
        return out.reshape(value["shape"])
    raw = base64.b64decode(value["array"])
    array = np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
    return array[()] if value["scalar"] else array
