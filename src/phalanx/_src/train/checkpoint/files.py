"""Checkpoints as plain files: what one process writes when it holds the whole state.

A single-process save is a few packed vectors (`checkpoint_layout`). Orbax spends ~30 ms of
CPU on each such save (orbax-checkpoint 0.12.8: event loops, threads, TensorStore, metadata
files), more than a small model's 20 steps on a busy 2-core host; writing the same bytes
with NumPy takes ~1 ms (`benchmarks/bench_checkpoint.py`, issue 8). So one process writes
each array's raw bytes, then a record naming their dtypes, shapes and CRC-32s (`record`),
into a temporary directory, syncs them to disk, and renames the directory to the step
number: a kill or a full disk at any point leaves either the whole checkpoint or a directory
whose name says it is temporary. Reading checks every byte against the record before it
hands anything out, and a damaged checkpoint raises `CheckpointError` naming its file.
Several processes write with Orbax (each its own shards, one commit); both formats sit in
the same numbered directories and either restores on any process and device count.

Only what phalanx wrote counts: a numbered directory is a checkpoint when it holds a phalanx
record, arrays of one, or Orbax's step metadata, so a folder's other contents are never
listed, restored or deleted.

Example:
  >>> files = Files("runs/ckpt")
  >>> files.write(7, {"p0": np.zeros(3, np.float32)}, {"record": {"epoch": 1}})
  >>> arrays, meta = files.read(7)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from phalanx._src.train.checkpoint.record import NAME, CheckpointError, decode, encode, entry

RECORD = "phalanx-checkpoint.json"
ORBAX_STEP = "_CHECKPOINT_METADATA"  # what Orbax writes into each step it commits
_TMP = ".phalanx-tmp-"
_OLD = ".phalanx-old-"
# Directories an interrupted save leaves behind: ours (`7.phalanx-tmp-<pid>`, a replaced
# `7.phalanx-old-<pid>`) and Orbax's (`7.orbax-checkpoint-tmp-<time>`).
_LEFTOVER = re.compile(r"\d+(\.phalanx-(tmp|old)-\d+|\.orbax-checkpoint-tmp-.*)")


class Files:
    """Numbered checkpoint directories under `directory`, in either format.

    Raises:
      CheckpointError: when `directory` exists and is not a folder.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(
                f"the checkpoint folder {str(self.directory)!r} is a file, not a folder; pass "
                "the path of a folder (created if missing) that holds only checkpoints, e.g. "
                f"{str(self.directory.parent / 'checkpoints')!r}"
            )

    def prepare(self) -> None:
        """Creates the folder if it is missing.

        Raises:
          OSError: of the underlying kind (PermissionError, NotADirectoryError...), naming
            the folder, when it cannot be created.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _named(error, f"cannot create the checkpoint folder {self.directory}") from error

    def steps(self) -> list[int]:
        """Every complete checkpoint's number, oldest first (temporary directories of an
        interrupted save, ours or Orbax's, and numbered folders phalanx did not write do not
        count)."""
        try:
            names = [p.name for p in self.directory.iterdir() if p.name.isdigit()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(name) for name in names if self._is_checkpoint(self.directory / name))

    def _is_checkpoint(self, path: Path) -> bool:
        if (path / RECORD).is_file() or (path / ORBAX_STEP).is_file():
            return True
        # One of ours whose record was lost: listed, so that reading it says so.
        return path.is_dir() and any(p.suffix == ".bin" for p in path.iterdir())

    def is_ours(self, step: int) -> bool:
        """Whether checkpoint `step` was written here (else by Orbax)."""
        where = self.directory / str(step)
        return (where / RECORD).is_file() or not (where / ORBAX_STEP).is_file()

    def write(self, step: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Writes checkpoint `step` atomically (replacing one of the same number).

        Raises:
          OSError: of the underlying kind (a full disk: errno ENOSPC), naming the folder;
            nothing of the new checkpoint is left, and the others are untouched.
          CheckpointError: when a folder named `step` is there and is not a checkpoint.
        """
        tmp = self.directory / f"{step}{_TMP}{os.getpid()}"
        final = self.directory / str(step)
        if final.exists() and not self._is_checkpoint(final):
            raise CheckpointError(
                f"cannot save checkpoint {step}: {final} exists and is not a checkpoint, and "
                "phalanx replaces only its own; move it away, or save into a folder of its own"
            )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            entries = {}
            for name, array in arrays.items():
                if not isinstance(name, str) or not NAME.fullmatch(name):
                    raise CheckpointError(
                        f"cannot save an array named {name!r} in checkpoint {step}: names "
                        "become file names, so only letters, digits and '_' are allowed"
                    )
                # The array's own buffer, no copy: the write releases the interpreter meanwhile.
                data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                _write(tmp / f"{name}.bin", data)
                entries[name] = entry(array, zlib.crc32(data))
            _write(tmp / RECORD, encode(entries, meta))
            _sync(tmp)
            self._publish(tmp, step)
        except BaseException as error:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(error, OSError):
                raise
            raise _named(
                error,
                f"could not write checkpoint {step} into {self.directory}",
                "; nothing of it was kept and the checkpoints already there are unchanged: "
                "free some space (or fix the folder's permissions), or save elsewhere",
            ) from error

    def _publish(self, tmp: Path, step: int) -> None:
        """Renames the complete `tmp` to `step`; one of that number is set aside first and
        put back if the rename fails."""
        final = self.directory / str(step)
        old = self.directory / f"{step}{_OLD}{os.getpid()}"
        replacing = final.exists()
        if replacing:
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except OSError:
            if replacing:
                os.rename(old, final)
            raise
        _sync(self.directory)
        if replacing:
            shutil.rmtree(old, ignore_errors=True)

    def read_meta(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The array entries and the meta of checkpoint `step`'s record (checked).

        Raises:
          CheckpointError: naming the file, when the record is missing or damaged.
        """
        where = self.directory / str(step)
        try:
            data = (where / RECORD).read_bytes()
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {where} has no record {RECORD}: it is damaged (or not a phalanx "
                "checkpoint); restore another step, or delete it"
            ) from None
        except OSError as error:
            raise CheckpointError(
                f"cannot read checkpoint record {where / RECORD} ({error.strerror or error})"
            ) from error
        return decode(data, where / RECORD)

    def read(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The arrays and the meta of checkpoint `step`, every byte checked against its record.

        Raises:
          CheckpointError: naming the file, when a file is missing, cut short or damaged.
        """
        entries, meta = self.read_meta(step)
        where = self.directory / str(step)
        arrays = {}
        for name, e in entries.items():
            path = where / f"{name}.bin"
            try:
                data = path.read_bytes()
            except OSError as error:
                raise CheckpointError(
                    f"cannot read checkpoint array {path} ({error.strerror or error}); the "
                    "checkpoint is incomplete: restore another step, or delete it"
                ) from error
            if len(data) != e.nbytes:
                raise CheckpointError(
                    f"checkpoint array {path} holds {len(data)} bytes, but its record says "
                    f"{e.dtype.name}{list(e.shape)}: {e.nbytes} bytes; the file was cut short "
                    "or replaced: restore another step, or delete this checkpoint"
                )
            if zlib.crc32(data) != e.crc32:
                raise CheckpointError(
                    f"checkpoint array {path} does not match its checksum (CRC-32 "
                    f"{zlib.crc32(data):#010x}, recorded {e.crc32:#010x}): its bytes were damaged "
                    "after the save; restore another step, or delete this checkpoint"
                )
            arrays[name] = np.frombuffer(data, e.dtype).reshape(e.shape)
        return arrays, meta

    def delete(self, step: int) -> None:
        shutil.rmtree(self.directory / str(step), ignore_errors=True)

    def delete_leftovers(self) -> None:
        """Removes the temporary directories of interrupted saves (call it while no save
        into this folder can be in progress)."""
        with contextlib.suppress(FileNotFoundError):
            for path in self.directory.iterdir():
                if _LEFTOVER.fullmatch(path.name) and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)


def _named(error: OSError, what: str, advice: str = "") -> OSError:
    """An error of `error`'s kind (OSError picks the subclass from the errno): `what` went
    wrong, what the system said, and `advice`."""
    message = f"{what} ({error.strerror or error}){advice}"
    return OSError(message) if error.errno is None else OSError(error.errno, message)


def to_host(arrays: dict[str, jax.Array]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays' values on the host (waits for them), PRNG keys as their key data; and the
    key implementation of each key array, by name."""
    host, keys = {}, {}
    for name, array in arrays.items():
        if jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key):
            keys[name] = str(jax.random.key_impl(array))
            array = jax.random.key_data(array)
        host[name] = np.asarray(array)
    return host, keys


def to_devices(
    host: dict[str, np.ndarray], keys: dict[str, str], wanted: dict[str, jax.ShapeDtypeStruct]
) -> dict[str, jax.Array]:
    """The stored arrays placed as `wanted` says (each process takes its shards)."""
    out = {}
    for name, spec in wanted.items():
        data = host[name]
        sharding = spec.sharding
        if name in keys:  # key data carries the key's shape plus the implementation's own
            placed = jax.make_array_from_callback(
                data.shape, _with_rank(sharding, data.ndim), lambda index, d=data: d[index]
            )
            out[name] = jax.random.wrap_key_data(placed, impl=keys[name])
        else:
            out[name] = jax.make_array_from_callback(
                data.shape, sharding, lambda index, d=data: d[index]
            )
    return out


def _with_rank(sharding: Any, ndim: int) -> Any:
    """`sharding` for an array of `ndim` dimensions (key data has trailing ones)."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return sharding
    return NamedSharding(sharding.mesh, PartitionSpec(*spec, *[None] * (ndim - len(spec))))


def _write(path: Path, data: bytes | np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
