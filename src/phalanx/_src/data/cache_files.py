"""The file behind `cache(filename)`: every element of one pass, published atomically.

tf.data's `cache(filename)` keeps the elements of the first complete pass in files under
the prefix `filename`, and every later pass, in this run or a later one, reads them there.
phalanx writes one file, `filename + SUFFIX`: a pickle (protocol 5, so arrays go in as
their bytes) of a small header and the elements. It is written to a temporary name beside
it and renamed when complete, so an interrupted pass never leaves a file that serves: the
next pass fills it anew. As in tf.data, the file is not tied to the pipeline that wrote it:
change the pipeline, change (or delete) the file. A file whose element count disagrees
with the dataset's is refused. The file is read with pickle: cache only to files you wrote.

Example:
  >>> write("/tmp/train", elements, len(elements))   # /tmp/train.phalanx-cache
  >>> read("/tmp/train", len(elements)) is not None
  True
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

SUFFIX = ".phalanx-cache"
_FORMAT = ("phalanx.data cache", 1)


def file_of(filename: str) -> str:
    """The cache file of `cache(filename)`."""
    return os.fspath(filename) + SUFFIX


def read(filename: str, length: int | None) -> Any | None:
    """The elements `write` stored for `filename`, or None when there is no complete file.

    Args:
      filename: what was passed to `cache`.
      length: the dataset's element count when known: a file holding another count was
        written by another pipeline and is refused.

    Raises:
      ValueError: the file is not a phalanx cache, or holds another number of elements.
    """
    path = file_of(filename)
    try:
        with open(path, "rb") as f:
            header, count, elements = pickle.load(f)
    except FileNotFoundError:
        return None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise ValueError(
            f"{path} is not a phalanx cache file ({error}); delete it or pass cache() "
            "another filename"
        ) from None
    if tuple(header) != _FORMAT:
        raise ValueError(f"{path} was written by {header!r}, not {_FORMAT!r}; delete it")
    if length is not None and count != length:
        raise ValueError(
            f"{path} holds {count} elements but this dataset has {length}: it was written by "
            "another pipeline. Delete it, or pass cache() another filename, to fill it anew"
        )
    return elements


def write(filename: str, elements: Any, count: int) -> None:
    """Stores `elements` (`count` of them) for `filename`: a temporary file, then a rename,
    so that a reader sees the whole file or none."""
    path = file_of(filename)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path), dir=folder)
    try:
        with os.fdopen(handle, "wb") as f:
            pickle.dump((_FORMAT, int(count), elements), f, protocol=5)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
