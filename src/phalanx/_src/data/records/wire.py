"""The protobuf wire format of tf.train.Example, decoded and encoded by hand (`fields` and
`varint` also decode TF's checkpoint files: `train.checkpoint.tf_format`).

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }   entries: { string key = 1; Feature value = 2; }
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                            Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1; }
    Int64List { repeated int64 value = 1; }

Lists may be packed or not (both are legal protobuf), unknown fields are skipped, a repeated
message field merges and the last map entry for a key wins, as protobuf's parsers do. Only
the features a parser asks for are decoded (`features` returns them still encoded).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BYTES, FLOAT, INT64 = 1, 2, 3  # Feature's field numbers, which name the list kinds
KIND_NAMES = {BYTES: "bytes_list", FLOAT: "float_list", INT64: "int64_list", None: "no list"}


class WireError(ValueError):
    """A serialized Example that is not valid protobuf."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("a varint runs past the end of the message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos  # bits past 64 dropped, as protobuf does
        shift += 7
        if shift >= 70:
            raise WireError("a varint is longer than 10 bytes")


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The bare varint at `pos` and the position after it (formats built on protobuf's
    encoding store some outside any message: TF's checkpoint tables, string tensors)."""
    return _varint(buf, pos)


def fields(buf: bytes, start: int = 0, end: int | None = None) -> list[tuple[int, int, Any]]:
    """The message's `(field number, wire type, value)`s: an int for a varint, the offset
    of a fixed32/64, and the `(start, end)` span of `buf` of a length-delimited field.

    One-byte tags and lengths (nearly all of an Example's) take a fast path: this runs
    for every record, in Python.
    """
    end = len(buf) if end is None else end
    out = []
    pos = start
    try:
        while pos < end:
            tag = buf[pos]
            pos += 1
            if tag >= 0x80:
                tag, pos = _varint(buf, pos - 1)
            wire = tag & 7
            if wire == 2:
                size = buf[pos]
                pos += 1
                if size >= 0x80:
                    size, pos = _varint(buf, pos - 1)
                value: Any = (pos, pos + size)
                pos += size
            elif wire == 0:
                value = buf[pos]
                pos += 1
                if value >= 0x80:
                    value, pos = _varint(buf, pos - 1)
            elif wire == 5:
                value = pos
                pos += 4
            elif wire == 1:
                value = pos
                pos += 8
            else:
                raise WireError(f"unsupported wire type {wire} for field {tag >> 3}")
            if pos > end:
                raise WireError(f"field {tag >> 3} runs past the end of its message")
            out.append((tag >> 3, wire, value))
    except IndexError:
        raise WireError("the message ends inside a field") from None
    return out


def features(serialized: bytes) -> dict[str, tuple[int | None, bytes, int, int]]:
    """The Example's features by key: `(kind, buffer, start, end)` of the list, undecoded."""
    found = _usual_features(serialized)
    return _any_features(serialized) if found is None else found


def _usual_features(buf: bytes) -> dict[str, tuple[int, bytes, int, int]] | None:
    """`features` of an Example in the layout every writer emits, in one pass: a single
    `features` field, each entry a key (under 128 bytes) then a Feature holding one list.
    None for any other layout (or malformed data), which `_any_features` then decodes (or
    rejects)."""
    found: dict[str, tuple[int, bytes, int, int]] = {}
    try:
        if buf[0] != 0x0A:
            return None
        size, pos = _length(buf, 1)
        end = pos + size
        if end != len(buf):
            return None
        while pos < end:
            if buf[pos] != 0x0A:  # an entry (Features field 1)
                return None
            size, pos = _length(buf, pos + 1)
            entry_end = pos + size
            size = buf[pos + 1]
            if buf[pos] != 0x0A or size >= 0x80:  # its key
                return None
            pos += 2
            key_end = pos + size
            if buf[key_end] != 0x12:  # its Feature
                return None
            size, value = _length(buf, key_end + 1)
            kind = buf[value]
            if value + size != entry_end or kind not in (0x0A, 0x12, 0x1A):
                return None  # e.g. a Feature with no list, or more than one
            size, start = _length(buf, value + 1)
            if start + size != entry_end:
                return None
            key = buf[pos:key_end].decode("utf-8", "surrogateescape")
            found[key] = (kind >> 3, buf, start, entry_end)
            pos = entry_end
    except (IndexError, WireError):
        return None
    return found if pos == end else None


def _any_features(serialized: bytes) -> dict[str, tuple[int | None, bytes, int, int]]:
    """`features` of any valid Example: the general path."""
    found: dict[str, Any] = {}
    for number, wire, span in fields(serialized):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, entry in fields(serialized, *span):
            if entry_number == 1 and entry_wire == 2:
                key, value = _entry(serialized, *entry)
                found[key] = value
    return found


def _length(buf: bytes, pos: int) -> tuple[int, int]:
    size = buf[pos]
    if size < 0x80:
        return size, pos + 1
    second = buf[pos + 1]
    if second < 0x80:
        return (size & 0x7F) | (second << 7), pos + 2
    third = buf[pos + 2]
    if third < 0x80:  # up to 2 MiB: a JPEG's bytes, a feature holding them
        return (size & 0x7F) | (second & 0x7F) << 7 | third << 14, pos + 3
    return _varint(buf, pos)


def _entry(buf: bytes, start: int, end: int) -> tuple[str, tuple[int | None, bytes, int, int]]:
    """One map entry: its key and its Feature's list."""
    try:  # the layout every writer emits: key (field 1), then value (field 2)
        if buf[start] == 0x0A:
            size, pos = _length(buf, start + 1)
            key_end = pos + size
            if buf[key_end] == 0x12:
                size, value = _length(buf, key_end + 1)
                if value + size == end:
                    key = buf[pos:key_end].decode("utf-8", "surrogateescape")
                    return key, _feature(buf, value, end)
    except IndexError:
        pass  # not that layout: the general path below says what is wrong
    key, feature = "", (None, buf, 0, 0)
    for number, wire, part in fields(buf, start, end):
        if number == 1 and wire == 2:
            key = buf[part[0] : part[1]].decode("utf-8", "surrogateescape")
        elif number == 2 and wire == 2:
            feature = _feature(buf, *part)
    return key, feature


def _feature(buf: bytes, start: int, end: int) -> tuple[int | None, bytes, int, int]:
    if start + 1 < end and buf[start] in (0x0A, 0x12, 0x1A):  # one list: the usual Feature
        try:
            size, pos = _length(buf, start + 1)
        except IndexError:
            size, pos = -1, start  # not that form: the general path says what is wrong
        if pos + size == end:
            return buf[start] >> 3, buf, pos, end
    kind, span = None, (start, start)
    for number, wire, value in fields(buf, start, end):
        if number in (BYTES, FLOAT, INT64) and wire == 2:
            kind, span = number, value  # a oneof: the last one set wins
    return kind, buf, span[0], span[1]


def _packed(buf: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The payload of a list written as one packed field (every writer's form), else None."""
    if start + 1 < end and buf[start] == 0x0A:
        try:
            size, pos = _length(buf, start + 1)
        except IndexError:
            return None
        if pos + size == end:
            return pos, end
    return None


def decode_bytes(buf: bytes, start: int, end: int) -> list[bytes]:
    values = []
    pos = start
    try:  # the usual form: field 1 (tag 0x0a) once per value
        while pos < end and buf[pos] == 0x0A:
            size, pos = _length(buf, pos + 1)
            values.append(buf[pos : pos + size])
            pos += size
    except IndexError:
        pos = -1
    if pos == end:
        return values
    return [buf[s:e] for n, w, (s, e) in _list(buf, start, end, (2,))]


def decode_floats(buf: bytes, start: int, end: int) -> np.ndarray:
    packed = _packed(buf, start, end)
    if packed is not None and (packed[1] - packed[0]) % 4 == 0:
        return np.frombuffer(buf, "<f4", (packed[1] - packed[0]) // 4, packed[0]).astype(np.float32)
    parts = []
    for _, wire, value in _list(buf, start, end, (2, 5)):
        if wire == 5:
            parts.append(np.frombuffer(buf, "<f4", 1, value))
        elif (value[1] - value[0]) % 4:
            raise WireError("a packed float list's size is not a multiple of 4 bytes")
        else:
            parts.append(np.frombuffer(buf, "<f4", (value[1] - value[0]) // 4, value[0]))
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def decode_ints(buf: bytes, start: int, end: int) -> np.ndarray:
    packed = _packed(buf, start, end)
    if packed is not None:
        if packed[1] - packed[0] > _SHORT:
            return _packed_varints(buf, *packed).view(np.int64)
        return _int64s(_short_varints(buf, *packed))
    values: list[int] = []
    parts = []
    for _, wire, value in _list(buf, start, end, (0, 2)):
        if wire == 0:
            values.append(value)
        elif value[1] - value[0] <= _SHORT:
            values.extend(_short_varints(buf, *value))
        else:
            parts.append(_packed_varints(buf, *value))
    if not parts:  # a label or a few ids
        return _int64s(values)
    if values:
        parts.append(np.array(values, np.uint64))
    return np.concatenate(parts).astype(np.uint64).view(np.int64)


_SHORT = 64  # packed lists up to this many bytes are decoded in Python (faster when short)


def _int64s(values: list[int]) -> np.ndarray:
    """Varints' values (uint64) as int64s, two's complement."""
    try:
        return np.array(values, np.int64)
    except OverflowError:  # a value past 2**63 - 1: a negative number
        return np.array(values, np.uint64).view(np.int64)


def _short_varints(buf: bytes, start: int, end: int) -> list[int]:
    values = []
    pos = start
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:
            values.append(byte)
            pos += 1
        elif pos + 1 < end and buf[pos + 1] < 0x80:  # two bytes: e.g. a class label
            values.append((byte & 0x7F) | buf[pos + 1] << 7)
            pos += 2
        else:
            value, pos = _varint(buf, pos)
            values.append(value)
    if pos != end:
        raise WireError("a packed int64 list ends inside a varint")
    return values


def _list(buf: bytes, start: int, end: int, wires: tuple[int, ...]) -> Any:
    for number, wire, value in fields(buf, start, end):
        if number == 1:
            if wire not in wires:
                raise WireError(f"a list value has wire type {wire}, expected one of {wires}")
            yield number, wire, value


def _packed_varints(buf: bytes, start: int, end: int) -> np.ndarray:
    """Packed varints decoded with array operations (one Python call for the list)."""
    data = np.frombuffer(buf, np.uint8, end - start, start)
    if len(data) == 0:
        return np.zeros(0, np.uint64)
    last = data < 0x80
    if not last[-1]:
        raise WireError("a packed int64 list ends inside a varint")
    group = np.concatenate(([0], np.cumsum(last)[:-1]))
    starts = np.flatnonzero(np.concatenate(([True], last[:-1])))
    place = np.arange(len(data)) - starts[group]
    if place.max() >= 10:
        raise WireError("a varint is longer than 10 bytes")
    # Shifts past bit 63 wrap, which is what two's complement int64 varints need.
    shifted = (data & 0x7F).astype(np.uint64) << (place.astype(np.uint64) * np.uint64(7))
    return np.add.reduceat(shifted, starts)


# -- encoding ---------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def encode_feature(kind: int, values: Any) -> bytes:
    """One Feature message: `values` a list of bytes (BYTES) or a 1-D array."""
    if kind == BYTES:
        body = b"".join(_delimited(1, v) for v in values)
    elif kind == FLOAT:
        body = _delimited(1, np.asarray(values, "<f4").tobytes()) if len(values) else b""
    else:
        packed = b"".join(_encode_varint(int(v)) for v in values)
        body = _delimited(1, packed) if len(values) else b""
    return _delimited(kind, body)


def encode_example(encoded: dict[str, bytes]) -> bytes:
    """An Example from `{key: encoded Feature}`."""
    entries = b"".join(
        _delimited(1, _delimited(1, key.encode()) + _delimited(2, value))
        for key, value in encoded.items()
    )
    return _delimited(1, entries)
