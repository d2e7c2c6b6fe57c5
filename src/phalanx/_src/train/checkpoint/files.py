"""Checkpoints as plain files: what one process writes when it holds the whole state.

A single-process save is a few packed vectors (`checkpoint_layout`). Orbax spends ~30 ms of
CPU on each such save (orbax-checkpoint 0.12.8: event loops, threads, TensorStore, metadata
files), more than a small model's 20 steps on a busy 2-core host; writing the same bytes
with NumPy takes ~1 ms (`benchmarks/bench_checkpoint.py`, issue 8). So one process writes
each array's raw bytes, then a JSON record naming their dtypes and shapes, into a temporary
directory, syncs them to disk, and renames the directory to the step number: a kill at any
point leaves either the whole checkpoint or a directory whose name says it is temporary.
Several processes write with Orbax (each its own shards, one commit); both formats sit in
the same numbered directories and either restores on any process and device count.

Example:
  >>> files = Files("runs/ckpt")
  >>> files.write(7, {"p0": np.zeros(3, np.float32)}, {"record": {"epoch": 1}})
  >>> arrays, meta = files.read(7)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

RECORD = "phalanx-checkpoint.json"
_TMP = ".phalanx-tmp-"


class Files:
    """Numbered checkpoint directories under `directory`, in either format."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def steps(self) -> list[int]:
        """Every complete checkpoint's number, oldest first (temporary directories of an
        interrupted save, ours or Orbax's, do not count)."""
        return sorted(
            int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and p.is_dir()
        )

    def is_ours(self, step: int) -> bool:
        """Whether checkpoint `step` was written here (else by Orbax)."""
        return (self.directory / str(step) / RECORD).is_file()

    def write(self, step: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Writes checkpoint `step` atomically (replacing one of the same number)."""
        tmp = self.directory / f"{step}{_TMP}{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        entries = {}
        for name, array in arrays.items():
            # The array's own buffer, no copy: the write releases the interpreter meanwhile.
            _write(tmp / f"{name}.bin", np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            entries[name] = {"dtype": str(array.dtype), "shape": list(array.shape)}
        _write(tmp / RECORD, json.dumps({"arrays": entries, "meta": meta}).encode())
        _sync(tmp)
        final = self.directory / str(step)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _sync(self.directory)

    def read(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The arrays and the JSON record of checkpoint `step`."""
        where = self.directory / str(step)
        record = json.loads((where / RECORD).read_text())
        arrays = {}
        for name, entry in record["arrays"].items():
            data = np.frombuffer((where / f"{name}.bin").read_bytes(), jnp.dtype(entry["dtype"]))
            arrays[name] = data.reshape(entry["shape"])
        return arrays, record["meta"]

    def delete(self, step: int) -> None:
        shutil.rmtree(self.directory / str(step), ignore_errors=True)


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
