"""The saved-dataset format: an element's structure in JSON, its leaves in one record.

A saved dataset (`Dataset.save`, a published `snapshot`) is a directory:

    dataset.json        {"format": "phalanx.saved_dataset", "version": 1, "count": N,
                         "level": 0 (elements) or 1 (batches, as saved after `batch`),
                         "compression": "" | "GZIP" | "ZLIB",
                         "structure": the element's containers (below),
                         "leaves": [{"dtype": "uint8", "shape": [null, 224, 3]}, ...],
                         "files": [{"name": "shard-00000.tfrecord", "bytes": B,
                                    "records": R}, ...],
                         "fingerprint": the pipeline's (see `fingerprint`)}
    index.bin           N rows of three little-endian int64: the element's file (its number
                        in "files"), the byte offset of its record, the record's length
    shard-*.tfrecord    TFRecord files (TF's framing and masked CRC-32C checksums), one
                        record per element, in the order elements were written

The structure is JSON: a leaf is its number (JAX's leaf order), `null` is None,
`{"tuple": [...]}`, `{"list": [...]}`, `{"dict": [[key, ...], ...]}` (str keys, sorted as JAX
sorts them), `{"namedtuple": "module:QualName", "items": [...]}`. A leaf's dtype is a NumPy
name ("float32", "bfloat16", ...) or "object" for text (str and bytes); a shape holds null
where elements differ.

A record holds, with every number little-endian (then compressed as a whole when
"compression" says so, so that files keep TFRecord's framing and random access):

    uint64 the element's position
    per leaf: uint8 ndim, ndim x uint64 dims, then
              numbers: the C-order bytes of the array;
              text: per item, uint8 kind (0 bytes, 1 str), uint64 length, the bytes (UTF-8)

A text leaf of ndim 0 is a Python str or bytes, as the pipeline hands it on.
"""

from __future__ import annotations

import importlib
import struct
import zlib
from typing import Any

import jax
import numpy as np

from phalanx._src.data.options import TensorSpec

FORMAT = "phalanx.saved_dataset"
VERSION = 1
COMPRESSIONS = ("", "GZIP", "ZLIB")
_U8 = struct.Struct("<B")
_U64 = struct.Struct("<Q")
_WBITS = {"GZIP": 31, "ZLIB": 15}  # 16 + 15: a gzip header and trailer around deflate


def compression(value: Any, where: str) -> str:
    """`compression` as "", "GZIP" or "ZLIB" (None and tf.data's "AUTO" and "NONE": "")."""
    name = "" if value is None else value
    if isinstance(name, str) and name.upper() in ("AUTO", "NONE"):
        name = ""
    if not isinstance(name, str) or name.upper() not in COMPRESSIONS:
        raise ValueError(
            f'compression must be None, "GZIP" or "ZLIB", got {value!r}; e.g. '
            f'{where}(path, compression="GZIP")'
        )
    return name.upper()


def compress(data: bytes, kind: str) -> bytes:
    if not kind:
        return data
    packer = zlib.compressobj(6, zlib.DEFLATED, _WBITS[kind])
    return packer.compress(data) + packer.flush()


def decompress(data: Any, kind: str) -> Any:
    return zlib.decompress(data, _WBITS[kind]) if kind else data


# -- structure ---------------------------------------------------------------------------------


def structure(element: Any) -> Any:
    """The JSON description of `element`'s containers (see the module docstring).

    Raises:
      TypeError: a container this format does not describe (naming its type).
    """
    counter = iter(range(1 << 62))

    def walk(obj: Any) -> Any:
        if obj is None:
            return None
        kind = type(obj)
        if kind is dict:
            if not all(isinstance(k, str) for k in obj):
                raise TypeError(f"a saved element's dict keys must be str, got {list(obj)!r}")
            return {"dict": [[k, walk(obj[k])] for k in sorted(obj)]}
        if kind is list:
            return {"list": [walk(v) for v in obj]}
        if kind is tuple:
            return {"tuple": [walk(v) for v in obj]}
        if isinstance(obj, tuple) and hasattr(kind, "_fields"):
            return {
                "namedtuple": f"{kind.__module__}:{kind.__qualname__}",
                "items": list(map(walk, obj)),
            }
        if jax.tree_util.all_leaves([obj]):
            return next(counter)
        raise TypeError(
            f"cannot save an element holding a {kind.__name__} container; save and load "
            "keep tuples, lists, dicts (str keys), namedtuples and None: map the element "
            "to those first"
        )

    return walk(element)


def treedef(description: Any) -> Any:
    """The JAX treedef of elements described by `structure`'s JSON.

    Raises:
      ValueError: a namedtuple class that cannot be imported here.
    """

    def build(node: Any) -> Any:
        if node is None or isinstance(node, int):
            return node
        if "dict" in node:
            return {k: build(v) for k, v in node["dict"]}
        if "list" in node:
            return [build(v) for v in node["list"]]
        if "tuple" in node:
            return tuple(build(v) for v in node["tuple"])
        module, _, name = node["namedtuple"].partition(":")
        try:
            cls: Any = importlib.import_module(module)
            for part in name.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError):
            raise ValueError(
                f"the saved elements are {node['namedtuple']} namedtuples, which cannot be "
                "imported here; import its module first, or pass element_spec= with the "
                "structure to give them"
            ) from None
        return cls(*(build(v) for v in node["items"]))

    return jax.tree.structure(build(description))


# -- leaves ------------------------------------------------------------------------------------


def dtype_name(dtype: np.dtype) -> str:
    return "object" if dtype.kind in "OUS" else dtype.name


def dtype_of(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16, float8_*: the ml_dtypes JAX registers
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def leaf_array(leaf: Any) -> np.ndarray:
    """A leaf as an array: text (str, bytes, NumPy U/S) as an object array."""
    if isinstance(leaf, str | bytes):
        out = np.empty((), object)
        out[()] = leaf
        return out
    array = np.asarray(leaf)
    if array.dtype.kind in "US":
        return array.astype(object)
    return array


def spec_json(specs: list[TensorSpec]) -> list[dict]:
    return [{"dtype": dtype_name(s.dtype), "shape": list(s.shape)} for s in specs]


def specs_of_json(leaves: list[dict]) -> list[TensorSpec]:
    return [TensorSpec(tuple(leaf["shape"]), dtype_of(leaf["dtype"])) for leaf in leaves]


def merge_spec(spec: TensorSpec | None, array: np.ndarray, name: str) -> TensorSpec:
    """`spec` widened to hold `array` too (a dimension that differs becomes None).

    Raises:
      ValueError: another dtype or rank than the earlier elements' (naming the leaf).
    """
    dtype = np.dtype(object) if array.dtype.kind == "O" else array.dtype
    if spec is None:
        return TensorSpec(array.shape, dtype)
    if dtype != spec.dtype or array.ndim != len(spec.shape):
        raise ValueError(
            f"the element's leaf {name} is a {dtype_name(dtype)} array of shape "
            f"{array.shape}, but earlier elements' are {dtype_name(spec.dtype)} of shape "
            f"{spec.shape}; a saved dataset keeps one dtype and rank per leaf: cast or "
            "reshape in a map before saving"
        )
    if all(a == b for a, b in zip(spec.shape, array.shape, strict=True)):
        return spec
    shape = tuple(a if a == b else None for a, b in zip(spec.shape, array.shape, strict=True))
    return TensorSpec(shape, dtype)


def encode(position: int, arrays: list[np.ndarray]) -> bytes:
    """One record's bytes (before compression) for the element at `position`."""
    parts = [_U64.pack(position)]
    for array in arrays:
        parts.append(_U8.pack(array.ndim))
        parts.extend(_U64.pack(d) for d in array.shape)
        if array.dtype.kind == "O":
            for item in array.reshape(-1):
                if isinstance(item, str):
                    data, kind = item.encode(), 1
                elif isinstance(item, bytes | bytearray | np.bytes_):
                    data, kind = bytes(item), 0
                else:
                    raise ValueError(
                        f"cannot save a Python {type(item).__name__} inside an element: save "
                        "keeps numbers, str and bytes; map the element to arrays first"
                    )
                parts += (_U8.pack(kind), _U64.pack(len(data)), data)
        else:
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            # The array's own buffer: join copies it once, into the record.
            parts.append(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return b"".join(parts)


def position_of(record: Any) -> int:
    return _U64.unpack_from(record, 0)[0]


def decode(record: Any, dtypes: list[np.dtype]) -> list[Any]:
    """The leaves of one record (`encode`'s inverse); views of `record` where it is writable."""
    view = memoryview(record)
    at = 8
    out: list[Any] = []
    for dtype in dtypes:
        ndim = view[at]
        dims = struct.unpack_from(f"<{ndim}Q", view, at + 1)
        at += 1 + 8 * ndim
        if dtype.kind != "O":
            count = int(np.prod(dims, dtype=np.int64))
            array = np.frombuffer(view, dtype, count, at).reshape(dims)
            at += count * dtype.itemsize
            out.append(array)
            continue
        items = []
        for _ in range(int(np.prod(dims, dtype=np.int64))):
            kind, length = view[at], _U64.unpack_from(view, at + 1)[0]
            data = bytes(view[at + 9 : at + 9 + length])
            items.append(data.decode() if kind == 1 else data)
            at += 9 + length
        if ndim == 0:
            out.append(items[0])
        else:
            array = np.empty(len(items), object)
            array[:] = items
            out.append(array.reshape(dims))
    if at != len(view):
        raise ValueError(f"a record of {len(view)} bytes held {at} bytes of leaves")
    return out
