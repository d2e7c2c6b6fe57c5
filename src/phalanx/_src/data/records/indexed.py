"""TFRecord files with random access: an index of record offsets, built from the headers.

`TFRecordDataset(files).shuffle(n)` is tf.data's most common pipeline. A phalanx shuffle
is a permutation of the whole dataset, which needs random access; for uncompressed TFRecord
files that costs one pass over the record headers (`record_index`: a 12-byte `pread` per
record, files in parallel, cached for the next run), after which any record is one `pread`
away. The records are numbered file after file, so `shuffle` is an exact global shuffle,
an iterator's position is (epoch, step), and `process_split` reads only this process's
rows. For `map(..., workers="process")`, whose worker processes each read the records
they map, the records keep `TFRecordDataset`'s interleaved order (`interleave_order`), so
processes map the elements threads would, in the same order. Compressed files cannot be
read at an offset without decompressing all before it, so they keep streaming.

Files are kept open in an LRU (`open_files`), at most `max_open` at once in each process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import struct
import threading
from typing import Any

import numpy as np

from phalanx._src.data.plan import Key, Node
from phalanx._src.data.records import fingerprint
from phalanx._src.data.records.open_files import DEFAULT_LIMIT, OpenFiles
from phalanx._src.data.records.record_index import fail, index_files
from phalanx._src.data.records.tfrecord_io import masked_crc

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


def _open(files: tuple[str, ...], file: int) -> int:
    try:
        return os.open(files[file], os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"record file {files[file]!r} does not exist") from None


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
                scans = index_files(self.files)
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
class IndexedRecords(fingerprint.OrderedFiles, Node):
    """The records of uncompressed TFRecord files with random access: in file order, or
    in the order `cycle` interleaved files give (`interleave_order`) when `cycle` > 1
    (`auto`: the width came from num_parallel_reads=AUTOTUNE; see `fingerprint`)."""

    files: tuple[str, ...]
    index: _Index | None = dataclasses.field(default=None, repr=False)
    cycle: int = 1
    auto: bool = False
    max_open: int = DEFAULT_LIMIT
    _fds: Any = dataclasses.field(default=None, init=False, repr=False)

    level = 0

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = _Index(self.files)
        # No bound method inside: a cycle would keep the files open until a GC pass.
        self._fds = OpenFiles(self.max_open, functools.partial(_open, self.files), os.close)

    def __getstate__(self) -> dict:
        # a worker opens its own files
        fields = ("files", "index", "cycle", "auto", "max_open")
        return {name: getattr(self, name) for name in fields}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.index.get()  # type: ignore[union-attr]

    @property
    def length(self) -> int:
        return int(self._records()[0][-1])

    @property
    def width(self) -> int:
        """The interleave width that decides the order (a cycle longer than the file list
        gives the order of one as long)."""
        return max(1, min(self.cycle, len(self.files)))

    def _order_of(self) -> tuple[str, Any]:
        return "", None

    def get(self, key: Key, positions: np.ndarray) -> Any:
        starts, offsets, lengths = self._records()
        if self.width > 1:
            positions = self.index.order(self.width)[positions]  # type: ignore[union-attr]
        files = np.searchsorted(starts, positions, side="right") - 1
        out = np.empty(len(positions), object)
        for i, (file, position) in enumerate(zip(files.tolist(), positions.tolist(), strict=True)):
            offset, length = int(offsets[position]), int(lengths[position])
            fd = self._fds.acquire(file)
            try:
                record = os.pread(fd, length + 16, offset)
            finally:
                self._fds.release(file)
            out[i] = self._check(file, offset, length, record)
        return out

    def _check(self, file: int, offset: int, length: int, record: bytes) -> bytes:
        """The data of `record` (read at `offset` for an indexed `length`), every part of
        it checked: the index may be a cached one of a file changed since."""
        path = self.files[file]
        if len(record) != length + 16:
            fail(path, offset, "truncated since it was indexed")
        found, crc = _HEADER.unpack_from(record)
        if found != length or masked_crc(record[:8]) != crc:
            fail(
                path,
                offset,
                "the record's header does not match the index (the file "
                "changed since it was indexed)",
            )
        data = record[12 : 12 + length]
        if masked_crc(data) != _CRC.unpack_from(record, 12 + length)[0]:
            fail(path, offset, "the checksum of the data does not match")
        return data

    def __del__(self) -> None:
        fds = getattr(self, "_fds", None)
        if fds is not None:
            fds.close()
