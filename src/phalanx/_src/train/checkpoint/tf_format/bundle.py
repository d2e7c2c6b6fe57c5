"""A TF checkpoint's tensors: `load_checkpoint` / `list_variables`, as `tf.train`'s.

The `.index` table (`table.read_table`) maps each tensor's name to a `BundleEntryProto`:

    BundleEntryProto { DataType dtype = 1; TensorShapeProto shape = 2; int32 shard_id = 3;
                       int64 offset = 4; int64 size = 5; fixed32 crc32c = 6;
                       repeated TensorSliceProto slices = 7; }
    TensorShapeProto { repeated Dim dim = 2 { int64 size = 1; }; bool unknown_rank = 3; }

and the empty key to the `BundleHeaderProto { int32 num_shards = 1; Endianness
endianness = 2; VersionDef version = 3; }`. A tensor's bytes lie at `offset` in shard
`<prefix>.data-<shard_id>-of-<num_shards>`, little-endian, and their masked CRC-32C is
`crc32c`. A string tensor (the object graph) is stored as its varint64 lengths, a masked
CRC-32C of the lengths (as uint32s), then the bytes; `crc32c` covers all three.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import google_crc32c
import ml_dtypes
import numpy as np

from phalanx._src.data.records.wire import WireError, fields, varint
from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.tf_format import state_file
from phalanx._src.train.checkpoint.tf_format.table import mask, read_table

# TF's DataType enum (types.proto) for the dtypes a checkpoint holds as plain bytes.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.float64), 3: np.dtype(np.int32),
    4: np.dtype(np.uint8), 5: np.dtype(np.int16), 6: np.dtype(np.int8),
    8: np.dtype(np.complex64), 9: np.dtype(np.int64), 10: np.dtype(np.bool_),
    14: np.dtype(ml_dtypes.bfloat16), 17: np.dtype(np.uint16), 18: np.dtype(np.complex128),
    19: np.dtype(np.float16), 22: np.dtype(np.uint32), 23: np.dtype(np.uint64),
    24: np.dtype(ml_dtypes.float8_e5m2), 25: np.dtype(ml_dtypes.float8_e4m3fn),
}  # fmt: skip
STRING = 7
_NAMES = {7: "string", 11: "qint8", 12: "quint8", 13: "qint32", 15: "qint16", 20: "resource",
          21: "variant"}  # fmt: skip
TENSOR_BUNDLE_VERSION = 1  # the format version this reader implements (tensor_bundle.cc)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _dim(buf: bytes, start: int, end: int) -> int:
    """A `TensorShapeProto.Dim`'s size (0 when absent: protobuf omits zeros)."""
    sizes = [size for n, w, size in fields(buf, start, end) if n == 1 and w == 0]
    return _signed(sizes[-1]) if sizes else 0


def _decode_entry(value: bytes, key: str, path: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"dtype": 0, "shape": [], "shard": 0, "offset": 0, "size": 0,
                             "crc": None, "sliced": False}  # fmt: skip
    try:
        for number, wire, part in fields(value):
            if number == 1 and wire == 0:
                entry["dtype"] = part
            elif number == 2 and wire == 2:
                entry["shape"] = [
                    _dim(value, *dim) for n, w, dim in fields(value, *part) if n == 2 and w == 2
                ]
            elif number in (3, 4, 5) and wire == 0:
                entry[{3: "shard", 4: "offset", 5: "size"}[number]] = part
            elif number == 6 and wire == 5:
                (entry["crc"],) = struct.unpack_from("<I", value, part)
            elif number == 7:
                entry["sliced"] = True
    except WireError as error:
        raise CheckpointError(f"{path} is damaged: the entry of {key!r} ({error})") from None
    return entry


class CheckpointReader:
    """The tensors of one TF checkpoint, as `tf.train.load_checkpoint` returns them.

    Dtypes are NumPy's (`ml_dtypes.bfloat16` for bfloat16); a string tensor is an object
    array of `bytes`. Every tensor read is checked against its stored CRC-32C.

    Args:
      prefix: the checkpoint's prefix, e.g. `"dir/ckpt-3"` (files `dir/ckpt-3.index`...).

    Raises:
      FileNotFoundError: without `<prefix>.index`.
      CheckpointError: naming the file, for a damaged or unsupported checkpoint.

    Example:
      >>> reader = phalanx.train.load_checkpoint("runs/tf/ckpt-3")
      >>> reader.get_variable_to_shape_map()["step/.ATTRIBUTES/VARIABLE_VALUE"]
      []
      >>> kernel = reader.get_tensor("model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE")
    """

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = os.path.abspath(os.fspath(prefix))
        index = self.prefix + ".index"
        if not os.path.isfile(index):
            raise FileNotFoundError(
                f"no TF checkpoint at {os.fspath(prefix)!r}: {index} does not exist; pass the "
                "prefix TF saved (e.g. 'dir/ckpt-3', not a file name), or a folder holding a "
                "'checkpoint' state file"
            )
        self._index = index
        table = read_table(index)
        header = table.pop(b"", None)
        if header is None:
            raise CheckpointError(f"{index} has no bundle header: not a TF 2 checkpoint index")
        self._shards, big_endian = self._header(header)
        self._order = ">" if big_endian else "<"
        self._entries = {
            key.decode("utf-8", "surrogateescape"): value for key, value in table.items()
        }
        self._decoded: dict[str, dict[str, Any]] = {}

    def _header(self, value: bytes) -> tuple[int, bool]:
        shards, endianness, version = 1, 0, {1: 0, 2: 0}
        bad: list[int] = []
        try:
            for number, wire, part in fields(value):
                if number == 1 and wire == 0:
                    shards = part
                elif number == 2 and wire == 0:
                    endianness = part
                elif number == 3 and wire == 2:  # VersionDef: producer, min_consumer, bad
                    for n, w, v in fields(value, *part):
                        if w == 0 and n in version:
                            version[n] = v
                        elif w == 0 and n == 3:
                            bad.append(v)
        except WireError as error:
            raise CheckpointError(f"{self._index}: its header does not decode ({error})") from None
        producer, min_consumer = version[1], version[2]
        if min_consumer > TENSOR_BUNDLE_VERSION or TENSOR_BUNDLE_VERSION in bad:
            raise CheckpointError(
                f"{self._index} was written in tensor-bundle format version {producer}, which "
                f"needs a reader of version >= {min_consumer}; this reader is version "
                f"{TENSOR_BUNDLE_VERSION}. Re-save it with an older TensorFlow"
            )
        return shards, endianness == 1

    def entry(self, key: str) -> dict[str, Any]:
        """The decoded `BundleEntryProto` of `key` (dtype number, shape, shard, offset...)."""
        if key not in self._decoded:
            if key not in self._entries:
                raise KeyError(
                    f"{key!r} is not in the checkpoint {self.prefix}; its keys: "
                    f"{sorted(self._entries)[:6]}... (list them with list_variables)"
                )
            self._decoded[key] = _decode_entry(self._entries[key], key, self._index)
        return self._decoded[key]

    def names(self) -> list[str]:
        """Every tensor's name, sorted."""
        return sorted(self._entries)

    def has_tensor(self, name: str) -> bool:
        """Whether the checkpoint holds a tensor named `name`."""
        return name in self._entries

    def get_variable_to_shape_map(self) -> dict[str, list[int]]:
        """`{name: shape}` for every tensor, shapes as lists (as TF returns them)."""
        return {key: list(self.entry(key)["shape"]) for key in self._entries}

    def get_variable_to_dtype_map(self) -> dict[str, np.dtype]:
        """`{name: NumPy dtype}` (object for strings) for every tensor."""
        return {key: self.dtype(key) for key in self._entries}

    def dtype(self, name: str) -> np.dtype:
        """The NumPy dtype of tensor `name`."""
        number = self.entry(name)["dtype"]
        if number == STRING:
            return np.dtype(object)
        if number not in DTYPES:
            kind = _NAMES.get(number, f"DataType {number}")
            raise CheckpointError(
                f"{name!r} in {self.prefix} is a {kind} tensor, which phalanx does not read "
                "(it reads numeric, bool and string tensors)"
            )
        return DTYPES[number]

    def get_tensor(self, name: str) -> np.ndarray:
        """Tensor `name` as a NumPy array, checked against its CRC-32C.

        Raises:
          KeyError: naming the key and some of the checkpoint's, when it is absent.
          CheckpointError: naming the file, when the bytes do not match their checksum.
        """
        entry = self.entry(name)
        if entry["sliced"]:
            raise CheckpointError(
                f"{name!r} in {self.prefix} is stored in slices (a partitioned variable); "
                "phalanx reads whole tensors only: restore it in TF and save it unpartitioned"
            )
        dtype = self.dtype(name)
        shape = tuple(entry["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if dtype == np.dtype(object):  # its checksum covers the lengths as uint32s: _strings
            data = self._read(entry, name, check=False)
            return _strings(data, count, entry["crc"], name, self.prefix).reshape(shape)
        data = self._read(entry, name, check=True)
        if len(data) != count * dtype.itemsize:
            raise CheckpointError(
                f"{name!r} in {self.prefix} holds {len(data)} bytes, not the "
                f"{dtype.name}{list(shape)} its entry says: the checkpoint is damaged"
            )
        array = np.frombuffer(data, dtype.newbyteorder(self._order)).reshape(shape)
        return array.astype(dtype) if self._order == ">" else array

    def _read(self, entry: dict[str, Any], name: str, check: bool) -> bytearray:
        shard = os.fspath(self.prefix) + f".data-{entry['shard']:05d}-of-{self._shards:05d}"
        try:
            with open(shard, "rb") as file:
                file.seek(entry["offset"])
                data = bytearray(entry["size"])
                got = file.readinto(data)
        except FileNotFoundError:
            raise CheckpointError(
                f"the data file {shard} of the checkpoint {self.prefix} is missing (tensor "
                f"{name!r} is in it); copy every <prefix>.data-* file with the .index"
            ) from None
        if got != entry["size"] or (
            check
            and entry["crc"] is not None
            and mask(google_crc32c.value(bytes(data))) != entry["crc"]
        ):
            raise CheckpointError(
                f"{shard} is damaged: the bytes of {name!r} do not match their checksum"
            )
        return data


def _strings(data: bytearray, count: int, crc32c: int | None, name: str, prefix: str) -> np.ndarray:
    """A string tensor's elements, checked: the lengths against their own checksum, then
    the entry's checksum over the lengths (as uint32s), that checksum and the bytes."""
    buf = bytes(data)
    lengths, pos, crc = [], 0, 0
    try:
        for _ in range(count):
            length, pos = varint(buf, pos)
            lengths.append(length)
            packed = (
                struct.pack("<I", length) if length <= 0xFFFFFFFF else struct.pack("<Q", length)
            )
            crc = google_crc32c.extend(crc, packed)
        (stored,) = struct.unpack_from("<I", buf, pos)
    except (WireError, struct.error):
        raise CheckpointError(
            f"{name!r} in {prefix} is damaged: its lengths do not decode"
        ) from None
    if mask(crc) != stored:
        raise CheckpointError(f"{name!r} in {prefix} is damaged: its lengths' checksum differs")
    crc = google_crc32c.extend(crc, buf[pos : pos + 4])
    pos += 4
    if crc32c is not None and mask(google_crc32c.extend(crc, buf[pos:])) != crc32c:
        raise CheckpointError(f"{name!r} in {prefix} is damaged: its bytes' checksum differs")
    out = np.empty(count, object)
    for i, length in enumerate(lengths):
        out[i] = buf[pos : pos + length]
        pos += length
    if pos != len(buf):
        raise CheckpointError(f"{name!r} in {prefix} is damaged: {len(buf) - pos} bytes left over")
    return out


def resolve(ckpt_dir_or_file: str | os.PathLike) -> str:
    """A checkpoint prefix from a prefix, or from a folder holding TF's state file."""
    path = os.fspath(ckpt_dir_or_file)
    if os.path.isdir(path) and not state_file.is_tf_checkpoint(path):
        latest = state_file.tf_latest(path)
        if latest is None:
            raise ValueError(
                f"no TF checkpoint found in the folder {path!r}: it has no 'checkpoint' state "
                "file naming one (or the files it names are gone); pass a prefix, e.g. "
                f"{os.path.join(path, 'ckpt-1')!r}"
            )
        return latest
    return path


def load_checkpoint(ckpt_dir_or_file: str | os.PathLike) -> CheckpointReader:
    """A reader for a TF checkpoint, as `tf.train.load_checkpoint`, without TensorFlow.

    Args:
      ckpt_dir_or_file: a checkpoint prefix (`"dir/ckpt-3"`), or a folder whose
        `checkpoint` state file names the newest checkpoint.

    Returns:
      A `CheckpointReader` (`get_tensor`, `has_tensor`, `get_variable_to_shape_map`,
      `get_variable_to_dtype_map`).

    Raises:
      ValueError: a folder without a TF checkpoint.
      FileNotFoundError: a prefix without its `.index` file.
      CheckpointError: naming the file, for a damaged checkpoint.

    Example:
      >>> reader = phalanx.train.load_checkpoint("runs/tf")
      >>> step = int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    """
    return CheckpointReader(resolve(ckpt_dir_or_file))


def list_variables(ckpt_dir_or_file: str | os.PathLike) -> list[tuple[str, list[int]]]:
    """`(name, shape)` of every tensor of a TF checkpoint, sorted by name, as
    `tf.train.list_variables`.

    Args:
      ckpt_dir_or_file: a checkpoint prefix, or a folder with TF's `checkpoint` file.

    Returns:
      A sorted list of `(name, shape)` pairs, shapes as lists of ints.

    Example:
      >>> phalanx.train.list_variables("runs/tf/ckpt-3")[:2]
      [('_CHECKPOINTABLE_OBJECT_GRAPH', []), ('model/layer_with_weights-0/bias/...', [10])]
    """
    reader = load_checkpoint(ckpt_dir_or_file)
    shapes = reader.get_variable_to_shape_map()
    return [(name, shapes[name]) for name in reader.names()]
