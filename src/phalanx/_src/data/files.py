"""Files as dataset elements: reading bytes, and a directory tree of labelled files.

A file's contents are returned as a uint8 array (tf.io.read_file returns a string tensor;
NumPy's equivalent that XLA-bound pipelines can carry is bytes as uint8), so `read_file`
works inside `map` and its result can be decoded there (`decode_image`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def read_file(filename: Any) -> np.ndarray:
    """The bytes of a file as a 1-D uint8 array, as tf.io.read_file (for use in `map`).

    Args:
      filename: a path (str, bytes, os.PathLike, or a 0-d NumPy string from `list_files`).

    Raises:
      FileNotFoundError: naming the path.

    Example:
      >>> ds = Dataset.list_files("images/*.png").map(read_file)
    """
    path = _path(filename)
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8)


def _path(filename: Any) -> str:
    if isinstance(filename, np.ndarray):
        filename = filename.item()
    if isinstance(filename, bytes):
        filename = filename.decode()
    if not isinstance(filename, str | os.PathLike):
        raise TypeError(
            f"expected a file path (str, bytes or a NumPy string), got {type(filename).__name__}"
        )
    return os.fspath(filename)


def labelled_files(
    directory: str | os.PathLike,
    extensions: Sequence[str],
    class_names: Sequence[str] | None = None,
) -> tuple[list[str], np.ndarray, list[str]]:
    """The files under `directory`'s subfolders and the index of each one's subfolder.

    As Keras's `image_dataset_from_directory` reads a tree `directory/<class>/<file>`:
    classes are the subfolder names in alphanumeric order (or `class_names`, in that
    order), files are found at any depth below a class folder, and the files are sorted.

    Returns:
      `(paths, labels, class_names)`; labels are int32.

    Raises:
      ValueError: the directory is missing, has no subfolders, a named class is absent, or
        no file has one of `extensions`.
    """
    root = os.fspath(directory)
    if not os.path.isdir(root):
        raise ValueError(f"directory {root!r} does not exist or is not a directory")
    found = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if class_names is None:
        class_names = found
    else:
        missing = sorted(set(class_names) - set(found))
        if missing:
            raise ValueError(
                f"class_names {list(class_names)} name folders absent from {root!r}: "
                f"{missing}; the subfolders are {found}"
            )
    if not class_names:
        raise ValueError(
            f"{root!r} has no subfolders; put each class's files in its own subfolder "
            "(directory/<class_name>/<file>), as Keras's image_dataset_from_directory expects"
        )
    suffixes = tuple(e.lower() for e in extensions)
    paths: list[str] = []
    labels: list[int] = []
    for index, name in enumerate(class_names):
        for folder, _, names in sorted(os.walk(os.path.join(root, name))):
            for file in sorted(names):
                if file.lower().endswith(suffixes):
                    paths.append(os.path.join(folder, file))
                    labels.append(index)
    if not paths:
        raise ValueError(
            f"no file ending in {', '.join(suffixes)} under the class folders of {root!r}"
        )
    return paths, np.asarray(labels, np.int32), list(class_names)
