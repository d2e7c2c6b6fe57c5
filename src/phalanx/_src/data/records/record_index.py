"""Where the records of uncompressed TFRecord files start: read from their headers alone,
files in parallel, and kept in a cache so that the next run skips the scan.

Why: random access to TFRecord files (a global `shuffle`, maps in worker processes) needs
every record's offset, and a TFRecord file holds no index. Each record's 12-byte header
(its length and the length's checksum) is read with one `os.pread` at its offset, and the
data is jumped over: a shard of 1,250 ImageNet records (~140 MB) costs 15 KB of reads, not
140 MB. Where the reads wait on the storage (a cold disk, a network file system), files are
scanned by several threads at once, which overlaps the waits (`pread` releases the GIL);
where they do not (files in the page cache), the scan is Python's work under the GIL, which
threads would only take turns at (1.1 us a record alone, 1.7-3 us with 2-16 threads on 2
cores), so one thread scans. `index_files` times its first files to tell which.

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
import time
from typing import NoReturn

import numpy as np

from phalanx._src.data.records import index_cache
from phalanx._src.data.records.tfrecord_io import DataLossError, masked_crc

_HEADER = struct.Struct("<QI")
SCAN_THREADS = 8  # files scanned at once when the reads wait: overlaps a storage's latency
_PROBE_S = 0.02  # the files scanned first, alone and timed, take about this long


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
    """`index_file` of every path, in order.

    The first files are scanned alone for about `_PROBE_S`, and timed: if their scan
    waited (its wall time more than twice its CPU time), the reads wait on the storage and
    the other files are scanned `SCAN_THREADS` at a time; if not, one at a time.
    """
    out: list[tuple[np.ndarray, np.ndarray]] = []
    wall = cpu = 0.0
    while len(out) < len(paths) and wall < _PROBE_S:
        began, began_cpu = time.perf_counter(), time.thread_time()
        out.append(index_file(paths[len(out)]))
        wall += time.perf_counter() - began
        cpu += time.thread_time() - began_cpu
    rest = paths[len(out) :]
    if len(rest) <= 1 or SCAN_THREADS <= 1 or wall <= 2 * cpu:
        return out + [index_file(path) for path in rest]
    workers = min(len(rest), SCAN_THREADS)
    with concurrent.futures.ThreadPoolExecutor(workers, "phalanx-index") as pool:
        return out + list(pool.map(index_file, rest))


def _lengths(offsets: np.ndarray, size: int) -> np.ndarray:
    """The data length of each record of a file of `size` bytes whose records start at
    `offsets` and fill it (each record is 16 bytes of framing around its data)."""
    ends = np.append(offsets[1:], size) if len(offsets) else offsets
    return ends - offsets - 16
