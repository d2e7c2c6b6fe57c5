"""`TFRecordDataset`: the records of TFRecord files as a Dataset of `bytes`.

The reading, the iterator state and the sharding over processes are the `RecordFiles`
node's (`record_files`); this module checks the arguments tf.data's TFRecordDataset takes
and builds the node.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np

from phalanx._src.data import executors
from phalanx._src.data.dataset import Dataset
from phalanx._src.data.records.record_files import RecordFiles
from phalanx._src.data.records.tfrecord_io import compression


def file_names(filenames: Any) -> tuple[str, ...]:
    """`filenames` (a path, a list or array of paths, or a Dataset of them) as strings."""
    if isinstance(filenames, Dataset):
        filenames = list(filenames)
    elif isinstance(filenames, str | bytes | os.PathLike):
        filenames = [filenames]
    elif isinstance(filenames, np.ndarray):
        filenames = filenames.reshape(-1).tolist()
    try:
        items = list(filenames)
    except TypeError:
        raise TypeError(
            f"filenames must be a path, a list of paths or a Dataset of paths, got "
            f"{type(filenames).__name__}; e.g. TFRecordDataset(glob.glob('train-*'))"
        ) from None
    names = []
    for item in items:
        if isinstance(item, np.ndarray):
            item = item.item()
        if isinstance(item, bytes):
            item = item.decode()
        if not isinstance(item, str | os.PathLike):
            raise TypeError(f"a file name must be a str or bytes path, got {item!r}")
        names.append(os.fspath(item))
    return tuple(names)


def parallel_reads(value: Any) -> int:
    """`num_parallel_reads` as the number of files read at a time."""
    if value is None:
        return 1
    if value == executors.AUTOTUNE:
        # As tf.data: the CPUs this process may use. The order follows the width, which
        # iterator states record: a restore on another machine reads at the saved width.
        return executors.cpu_count()
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(
            f"num_parallel_reads must be None, AUTOTUNE or an int >= 1, got {value!r}; "
            "e.g. TFRecordDataset(files, num_parallel_reads=4)"
        )
    return int(value)


def TFRecordDataset(
    filenames: Any,
    compression_type: str | None = None,
    buffer_size: int | None = None,
    num_parallel_reads: int | None = None,
) -> Dataset:
    """The records of TFRecord files, each a `bytes` element, as tf.data.TFRecordDataset.

    Every record's length and data checksums (masked CRC-32C) are verified; a truncated or
    corrupt record raises `DataLossError` naming the file and the byte offset, never a
    wrong element. The dataset streams; its iterator state holds each open file's index
    and byte offset, so a restored iterator continues at the next record, and what
    decides the order (the files' names and sizes, the width): a restore over other files,
    or at another width given as a number, raises an error naming the difference. In a
    multi-process job `fit` and `experimental_distribute_dataset` give each process its
    files, or its records when there are fewer files than processes
    (`Options().experimental_distribute.auto_shard_policy`; see docs/records.md).
    `.shuffle(n)` right after it is a global shuffle of every record: uncompressed files
    are indexed for it by one pass over their record headers (see `records/indexed.py`).

    Args:
      filenames: a path, a list of paths (e.g. a sorted `glob.glob` result), or a Dataset
        of paths (read once, now).
      compression_type: None or "" (none), "GZIP" or "ZLIB".
      buffer_size: bytes read from disk at a time (default 256 KiB).
      num_parallel_reads: None reads the files one after the other; N interleaves N
        files, one record from each in turn, as tf.data does. AUTOTUNE is the number of
        CPUs this process may use (its affinity); an iterator state saved with it restores
        at the saved width on any machine, so the order continues exactly.

    Returns:
      A `Dataset` of `bytes` (tf.data's is a Dataset subclass; here a function builds it).

    Raises:
      ValueError: an unknown compression_type or a bad num_parallel_reads.
      TypeError: filenames that are not paths.
      FileNotFoundError: (when iterating) a missing file, naming it.

    Example:
      >>> files = sorted(glob.glob("/data/imagenet/train-*"))
      >>> ds = TFRecordDataset(files, num_parallel_reads=8).map(parse).batch(256)
    """
    files = file_names(filenames)
    if isinstance(filenames, str) and glob.has_magic(filenames) and not os.path.exists(filenames):
        raise ValueError(
            f"{filenames!r} is a pattern; expand it first, e.g. "
            f"TFRecordDataset(sorted(glob.glob({filenames!r})))"
        )
    if buffer_size is not None and (isinstance(buffer_size, bool) or int(buffer_size) < 0):
        raise ValueError(f"buffer_size must be None or >= 0 bytes, got {buffer_size!r}")
    node = RecordFiles(
        files,
        compression(compression_type),
        None if not buffer_size else int(buffer_size),
        parallel_reads(num_parallel_reads),
        auto=num_parallel_reads is not None and num_parallel_reads == executors.AUTOTUNE,
    )
    return Dataset(node)
