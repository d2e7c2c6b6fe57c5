"""TFRecord files with random access: an index of record offsets, built by one scan.

`TFRecordDataset(files).shuffle(n)` is tf.data's most common pipeline. A phalanx shuffle
is a permutation of the whole dataset, which needs random access; for uncompressed TFRecord
files that costs one pass over the record headers (a 12-byte read and a seek per record,
the data is not read), after which any record is one `pread` away. The records are
numbered file after file, so `shuffle` is an exact global shuffle, an iterator's position
is (epoch, step), and `process_split` reads only this process's rows. For
`map(..., workers="process")`, whose worker processes each read the records they map, the
records keep `TFRecordDataset`'s interleaved order (`interleave_order`), so processes map
the elements threads would, in the same order. Compressed files cannot be read at an
offset without decompressing all before it, so they keep streaming.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
from typing import Any

import numpy as np

from phalanx._src.data.plan import Key, Node
from phalanx._src.data.records.tfrecord_io import DataLossError, masked_crc

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


def index_file(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of every record of an uncompressed TFRecord file, each length
    checked against its checksum.

    Raises:
      DataLossError: a damaged header or a truncated last record, naming file and offset.
    """
    offsets, lengths = [], []
    size = os.path.getsize(path)
    position = 0
    with open(path, "rb", buffering=1 << 20) as f:
        while True:
            header = f.read(12)
            if not header:
                break
            if len(header) < 12:
                _fail(path, position, f"truncated: a 12-byte header was cut to {len(header)}")
            length, crc = _HEADER.unpack(header)
            if masked_crc(header[:8]) != crc:
                _fail(path, position, "the checksum of the length field does not match")
            if position + 16 + length > size:
                _fail(path, position, f"truncated: the record's {length} bytes run past the end")
            offsets.append(position)
            lengths.append(length)
            position += 16 + length
            f.seek(position)
    return np.array(offsets, np.int64), np.array(lengths, np.int64)


def _fail(path: str, offset: int, what: str) -> None:
    raise DataLossError(
        f"corrupted record at byte offset {offset} in {path!r}: {what}. The file is "
        "truncated or damaged; re-create or re-download it, or leave it out"
    )


def interleave_order(counts: Any, cycle: int) -> np.ndarray:
    """The file-order numbers of the records, in the order `cycle` interleaved files give.

    `counts[i]` records are in file i. As `RecordFiles`' cursor (tf.data's interleave with
    block length 1): `cycle` files are open at a time and give one record each in turn; an
    exhausted file's slot takes the next file when the turn comes back to it.

    Example:
      >>> interleave_order([3, 1, 2], cycle=2).tolist()  # file 2 takes file 1's turns
      [0, 3, 1, 2, 4, 5]
    """
    starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64)
    order = np.empty(int(starts[-1]), np.int64)
    slots: list[list[int] | None] = [None] * cycle  # [file, its next record]
    next_file = turn = done = 0
    while True:
        slot = slots[turn]
        if slot is None:
            if next_file < len(counts):
                slots[turn] = [next_file, 0]
                next_file += 1
                continue
            if all(s is None for s in slots):
                return order
        elif slot[1] < counts[slot[0]]:
            order[done] = starts[slot[0]] + slot[1]
            slot[1] += 1
            done += 1
        else:
            slots[turn] = None
        turn = (turn + 1) % cycle


class _Index:
    """The files' record offsets, built on first use and shared by the node's copies (the
    plan copies nodes when it changes a seed or splits over processes)."""

    def __init__(self, files: tuple[str, ...]) -> None:
        self.files = files
        self.value: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.orders: dict[int, np.ndarray] = {}  # interleave_order by cycle
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"files": self.files, "value": self.value, "orders": self.orders}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["files"])
        self.value, self.orders = state["value"], state["orders"]

    def get(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first record of each file, offsets, lengths), the files scanned once."""
        with self.lock:
            if self.value is None:
                scans = [index_file(path) for path in self.files]
                counts = [len(offsets) for offsets, _ in scans]
                starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
                empty = [np.zeros(0, np.int64)]
                offsets = np.concatenate([o for o, _ in scans] or empty)
                lengths = np.concatenate([n for _, n in scans] or empty)
                self.value = (starts, offsets, lengths)
            return self.value

    def order(self, cycle: int) -> np.ndarray:
        """`interleave_order` of the files' records for `cycle`, computed once."""
        starts = self.get()[0]
        with self.lock:
            if cycle not in self.orders:
                self.orders[cycle] = interleave_order(np.diff(starts), cycle)
            return self.orders[cycle]


@dataclasses.dataclass(eq=False)
class IndexedRecords(Node):
    """The records of uncompressed TFRecord files with random access: in file order, or
    in the order `cycle` interleaved files give (`interleave_order`) when `cycle` > 1."""

    files: tuple[str, ...]
    index: _Index | None = dataclasses.field(default=None, repr=False)
    cycle: int = 1
    _fds: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    level = 0

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = _Index(self.files)

    def __getstate__(self) -> dict:
        # a worker opens its own files
        return {"files": self.files, "index": self.index, "cycle": self.cycle}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["files"], state["index"], state["cycle"])

    def _records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.index.get()  # type: ignore[union-attr]

    @property
    def length(self) -> int:
        return int(self._records()[0][-1])

    def _fd(self, file: int) -> int:
        with self._lock:
            fd = self._fds.get(file)
            if fd is None:
                fd = self._fds[file] = os.open(self.files[file], os.O_RDONLY)
            return fd

    def get(self, key: Key, positions: np.ndarray) -> Any:
        starts, offsets, lengths = self._records()
        if self.cycle > 1:
            positions = self.index.order(self.cycle)[positions]  # type: ignore[union-attr]
        files = np.searchsorted(starts, positions, side="right") - 1
        out = np.empty(len(positions), object)
        for i, (file, position) in enumerate(zip(files.tolist(), positions.tolist(), strict=True)):
            offset, length = int(offsets[position]), int(lengths[position])
            body = os.pread(self._fd(file), length + 4, offset + 12)
            if len(body) != length + 4:
                _fail(self.files[file], offset, "truncated since it was indexed")
            if masked_crc(body[:length]) != _CRC.unpack_from(body, length)[0]:
                _fail(self.files[file], offset, "the checksum of the data does not match")
            out[i] = body[:length]
        return out

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)
