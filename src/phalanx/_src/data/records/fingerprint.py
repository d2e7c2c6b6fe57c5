"""What decides the order of a record-file source, kept in iterator states and checked on
restore, so that a restored iterator continues with exactly the records the saved run
would have given, or says why it cannot.

A TFRecord source's order depends on its files (their names, order and contents: a saved
position is a byte offset or a record number), on its compression, on the process's share
of the files, and on the interleave width, `num_parallel_reads` (tf.data's cycle length).
Its iterator state therefore records them (`order_state`): the number of files, a hash of
their base names (the folder may move: a checkpoint restored on another machine reads the
same shards from another mount), a hash of their sizes, the compression, the share and
the width read with.

On restore (`restore`), any difference in the files is an error naming it. A different
width is adopted when the source was built with `num_parallel_reads=AUTOTUNE`: AUTOTUNE
resolves to the CPU count of the machine, and the order only follows the width, not the
machine, so the restored source reads at the saved width (the dataset keeps it for later
epochs, as it keeps the saved shuffle seeds) and continues exactly on any host. A width
given as a number is the user's: restoring at another is an error naming both
(`num_parallel_reads 4 -> 2`) and the call that restores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

_KEYS = ("files", "names", "sizes", "compression", "share", "num_parallel_reads")


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1  # missing: reading it raises FileNotFoundError, naming it


def order_state(files: tuple[str, ...], kind: str, share: Any, width: int) -> dict:
    """The JSON-ready description of a source's order (see the module doc)."""
    return {
        "files": len(files),
        "names": _digest([os.path.basename(f) for f in files]),
        "sizes": _digest([str(_size(f)) for f in files]),
        "compression": kind,
        "share": None
        if share is None
        else [int(share.by_file), share.index, share.count, share.block],
        "num_parallel_reads": width,
    }


def restore(mine: dict, saved: Any, auto: bool) -> int | None:
    """The width to read with so the order is `saved`'s (None: this source's own), for a
    source whose order is `mine` (`auto`: built with num_parallel_reads=AUTOTUNE).

    Raises:
      ValueError: the saved state is not a record source's, its files differ, or its
        width differs from one given as a number.
    """
    if not isinstance(saved, dict) or set(saved) != set(_KEYS):
        raise ValueError(
            f"expected the state of a TFRecord source with keys {sorted(_KEYS)}, got "
            f"{saved!r}; restore a state saved from the same pipeline"
        )
    what = {
        "files": "the number of record files",
        "names": "the files' names or their order",
        "sizes": "the files' sizes (a file was rewritten, or is still being written)",
        "compression": "compression_type",
        "share": "this process's share ([by file, process index, count, block])",
    }
    differ = [
        f"{text} ({saved[key]!r} -> {mine[key]!r})"
        for key, text in what.items()
        if saved[key] != mine[key]
    ]
    if differ:
        raise ValueError(
            "cannot restore this iterator state exactly: the record files differ from the "
            f"saved run's: {'; '.join(differ)}. A state continues the records it was saved "
            "from: restore it over the same files (the same names in the same order, "
            "unchanged; their folder may differ), or start the epoch afresh"
        )
    saved_width, width = int(saved["num_parallel_reads"]), mine["num_parallel_reads"]
    if saved_width == width:
        return None
    if auto:
        return saved_width
    raise ValueError(
        "cannot restore this iterator state exactly: the records' order depends on "
        f"num_parallel_reads, and it differs (num_parallel_reads {saved_width} -> {width}). "
        f"Build the dataset as it was saved, TFRecordDataset(files, num_parallel_reads="
        f"{saved_width}), or with num_parallel_reads=AUTOTUNE, which reads at the saved "
        "width whatever this machine's CPU count"
    )


class OrderedFiles:
    """`order_state` and `restore_order` for a record node (a dataclass) whose order its
    `files`, `width` and `_order_of()` (compression, share) decide, and whose `cycle` and
    `auto` say the width read with and whether it came from AUTOTUNE."""

    def _order_of(self) -> tuple[str, Any]:
        """(compression, this process's share) of the node's order."""
        raise NotImplementedError

    def order_state(self) -> dict:
        """What decides this source's order, for iterator states (see `fingerprint`)."""
        state = self.__dict__.get("_order_state")
        if state is None:
            state = order_state(self.files, *self._order_of(), self.width)
            self.__dict__["_order_state"] = state
        return state

    def restore_order(self, saved: Any) -> Any:
        """This node, or one reading at the saved width; raises if the order cannot be the
        saved one (see `restore`)."""
        width = restore(self.order_state(), saved, self.auto)
        return self if width is None else dataclasses.replace(self, cycle=width)
