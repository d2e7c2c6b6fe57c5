"""The on-disk cache of TFRecord indexes (`record_index`): one entry per record file.

Where: `$PHALANX_RECORD_INDEX_CACHE` when set (`0`, `off`, `false`, `no` or empty: no
cache), else `$XDG_CACHE_HOME/phalanx/records`, else `~/.cache/phalanx/records`; never
beside the data, whose folder may be read-only and whose `glob("train-*")` must not pick
up an index.

An entry is named by a hash of the file's real path and holds that path, the file's size
and modification time (ns) when it was scanned, the record offsets, and a CRC-32C of all
of it. It serves only a file with the same path, size and mtime; a damaged, partly written
or foreign entry is ignored (the file is scanned again and the entry rewritten). Entries
are written to a temporary name and renamed into place, so a reader never sees half of
one. A cache that cannot be written (a read-only home) only costs the next run a scan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import struct
import threading
from pathlib import Path

import google_crc32c
import numpy as np

ENV = "PHALANX_RECORD_INDEX_CACHE"
_OFF = {"", "0", "off", "false", "no", "none"}
_MAGIC = b"PHXRIDX1"
_HEAD = struct.Struct("<8sQqQI")  # magic, file size, mtime (ns), record count, path bytes
_CRC = struct.Struct("<I")
_log = logging.getLogger("phalanx.data")
_warned: list[bool] = []  # a cache that cannot be written is said once per process


def directory() -> Path | None:
    """The cache folder (see the module doc), or None when the cache is off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phalanx" / "records"


@dataclasses.dataclass(frozen=True)
class Key:
    """What an entry must match: the file's real path, size and mtime; and the entry."""

    path: str
    size: int
    mtime_ns: int
    entry: Path


def key(path: str) -> Key | None:
    """The cache key of record file `path`, or None (no cache, or no such file: the scan
    then says so)."""
    folder = directory()
    if folder is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    real = os.path.realpath(path)
    name = hashlib.sha256(real.encode()).hexdigest()[:40] + ".idx"
    return Key(real, stat.st_size, stat.st_mtime_ns, folder / name)


def _encode(key: Key, offsets: np.ndarray) -> bytes:
    path = key.path.encode()
    body = b"".join(
        (
            _HEAD.pack(_MAGIC, key.size, key.mtime_ns, len(offsets), len(path)),
            path,
            offsets.astype("<i8").tobytes(),
        )
    )
    return body + _CRC.pack(google_crc32c.value(body))


def load(key: Key) -> np.ndarray | None:
    """The offsets cached for `key`, or None when no sound entry matches it."""
    try:
        blob = key.entry.read_bytes()
    except OSError:
        return None
    if len(blob) < _HEAD.size + _CRC.size:
        return None
    body, (crc,) = blob[: -_CRC.size], _CRC.unpack(blob[-_CRC.size :])
    if google_crc32c.value(body) != crc:
        return None
    magic, size, mtime_ns, count, path_bytes = _HEAD.unpack_from(body)
    path = body[_HEAD.size : _HEAD.size + path_bytes]
    start = _HEAD.size + path_bytes
    if (magic, size, mtime_ns, path) != (_MAGIC, key.size, key.mtime_ns, key.path.encode()):
        return None
    if len(body) != start + 8 * count:
        return None
    return np.frombuffer(body, "<i8", count, start).astype(np.int64)


def store(key: Key, offsets: np.ndarray) -> None:
    """Writes the entry of `key` (atomically); a failure is logged once, not raised."""
    temporary = key.entry.with_name(f"{key.entry.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        key.entry.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(_encode(key, offsets))
        os.replace(temporary, key.entry)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        if not _warned:
            _warned.append(True)
            _log.warning(
                "record indexes cannot be cached in %s (%s); each run scans the files' "
                "headers again. Set %s to a writable folder (or 0 to turn the cache off)",
                key.entry.parent,
                error,
                ENV,
            )
