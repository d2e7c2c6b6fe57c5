"""tf.train.Example parsing and writing without TensorFlow, as tf.io does it.

Outputs are NumPy: int64 and float32 arrays, and for `string` features Python `bytes` (a
scalar) or object arrays of `bytes`. A `VarLenFeature` gives a `SparseTensorValue`
`(indices, values, dense_shape)`, the NumPy form of the SparseTensor TensorFlow returns:
int64 indices of shape (n, 1) (or (n, 2) from `parse_example`: batch row, position), the
values, and the int64 dense shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from phalanx._src.data.records import wire

string = np.dtype(object)  # tf.string: a feature of bytes (Python `bytes` is accepted too)
_KINDS = {np.dtype(np.int64): wire.INT64, np.dtype(np.float32): wire.FLOAT, string: wire.BYTES}
_DECODE = {
    wire.INT64: wire.decode_ints,
    wire.FLOAT: wire.decode_floats,
    wire.BYTES: wire.decode_bytes,
}


def _dtype(dtype: Any) -> np.dtype:
    if dtype in (bytes, str, np.bytes_, np.str_, "string"):
        return string
    try:
        result = np.dtype(dtype)
    except TypeError:
        result = None
    if result not in _KINDS:
        raise TypeError(
            f"a feature's dtype must be phalanx.data.string (or bytes), np.int64 or "
            f"np.float32, as tf.io's; got {dtype!r}"
        )
    return result


class SparseTensorValue(NamedTuple):
    """A VarLenFeature's values, as the parts of TensorFlow's SparseTensor."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: np.ndarray


@dataclasses.dataclass(frozen=True)
class FixedLenFeature:
    """A feature with exactly `prod(shape)` values, returned with `shape` (tf.io's).

    Args:
      shape: the output shape, e.g. `[]` for a scalar or `[3]`.
      dtype: `phalanx.data.string` (or `bytes`), `np.int64` or `np.float32`.
      default_value: used when an Example lacks the key (a value of `shape`, or a scalar
        repeated to it); None makes a missing key an error.

    Example:
      >>> FixedLenFeature([], np.int64, default_value=-1)
    """

    shape: Sequence[int]
    dtype: Any
    default_value: Any = None

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(d) for d in self.shape)
        except TypeError:
            shape = (-1,)
        if any(d < 0 for d in shape):
            raise ValueError(
                f"FixedLenFeature's shape must be fully known (ints >= 0), got "
                f"{self.shape!r}; use VarLenFeature for a varying number of values"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", _dtype(self.dtype))


@dataclasses.dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values, returned as a `SparseTensorValue` (tf.io's).

    Example:
      >>> VarLenFeature(np.int64)
    """

    dtype: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype))


def _values(key: str, spec: Any, found: Any) -> Any:
    """The flat values of feature `key` (None when absent), checked against `spec`."""
    if found is None:
        return None
    kind, buf, start, end = found
    expected = _KINDS[spec.dtype]
    if kind == expected:
        try:
            return _DECODE[kind](buf, start, end)
        except wire.WireError as e:
            raise ValueError(f"feature {key!r} is malformed: {e}") from None
    if kind is None:  # a Feature with no list set holds no values of any type
        return [] if expected == wire.BYTES else np.zeros(0, spec.dtype)
    raise TypeError(
        f"feature {key!r} holds a {wire.KIND_NAMES[kind]} but the spec asks for "
        f"{wire.KIND_NAMES[expected]} ({spec.dtype}); give it the stored type"
    )


def _fixed(key: str, spec: FixedLenFeature, values: Any) -> Any:
    size = math.prod(spec.shape)
    if values is None:
        if spec.default_value is None:
            raise ValueError(
                f"feature {key!r} is missing from the Example and has no default; give "
                f"FixedLenFeature({list(spec.shape)}, ..., default_value=...) or write it"
            )
        default = np.asarray(spec.default_value, dtype=spec.dtype)
        if default.size not in (1, size):
            raise ValueError(
                f"feature {key!r}'s default_value has {default.size} values but shape "
                f"{list(spec.shape)} holds {size}"
            )
        values = np.broadcast_to(default.reshape(-1), (size,)).copy()
    elif len(values) != size:
        raise ValueError(
            f"feature {key!r} has {len(values)} values but FixedLenFeature shape "
            f"{list(spec.shape)} needs {size}; fix the shape or use VarLenFeature"
        )
    if _KINDS[spec.dtype] != wire.BYTES:
        return values.reshape(spec.shape)  # an array of spec.dtype already
    if not spec.shape:
        return bytes(values[0])
    array = np.empty(size, object)
    array[:] = [bytes(v) for v in values]
    return array.reshape(spec.shape)


def _var(spec: VarLenFeature, values: Any) -> np.ndarray:
    if values is None:
        values = []
    if spec.dtype == string:
        array = np.empty(len(values), object)
        array[:] = list(values)
        return array
    return np.asarray(values, spec.dtype)


def _check(features: Any) -> Mapping[str, Any]:
    if type(features) is dict:  # the usual spec: its values' exact types suffice
        for spec in features.values():
            if spec.__class__ is not FixedLenFeature and spec.__class__ is not VarLenFeature:
                break
        else:
            return features
    if not isinstance(features, Mapping) or not all(
        isinstance(v, FixedLenFeature | VarLenFeature) for v in features.values()
    ):
        raise TypeError(
            "features must be a dict {key: FixedLenFeature(...) or VarLenFeature(...)}, got "
            f"{features!r}"
        )
    return features


def _serialized(value: Any) -> bytes:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
        return value.tobytes()
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(
            f"expected a serialized Example (bytes), got {type(value).__name__}; e.g. the "
            "elements of TFRecordDataset(files)"
        )
    return bytes(value)


def _decode(serialized: Any) -> dict:
    try:
        return wire.features(serialized if type(serialized) is bytes else _serialized(serialized))
    except wire.WireError as e:
        raise ValueError(f"the record is not a serialized tf.train.Example: {e}") from None


def parse_single_example(serialized: Any, features: Mapping[str, Any]) -> dict[str, Any]:
    """Parses one serialized tf.train.Example, as tf.io.parse_single_example.

    Args:
      serialized: the record (bytes, e.g. an element of `TFRecordDataset`).
      features: `{key: FixedLenFeature(...) | VarLenFeature(...)}`.

    Returns:
      `{key: value}`: NumPy arrays of `shape` for FixedLenFeature (bytes, or an object array
      of bytes, for strings), a `SparseTensorValue` for VarLenFeature.

    Raises:
      ValueError: a missing key without a default, a value count that does not fit the
        shape, a record that is not an Example; each names the key.
      TypeError: a feature stored with another type than the spec's, naming the key.

    Example:
      >>> spec = {"image/encoded": FixedLenFeature([], string),
      ...         "image/class/label": FixedLenFeature([], np.int64)}
      >>> ds = TFRecordDataset(files).map(lambda r: parse_single_example(r, spec))
    """
    features = _check(features)
    found = _decode(serialized)
    out: dict[str, Any] = {}
    for key, spec in features.items():
        values = _values(key, spec, found.get(key))
        if isinstance(spec, FixedLenFeature):
            out[key] = _fixed(key, spec, values)
        else:
            values = _var(spec, values)
            indices = np.arange(len(values), dtype=np.int64)[:, None]
            out[key] = SparseTensorValue(indices, values, np.array([len(values)], np.int64))
    return out


def parse_example(serialized: Any, features: Mapping[str, Any]) -> dict[str, Any]:
    """Parses a batch of serialized Examples, as tf.io.parse_example.

    Returns:
      `{key: value}`: FixedLenFeature values stacked to `(batch, *shape)`; VarLenFeature
      values as one `SparseTensorValue` with indices `(row, position)` and dense shape
      `(batch, longest)`.

    Raises:
      As `parse_single_example`, naming the key (and the row).

    Example:
      >>> batch = parse_example([record_a, record_b], {"label": FixedLenFeature([], np.int64)})
      >>> batch["label"]   # array([3, 7])
    """
    features = _check(features)
    rows = list(np.asarray(serialized, object).reshape(-1))
    decoded = [_decode(r) for r in rows]
    out: dict[str, Any] = {}
    for key, spec in features.items():
        parts = []
        for row, found in enumerate(decoded):
            try:
                values = _values(key, spec, found.get(key))
                fixed = isinstance(spec, FixedLenFeature)
                parts.append(_fixed(key, spec, values) if fixed else _var(spec, values))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{e} (row {row} of the batch)") from None
        if isinstance(spec, FixedLenFeature):
            dtype = object if spec.dtype == string else spec.dtype
            stacked = np.empty((len(rows), *spec.shape), dtype)
            for row, part in enumerate(parts):
                stacked[row] = part
            out[key] = stacked
            continue
        lengths = [len(p) for p in parts]
        indices = [(row, i) for row, n in enumerate(lengths) for i in range(n)]
        flat = np.concatenate(parts) if parts else _var(spec, None)
        out[key] = SparseTensorValue(
            np.array(indices, np.int64).reshape(-1, 2),
            flat,
            np.array([len(rows), max(lengths, default=0)], np.int64),
        )
    return out


def make_example(features: Mapping[str, Any]) -> bytes:
    """A serialized tf.train.Example from `{key: values}` (e.g. to write with TFRecordWriter).

    Values may be a scalar, a list or an array (flattened): bytes or str (UTF-8) make a
    bytes_list, integers and bools an int64_list, floats a float_list (float32). An empty
    list or tuple writes a feature with no values, which parses as any type (a typed empty
    array keeps its type).

    Raises:
      TypeError: a value of another kind (naming the key), or a non-str key.

    Example:
      >>> record = make_example({"image/encoded": jpeg_bytes, "image/class/label": 7})
    """
    if not isinstance(features, Mapping):
        raise TypeError(f"make_example takes a dict {{key: values}}, got {features!r}")
    encoded = {}
    for key, value in features.items():
        if not isinstance(key, str):
            raise TypeError(f"feature keys must be str, got {key!r}")
        encoded[key] = _encode(key, value)
    return wire.encode_example(encoded)


def _encode(key: str, value: Any) -> bytes:
    if isinstance(value, list | tuple) and not value:
        return b""  # a Feature with no list: no values, which parses as any type
    if isinstance(value, bytes | str):
        value = [value]
    if isinstance(value, np.ndarray) and value.dtype.kind in "SUO":
        value = value.reshape(-1).tolist()
    if isinstance(value, list | tuple) and value and isinstance(value[0], bytes | str):
        if not all(isinstance(v, bytes | str) for v in value):
            raise TypeError(f"feature {key!r} mixes bytes/str with other values: {value!r}")
        return wire.encode_feature(
            wire.BYTES, [v.encode() if isinstance(v, str) else v for v in value]
        )
    array = np.asarray(value).reshape(-1)
    if array.dtype.kind in "biu":
        return wire.encode_feature(wire.INT64, array.astype(np.int64))
    if array.dtype.kind == "f":
        return wire.encode_feature(wire.FLOAT, array.astype(np.float32))
    raise TypeError(
        f"feature {key!r} must hold bytes/str, integers or floats, got {value!r} (dtype "
        f"{array.dtype})"
    )
