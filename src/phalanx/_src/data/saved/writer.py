"""Writes a saved dataset: a partial directory that checkpoints resume, published by a rename.

Elements are appended, in whatever order they come, to TFRecord shards in `<path>.partial`,
each record carrying its position; the writer remembers where each went. A checkpoint
flushes the shards, appends the new (position, file, offset, length) entries to
`positions.bin` and replaces `checkpoint.json` (the shards' committed sizes, the element
structure so far and the caller's `extra`, e.g. an iterator state). A writer that resumes
cuts every shard back to its committed size, so a kill at any moment loses at most the
elements since the last checkpoint, and continues in new shard files. `publish` writes the
index and `dataset.json` (format: `codec`) and renames the partial directory to `<path>`:
until that rename nothing at `<path>` is new, so a half-written dataset is never read as a
complete one. A lock file (`flock`) keeps a second writer, in this process or another, out
of a partial directory in use.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import shutil
from typing import Any

import jax
import numpy as np

from phalanx._src.data.records.tfrecord_io import TFRecordWriter
from phalanx._src.data.saved import codec

SHARD_BYTES = 256 << 20  # a new shard file after this many bytes (without shard_func)
_CHECKPOINT = "checkpoint.json"
_POSITIONS = "positions.bin"  # int64 rows (position, file, offset, length)
_LOCK = ".lock"
META = "dataset.json"
INDEX = "index.bin"


class Busy(RuntimeError):
    """Another writer holds the partial directory."""


def is_saved(path: str) -> bool:
    """Whether `path` holds a published saved dataset."""
    try:
        with open(os.path.join(path, META)) as f:
            return json.load(f).get("format") == codec.FORMAT
    except (OSError, ValueError):
        return False


def check_target(path: str) -> None:
    """Refuses, before anything is computed, a `path` that a publish would clobber."""
    if os.path.isdir(path) and (is_saved(path) or not os.listdir(path)):
        return
    if os.path.exists(path):
        raise FileExistsError(
            f"{path!r} exists and is not a saved dataset; save replaces only an earlier "
            "saved dataset (or an empty directory): choose another path or remove it"
        )


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Writer:
    """Appends elements to `<final>.partial`; `checkpoint`, then `publish` to `final`.

    Args:
      final: the directory the dataset is published to.
      fingerprint: the pipeline's; a checkpoint of another pipeline is never resumed.
      compression: "", "GZIP" or "ZLIB" (each record compressed on its own).
      resume: continue from the partial directory's checkpoint (else start afresh).

    Raises:
      Busy: another writer uses the partial directory.
    """

    def __init__(self, final: str, fingerprint: str, compression: str, resume: bool) -> None:
        self.final, self.partial = final, final + ".partial"
        self.fingerprint, self.compression = fingerprint, compression
        os.makedirs(self.partial, exist_ok=True)
        self._lock: int | None = os.open(os.path.join(self.partial, _LOCK), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            self._lock = None
            raise Busy(f"another writer (this process or another) is writing {final!r}") from None
        self.files: list[list[Any]] = []  # [name, committed bytes] for every file
        self._open: dict[int, TFRecordWriter] = {}  # this session's files, by number
        self._ends: dict[int, int] = {}  # file number -> end of its last whole record
        self._keys: dict[Any, int] = {}  # shard key -> this session's file for it
        self._entries = array.array("q")  # (position, file, offset, length) per element
        self._committed = 0  # entries already in positions.bin
        self._written = bytearray()  # 1 at every position written
        self.structure: Any = None
        self.specs: list | None = None
        self.extra: Any = None  # the caller's data from the resumed checkpoint
        self._treedef: Any = None
        self._names: list[str] = []
        if not (resume and self._resume()):
            self._clear()

    # -- starting --------------------------------------------------------------------------

    def _clear(self) -> None:
        for name in os.listdir(self.partial):
            if name != _LOCK:
                path = os.path.join(self.partial, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def _resume(self) -> bool:
        """Loads the partial directory's checkpoint; False when there is none to resume."""
        try:
            with open(os.path.join(self.partial, _CHECKPOINT)) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return False
        if (saved.get("format"), saved.get("fingerprint"), saved.get("compression")) != (
            codec.FORMAT,
            self.fingerprint,
            self.compression,
        ):
            return False  # another pipeline's (or format's) partial data: start afresh
        names = {name for name, _ in saved["files"]} | {_LOCK, _CHECKPOINT, _POSITIONS}
        for name, size in saved["files"]:
            path = os.path.join(self.partial, name)
            if not os.path.isfile(path) or os.path.getsize(path) < size:
                return False  # a shard lost data a checkpoint counted on: start afresh
            os.truncate(path, size)
        for name in set(os.listdir(self.partial)) - names:
            os.remove(os.path.join(self.partial, name))  # shards begun after the checkpoint
        count = int(saved["entries"])
        positions = os.path.join(self.partial, _POSITIONS)
        try:
            os.truncate(positions, count * 32)
            with open(positions, "rb") as f:
                self._entries.fromfile(f, count * 4)
        except (OSError, EOFError):
            return False  # the entries a checkpoint counted on are gone: start afresh
        self.files = [list(f) for f in saved["files"]]
        self._committed = count
        for position in self._entries[0::4]:
            self._mark(position)
        leaves = saved["leaves"]
        self._start(saved["structure"], None if leaves is None else codec.specs_of_json(leaves))
        self.extra = saved.get("extra")
        return True

    def _start(self, structure: Any, specs: list | None) -> None:
        self.structure, self.specs = structure, specs
        if structure is not None:
            self._treedef = codec.treedef(structure)
            skeleton = self._treedef.unflatten(range(self._treedef.num_leaves))
            paths = jax.tree_util.tree_flatten_with_path(skeleton)[0]
            self._names = [jax.tree_util.keystr(p) or "(the element)" for p, _ in paths]

    # -- writing ---------------------------------------------------------------------------

    def _mark(self, position: int) -> None:
        if position >= len(self._written):
            self._written.extend(bytes(max(position + 1 - len(self._written), 1024)))
        self._written[position] = 1

    def has(self, position: int) -> bool:
        return position < len(self._written) and self._written[position] == 1

    @property
    def count(self) -> int:
        """The number of elements written."""
        return len(self._entries) // 4

    def add(self, position: int, element: Any, key: Any = None) -> bool:
        """Writes `element` as the one at `position` (False: that position is written).

        `key` chooses the shard (`shard_func`'s value); None fills files one after another.

        Raises:
          ValueError, TypeError: an element this format cannot hold, or one whose
            structure, dtypes or ranks differ from the earlier elements'.
        """
        if self.has(position):
            return False
        if self._treedef is None:
            description = codec.structure(element)
            self._start(description, None)
            if self._treedef != jax.tree.structure(element):
                raise TypeError(
                    f"cannot save elements structured as {jax.tree.structure(element)}: save "
                    "keeps tuples, lists, dicts (str keys), namedtuples and None"
                )
        leaves, treedef = jax.tree.flatten(element)
        if treedef != self._treedef:
            raise ValueError(
                f"element {position} is structured as {treedef}, the earlier ones as "
                f"{self._treedef}; every element of a dataset has one structure"
            )
        arrays = [codec.leaf_array(leaf) for leaf in leaves]
        specs = self.specs or [None] * len(arrays)
        self.specs = [
            codec.merge_spec(s, a, n) for s, a, n in zip(specs, arrays, self._names, strict=True)
        ]
        record = codec.compress(codec.encode(position, arrays), self.compression)
        number = self._file_for(key, len(record))
        offset = self._ends[number]
        self._open[number].write(record)
        self._ends[number] = offset + 16 + len(record)
        self._entries.extend((position, number, offset, len(record)))
        self._mark(position)
        return True

    def _file_for(self, key: Any, size: int) -> int:
        number = self._keys.get(key)
        if number is not None and not (key is None and self._ends[number] + size > SHARD_BYTES):
            return number
        if number is not None:
            self._open.pop(number).close()  # a full rolling file
        number = len(self.files)
        name = f"shard-{number:05d}.tfrecord"
        self.files.append([name, 0])
        self._open[number] = TFRecordWriter(os.path.join(self.partial, name))
        self._ends[number] = 0
        self._keys[key] = number
        return number

    def checkpoint(self, extra: Any = None) -> None:
        """Makes everything written so far survive a kill; `extra` (JSON) comes back as
        `self.extra` to the writer that resumes."""
        for number, file in self._open.items():
            file.flush()
            self.files[number][1] = self._ends[number]
        with open(os.path.join(self.partial, _POSITIONS), "ab") as f:
            self._entries[self._committed * 4 :].tofile(f)
        self._committed = self.count
        state = {
            "format": codec.FORMAT,
            "fingerprint": self.fingerprint,
            "compression": self.compression,
            "files": self.files,
            "entries": self._committed,
            "structure": self.structure,
            "leaves": None if self.specs is None else codec.spec_json(self.specs),
            "extra": extra,
        }
        temporary = os.path.join(self.partial, _CHECKPOINT + ".tmp")
        with open(temporary, "w") as f:
            json.dump(state, f)
        os.replace(temporary, os.path.join(self.partial, _CHECKPOINT))

    # -- publishing --------------------------------------------------------------------------

    def publish(self, count: int, level: int) -> None:
        """Writes the index and metadata and renames the directory to `final`.

        Raises:
          RuntimeError: the positions written are not exactly 0 .. count - 1.
        """
        for number, file in self._open.items():
            file.close()
            self.files[number][1] = self._ends[number]
        self._open.clear()
        entries = np.frombuffer(self._entries, np.int64).reshape(-1, 4)
        if len(entries) != count or (count and int(entries[:, 0].max()) != count - 1):
            raise RuntimeError(
                f"a saved dataset of {count} elements holds {len(entries)} elements at "
                f"positions up to {int(entries[:, 0].max()) if len(entries) else None}"
            )
        records = np.bincount(entries[:, 1], minlength=len(self.files))
        index = np.zeros((count, 3), "<i8")
        index[entries[:, 0]] = entries[:, 1:]
        files = [
            {"name": name, "bytes": size, "records": int(n)}
            for (name, size), n in zip(self.files, records, strict=True)
        ]
        for name in (_CHECKPOINT, _POSITIONS):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.partial, name))
        index.tofile(os.path.join(self.partial, INDEX))
        meta = {
            "format": codec.FORMAT,
            "version": codec.VERSION,
            "count": count,
            "level": level,
            "compression": self.compression,
            "structure": self.structure,
            "leaves": None if self.specs is None else codec.spec_json(self.specs),
            "files": files,
            "fingerprint": self.fingerprint,
        }
        with open(os.path.join(self.partial, META), "w") as f:
            json.dump(meta, f, indent=1)
        for name in os.listdir(self.partial):
            _fsync(os.path.join(self.partial, name))
        _fsync(self.partial)
        old = None
        if os.path.exists(self.final):
            check_target(self.final)
            old = f"{self.final}.old-{os.getpid()}"
            os.rename(self.final, old)
        os.rename(self.partial, self.final)
        _fsync(os.path.dirname(os.path.abspath(self.final)))
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.close()

    def close(self) -> None:
        """Closes the files and releases the directory (what was not checkpointed is lost)."""
        for file in self._open.values():
            with contextlib.suppress(OSError):
                file.close()
        self._open.clear()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __del__(self) -> None:
        if getattr(self, "_lock", None) is not None:
            self.close()
