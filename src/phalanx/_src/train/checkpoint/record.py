"""A checkpoint's record: the JSON file naming its arrays, checked before anything is read.

The record names each array (its file is `<name>.bin`), its dtype, shape and CRC-32, and
carries the caller's JSON (`meta`: the layout, fit's position). It is written as compact
canonical JSON with a CRC-32 of its body as the last field, so a change to any of its bytes
is found: text that does not parse, text that is not what `encode` writes, or a body that
no longer matches its checksum. Array names become file names, so only letters, digits and
`_` are allowed: a record can never make a reader open a file outside its checkpoint.

Example:
  >>> data = encode({"p0": entry(np.zeros(3, np.float32))}, {"record": {"epoch": 1}})
  >>> entries, meta = decode(data, "runs/ckpt/7/phalanx-checkpoint.json")
  >>> entries["p0"].shape
  (3,)
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

FORMAT = 2  # 2: checksums (records without them are refused)
NAME = re.compile(r"[A-Za-z0-9_]{1,64}")  # array names become file names
_FIELDS = ["format", "arrays", "meta", "crc32"]


class CheckpointError(ValueError):
    """A checkpoint, or its folder, that cannot be used as it is: damaged files, a record
    that does not match its arrays or the model, or a folder another job or callback holds.
    Raised before anything is assigned to the model or written to the folder."""


class Entry(NamedTuple):
    """One array of a checkpoint, as its record describes it."""

    dtype: np.dtype
    shape: tuple[int, ...]
    crc32: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def check_name(name: Any, where: str | os.PathLike) -> str:
    """`name` if it is a safe array name (it becomes a file name), else CheckpointError."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise CheckpointError(
            f"checkpoint record {where} names an array {name!r}: array names may hold only "
            "letters, digits and '_' (no path separators, no '..'), so nothing outside the "
            "checkpoint is ever read; the record is damaged or was edited: restore another "
            "checkpoint, or delete this one"
        )
    return name


def entry(array: np.ndarray, crc32: int | None = None) -> dict[str, Any]:
    """The record's JSON for `array` (its CRC-32 computed unless given)."""
    if crc32 is None:
        crc32 = zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return {"dtype": str(array.dtype), "shape": list(array.shape), "crc32": crc32}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def encode(entries: dict[str, dict[str, Any]], meta: dict[str, Any]) -> bytes:
    """The record's bytes: `entries` (from `entry`) and `meta` (JSON values)."""
    body = {"format": FORMAT, "arrays": entries, "meta": meta}
    crc = zlib.crc32(_dumps(body).encode())
    return _dumps({**body, "crc32": crc}).encode()


def decode(data: bytes, where: str | os.PathLike) -> tuple[dict[str, Entry], dict[str, Any]]:
    """The arrays and the meta of the record `data` read from `where`.

    Raises:
      CheckpointError: naming `where`, when the bytes are not exactly what `encode` wrote.
    """
    try:
        text = data.decode("ascii")
        doc = json.loads(text)
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(
            f"checkpoint record {where} is not valid JSON ({error}); the file is damaged or "
            "was cut short: restore another checkpoint, or delete this one"
        ) from None
    if not isinstance(doc, dict) or list(doc) != _FIELDS:
        found = list(doc)[:6] if isinstance(doc, dict) else type(doc).__name__
        raise CheckpointError(
            f"checkpoint record {where} has fields {found}, expected {_FIELDS}: it was written "
            "by an older phalanx (without checksums) or edited; save it again with this "
            "version, or delete it"
        )
    crc = doc.pop("crc32")
    if _dumps({**doc, "crc32": crc}) != text or zlib.crc32(_dumps(doc).encode()) != crc:
        raise CheckpointError(
            f"checkpoint record {where} does not match its checksum: it was changed after it "
            "was written (damaged, or edited by hand); restore another checkpoint, or delete "
            "this one"
        )
    if doc["format"] != FORMAT or not isinstance(doc["arrays"], dict):
        raise CheckpointError(
            f"checkpoint record {where} is format {doc['format']!r}; this phalanx reads "
            f"format {FORMAT}: save it again with this version"
        )
    if not isinstance(doc["meta"], dict):
        raise CheckpointError(f"checkpoint record {where}: its meta is not a JSON object")
    entries = {check_name(name, where): _entry(name, e, where) for name, e in doc["arrays"].items()}
    return entries, doc["meta"]


def _entry(name: str, value: Any, where: str | os.PathLike) -> Entry:
    try:
        dtype = jnp.dtype(value["dtype"])
        shape = tuple(value["shape"])
        crc = value["crc32"]
        fine = (
            not dtype.hasobject
            and dtype.itemsize > 0
            and all(type(n) is int and n >= 0 for n in shape)
            and type(crc) is int
            and 0 <= crc < 2**32
        )
    except Exception:  # any value at all may stand there: whatever fails to parse is wrong
        fine = False
    if not fine:
        raise CheckpointError(
            f"checkpoint record {where}: array {name!r} is described as {value!r}; expected "
            "{'dtype': a dtype name, 'shape': [ints >= 0], 'crc32': an int}: the record is "
            "damaged or was edited; restore another checkpoint, or delete this one"
        )
    return Entry(dtype, shape, crc)
