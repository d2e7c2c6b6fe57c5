"""`ArrayRecordDataset`: ArrayRecord files (Grain's format) as a random-access source.

ArrayRecord files index their records, so the source is a random-access node of the plan
(see `plan`): `shuffle` is an exact global permutation per epoch from its seed, an
iterator's position is (epoch, step) and restores exactly, and `process_split` makes each
process read only the records of its rows of every global batch. Records are read with
`array_record`'s data source (the one Grain's `ArrayRecordDataSource` is).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from phalanx._src.data.dataset import Dataset
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.records import fingerprint
from phalanx._src.data.records.tfrecord_dataset import file_names

_MANY = 64  # records per read from which the data source's parallel read pays


def _open(paths: tuple[str, ...]) -> Any:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"ArrayRecord files not found: {missing}")
    return ArrayRecordDataSource(list(paths))


@dataclasses.dataclass(eq=False)
class ArrayRecordSource(Node):
    """The records of ArrayRecord files, in file order; `get` reads the asked positions."""

    paths: tuple[str, ...]
    _source: Any = dataclasses.field(default=None, repr=False)

    level = 0

    def __post_init__(self) -> None:
        if self._source is None:
            self._source = _open(self.paths)  # now, so a bad path fails at construction

    def __getstate__(self) -> dict:
        return {"paths": self.paths}  # a worker process opens its own readers

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["paths"])

    @property
    def length(self) -> int:
        return len(self._source)

    def order_state(self) -> dict:
        """What decides the records' numbering (the files), for iterator states; a restore
        over other files is an error naming the difference (see `fingerprint`)."""
        state = self.__dict__.get("_order_state")
        if state is None:
            state = fingerprint.order_state(self.paths, "ArrayRecord", None, 1)
            self.__dict__["_order_state"] = state
        return state

    def restore_order(self, saved: Any) -> Node:
        fingerprint.restore(self.order_state(), saved, auto=False)
        return self

    def get(self, key: Key, positions: np.ndarray) -> Any:
        keys = [int(p) for p in positions]
        if len(keys) < _MANY:  # __getitems__ starts a thread pool per call: ~0.4 ms
            records = [self._source[k] for k in keys]
        else:  # many records: read from several files at once
            records = self._source.__getitems__(keys)
        out = np.empty(len(records), object)
        out[:] = list(records)
        return out


def ArrayRecordDataset(paths: Any) -> Dataset:
    """The records of ArrayRecord files, each a `bytes` element, with random access.

    `shuffle(...)` is an exact global shuffle (a permutation of every record per epoch,
    reproducible from the seed), the iterator resumes exactly by index, and in a
    multi-process job each process reads only its rows of every global batch.

    Args:
      paths: a path, a list of paths, or a Dataset of paths (read once, now); the records
        are numbered file after file, in this order.

    Returns:
      A random-access `Dataset` of `bytes`.

    Raises:
      FileNotFoundError: a missing file, naming it.

    Example:
      >>> ds = ArrayRecordDataset(sorted(glob.glob("/data/train-*.array_record")))
      >>> ds = ds.shuffle(len(ds), seed=0).map(parse).batch(256)
    """
    return Dataset(ArrayRecordSource(file_names(paths)))
