"""Where the records of uncompressed TFRecord files start: read from their headers alone,
files in parallel, and kept in a cache so that the next run skips the scan.

Why: random access to TFRecord files (a global `shuffle`, maps in worker processes) needs
every record's offset, and a TFRecord file holds no index. Each record's 12-byte header
(its length and the length's checksum) is read with one `os.pread` at its offset, and the
data is jumped over: a shard of 1,250 ImageNet records (~140 MB) costs 15 KB of reads, not
140 MB. Files are scanned by a few threads at once (`pread` releases the GIL, so a cold disk
or a network file system serves several files together); the threads end with the scan.

The offsets are cached (`index_cache`), one entry per file, keyed by the file's real path,
size and modification time. A cached offset is never trusted alone: reading a record
checks its header against the index (the same length, a valid length checksum) and its
data checksum, so a file changed in place without a new size or mtime raises
`DataLossError`; it never serves other bytes as a record.
"""

from __future__ import annotations

import concurrent.futures
import os
import struct
from typing import NoReturn

import numpy as np

from phalanx._src.data.records import index_cache
from phalanx._src.data.records.tfrecord_io import DataLossError, masked_crc

_HEADER = struct.Struct("<QI")
SCAN_THREADS = 8  # files scanned at once: enough to overlap a network file system's latency


def fail(path: str, offset: int, what: str) -> NoReturn:
    """Raises the DataLossError of a damaged record at `offset` of `path`."""
    raise DataLossError(
        f"corrupted record at byte offset {offset} in {path!r}: {what}. The file is "
        "truncated or damaged; re-create or re-download it, or leave it out"
    )


def scan_file(path: str) -> tuple[np.ndarray, int]:
    """The byte offset of every record of an uncompressed TFRecord file, read from the
    records' headers (each length checked against its checksum), in order, and the
    file's size.

    Raises:
      DataLossError: a damaged header or a truncated last record, naming file and offset.
      FileNotFoundError: a missing file, naming it.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"record file {path!r} does not exist") from None
    try:
        size = os.fstat(fd).st_size
        offsets: list[int] = []
        position = 0
        pread, unpack = os.pread, _HEADER.unpack
        while position < size:
            header = pread(fd, 12, position)
            if len(header) < 12:
                fail(path, position, f"truncated: a 12-byte header was cut to {len(header)}")
            length, crc = unpack(header)
            if masked_crc(header[:8]) != crc:
                fail(path, position, "the checksum of the length field does not match")
            end = position + 16 + length
            if end > size:
                fail(path, position, f"truncated: the record's {length} bytes run past the end")
            offsets.append(position)
            position = end
    finally:
        os.close(fd)
    return np.array(offsets, np.int64), size


def index_file(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data lengths) of the records of an uncompressed TFRecord file: from the
    cache when its entry is the file's (same real path, size and mtime), else scanned
    (`scan_file`) and cached.

    Raises:
      DataLossError: a damaged header or a truncated last record, naming file and offset.
    """
    key = index_cache.key(path)
    offsets = None if key is None else index_cache.load(key)
    if offsets is not None:
        return offsets, _lengths(offsets, key.size)  # type: ignore[union-attr]
    offsets, size = scan_file(path)
    if key is not None and key.size == size:
        index_cache.store(key, offsets)
    return offsets, _lengths(offsets, size)


def index_files(paths: tuple[str, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`index_file` of every path, in order, `SCAN_THREADS` files at a time."""
    if len(paths) <= 1:
        return [index_file(path) for path in paths]
    workers = min(len(paths), SCAN_THREADS)
    with concurrent.futures.ThreadPoolExecutor(workers, "phalanx-index") as pool:
        return list(pool.map(index_file, paths))


def _lengths(offsets: np.ndarray, size: int) -> np.ndarray:
    """The data length of each record of a file of `size` bytes whose records start at
    `offsets` and fill it (each record is 16 bytes of framing around its data)."""
    ends = np.append(offsets[1:], size) if len(offsets) else offsets
    return ends - offsets - 16
