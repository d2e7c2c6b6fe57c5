"""Reads a published saved dataset with random access: one `pread` per element.

The index (`index.bin`) says where every element's record lies, so opening a saved dataset
reads two small files and no shard, and any element is one read away: `shuffle`,
`process_split` and an iterator's exact resume work as over in-memory arrays. Every read
checks the record's two checksums (TFRecord's masked CRC-32C).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import threading
from typing import Any

import jax
import numpy as np

from phalanx._src.data.options import TensorSpec
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.records.tfrecord_io import DataLossError, masked_crc
from phalanx._src.data.saved import codec
from phalanx._src.data.saved.writer import INDEX, META

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


def read_meta(path: str) -> dict:
    """The metadata of the saved dataset at `path`, its shards checked against it.

    Raises:
      FileNotFoundError: nothing published at `path` (a partial save is named).
      DataLossError: a shard is missing or shorter than the metadata says.
      ValueError: a file that is not a saved dataset, or a newer format version.
    """
    try:
        with open(os.path.join(path, META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        partial = path + ".partial"
        hint = (
            f"; {partial!r} holds an unfinished save: finish it by calling save() again "
            "with the same pipeline and checkpoint_args"
            if os.path.isdir(partial)
            else ""
        )
        raise FileNotFoundError(f"no saved dataset at {path!r}{hint}") from None
    except ValueError:
        raise ValueError(
            f"{os.path.join(path, META)!r} is not a saved dataset's metadata"
        ) from None
    if meta.get("format") != codec.FORMAT or meta.get("version", 0) > codec.VERSION:
        raise ValueError(
            f"{path!r} holds format {meta.get('format')!r} version {meta.get('version')!r}; "
            f"this phalanx reads {codec.FORMAT!r} up to version {codec.VERSION}"
        )
    for file in meta["files"]:
        shard = os.path.join(path, file["name"])
        size = os.path.getsize(shard) if os.path.isfile(shard) else -1
        if size < file["bytes"]:
            raise DataLossError(
                f"the saved dataset at {path!r} is damaged: {file['name']} has "
                f"{max(size, 0)} bytes, its metadata {file['bytes']}; save it again"
            )
    return meta


@dataclasses.dataclass(eq=False)
class Saved(Node):
    """The elements of the saved dataset at `path`, in the order they were saved.

    Elements of one shape are stacked (level 0); a leaf whose shapes differ between the
    elements asked for together comes back as an object array of arrays, as a ragged
    column is held on the host.
    """

    path: str
    treedef: Any = None  # the element structure (None: the saved one)
    _meta: Any = dataclasses.field(default=None, init=False, repr=False)
    _index: Any = dataclasses.field(default=None, init=False, repr=False)
    _fds: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __getstate__(self) -> dict:
        return {"path": self.path, "treedef": self.treedef}  # a worker opens its own files

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _load(self) -> tuple[dict, np.ndarray]:
        if self._index is None:
            meta = read_meta(self.path)
            index = np.fromfile(os.path.join(self.path, INDEX), "<i8")
            if len(index) != 3 * meta["count"]:
                raise DataLossError(f"the index of the saved dataset at {self.path!r} is damaged")
            if self.treedef is None and meta["structure"] is not None:
                self.treedef = codec.treedef(meta["structure"])
            self._specs = codec.specs_of_json(meta["leaves"] or [])
            self._meta, self._index = meta, index.reshape(-1, 3)
        return self._meta, self._index

    @property
    def level(self) -> int:  # type: ignore[override]
        return int(self._load()[0]["level"])

    @property
    def length(self) -> int:
        return int(self._load()[0]["count"])

    @property
    def output_signature(self) -> Any:
        """The element spec recorded at save time (`Dataset.element_spec` returns it)."""
        meta = self._load()[0]
        if meta["leaves"] is None:
            return None
        specs = codec.specs_of_json(meta["leaves"])
        if meta["level"] == 1:  # batches: the first dimension is the batch's, as tf.data
            specs = [TensorSpec((None, *s.shape[1:]), s.dtype) for s in specs]
        return self.treedef.unflatten(specs)

    def content_id(self) -> str:
        """What identifies the saved elements (for a fingerprint of a pipeline over them)."""
        meta = self._load()[0]
        return f"saved {meta['fingerprint']} {meta['count']} {meta['files']}"

    def _fd(self, file: int) -> int:
        with self._lock:
            fd = self._fds.get(file)
            if fd is None:
                name = self._meta["files"][file]["name"]
                fd = self._fds[file] = os.open(os.path.join(self.path, name), os.O_RDONLY)
            return fd

    def record(self, position: int) -> Any:
        """The checked, decompressed record of element `position`, writable (the arrays
        decoded from it are views, writable as the pipeline's are)."""
        meta, index = self._load()
        file, offset, length = (int(v) for v in index[position])
        frame = bytearray(length + 16)
        got = os.preadv(self._fd(file), [frame], offset)
        data = bytes(memoryview(frame)[12:-4])  # a copy: the CRC binding reads only bytes
        if (
            got != len(frame)
            or _HEADER.unpack_from(frame) != (length, masked_crc(bytes(frame[:8])))
            or _CRC.unpack_from(frame, 12 + length)[0] != masked_crc(data)
        ):
            raise DataLossError(
                f"corrupted record at byte offset {offset} in "
                f"{os.path.join(self.path, meta['files'][file]['name'])!r}: a checksum or "
                "length does not match; the saved dataset is damaged, save it again"
            )
        if meta["compression"]:
            return bytearray(codec.decompress(data, meta["compression"]))
        return memoryview(frame)[12:-4]

    def element(self, position: int) -> Any:
        """Element `position` (its arrays are views of its own record)."""
        record = self.record(position)
        if codec.position_of(record) != position:
            raise DataLossError(f"the index of the saved dataset at {self.path!r} is damaged")
        return self.treedef.unflatten(codec.decode(record, [s.dtype for s in self._specs]))

    def get(self, key: Key, positions: np.ndarray) -> Any:
        elements = [self.element(int(p)) for p in positions]
        if self.level == 1:
            return elements
        rows = [self.treedef.flatten_up_to(e) for e in elements]
        columns = [_stack([row[i] for row in rows], spec) for i, spec in enumerate(self._specs)]
        return self.treedef.unflatten(columns)

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)


def _stack(values: list[Any], spec: TensorSpec) -> np.ndarray:
    """One leaf of several elements as one array (see `Saved`)."""
    if not values:
        return np.zeros((0, *(d or 0 for d in spec.shape)), spec.dtype)
    if spec.dtype.kind != "O" and len({v.shape for v in values}) == 1:
        return np.stack(values)
    out = np.empty(len(values), object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def element_treedef(element_spec: Any, meta: dict, path: str) -> Any:
    """The structure `Dataset.load(element_spec=...)` gives the elements, checked against
    what was saved.

    Raises:
      ValueError: a spec whose leaves or dtypes do not match the saved elements'.
    """
    specs, treedef = jax.tree.flatten(element_spec, is_leaf=lambda s: isinstance(s, TensorSpec))
    saved = codec.specs_of_json(meta["leaves"] or [])
    if len(specs) != len(saved) or not all(
        isinstance(s, TensorSpec) and s.dtype == t.dtype for s, t in zip(specs, saved, strict=True)
    ):
        raise ValueError(
            f"element_spec {element_spec!r} does not match the dataset saved at {path!r}, "
            f"whose leaves are {[(s.dtype.name, s.shape) for s in saved]}; pass element_spec="
            "None to use the saved structure"
        )
    return treedef
