"""The node behind `TFRecordDataset`: record files read as a stream, and shared over processes.

`RecordFiles` is a streaming node (see `stream`): files are read in order, or interleaved
`cycle` at a time exactly as tf.data's TFRecordDataset interleaves them (a cycle over the
open files, one record each; an exhausted file's slot takes the next file). Its position is
the next file to open, the cycle position and, for every open file, its index and the byte
offset of its next record, so a restored iterator re-opens those files at those offsets and
continues bitwise.

Over many processes, `Dataset.process_split` (which `fit` and
`experimental_distribute_dataset` apply) asks each node for a `split_processes` hook;
`split_node` returns the pipeline with its files read as tf.data's auto-sharding reads
them, and its global batch of B rows read as process batches of B / count rows (the global
batch is the processes' batches side by side):

- FILE (AUTO when there are at least as many files as processes): process i reads files
  i, i + count, ... and nothing else.
- DATA (AUTO with fewer files than processes): every process walks the same record stream,
  reading only the length of the records of others (a seek), and keeps records in blocks of
  B / count: block j goes to process j % count, so global batch k holds records
  [k B, (k + 1) B) as on one process.
- OFF: not sharded at the files; every process reads every record and keeps its rows of
  each global batch (the behaviour of a pipeline over arrays).

As in tf.data, processes whose shares end at different points yield different numbers of
batches: give every process the same number of records (equal shards, or `repeat()` with
a fixed number of steps) when every step is a collective.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from phalanx._src.data import plan
from phalanx._src.data.options import AutoShardPolicy, Options
from phalanx._src.data.plan import Key, Node
from phalanx._src.data.records.indexed import IndexedRecords
from phalanx._src.data.records.tfrecord_io import RecordReader
from phalanx._src.data.stream import Stream
from phalanx._src.data.stream_nested import StreamBatch


@dataclasses.dataclass(frozen=True)
class Share:
    """One process's part of the records: its files (`by_file`), else its records: those
    at positions p of the whole stream with `(p // block) % count == index`."""

    by_file: bool
    index: int
    count: int
    block: int = 1


@dataclasses.dataclass(eq=False)
class RecordFiles(Stream):
    """The records of `files` (bytes), read `cycle` files at a time; see the module doc."""

    files: tuple[str, ...]
    kind: str  # "", "GZIP" or "ZLIB"
    buffer_size: int | None
    cycle: int
    share: Share | None = None

    level = 0

    def own_files(self) -> tuple[str, ...]:
        share = self.share
        if share is not None and share.by_file:
            return self.files[share.index :: share.count]
        return self.files

    def open(self, key: Key, state: dict | None) -> Any:
        return _RecordCursor(self, state)

    def random_access(self, in_order: bool = False, op: str = "shuffle()") -> Node | None:
        """The same records with random access, or None once split over processes; see
        `indexed`. `Dataset.shuffle`'s hook numbers them file after file; with `in_order`
        (`map(..., workers="process")`) they keep this node's interleaved order.

        Raises:
          ValueError: compressed files, which cannot be read at an offset (naming `op`).
        """
        if self.share is not None:
            return None
        if self.kind:
            raise ValueError(
                f"{op} needs random access to the records, which {self.kind}"
                "-compressed TFRecord files do not give (a record is reached only by "
                "decompressing all before it); write the files uncompressed, or as "
                "ArrayRecord (ArrayRecordDataset)"
            )
        return IndexedRecords(self.files, cycle=self.cycle if in_order else 1)

    def split_processes(
        self, root: Node, options: Options | None, index: int, count: int
    ) -> Node | None:
        """`process_split`'s hook: `root` (which holds this node) reading one process's
        share of the files, or None to split it the usual way; see `split_node`."""
        return split_node(root, options, index, count)


class _RecordCursor:
    """tf.data's interleave (block length 1) over record files; state in `state()`.

    `state()` runs once per record (a parallel map keeps each element's), so it is cheap:
    each slot's `[file index, byte offset]` is kept ready, as a list that snapshots share,
    replaced when its file moves on and never changed in place.
    """

    def __init__(self, node: RecordFiles, state: dict | None) -> None:
        self.node = node
        self.files = node.own_files()
        share = node.share
        self._share = None if share is None or share.by_file else share  # sharded by record
        self._cycle = node.cycle
        state = state or {}
        self.next_file = int(state.get("next_file", 0))
        self.cycle_index = int(state.get("cycle_index", 0))
        self.seen = int(state.get("seen", 0))  # records passed over, when sharding by record
        self.slots: list[Any] = [None] * node.cycle  # (file index, reader) per open file
        self._saved: list[list[int] | None] = [None] * node.cycle
        for i, saved in enumerate(state.get("slots", [])):
            if saved is not None:
                position, offset = int(saved[0]), int(saved[1])
                self.slots[i] = (position, self._open(position, offset))
                self._saved[i] = [position, offset]

    def _open(self, position: int, offset: int) -> RecordReader:
        node = self.node
        return RecordReader(self.files[position], node.kind, node.buffer_size, offset)

    def _mine(self) -> bool:
        """Whether the next record is this process's, when sharding by record."""
        share = self._share
        return (self.seen // share.block) % share.count == share.index

    def __next__(self) -> bytes:
        slots = self.slots
        while True:
            index = self.cycle_index
            slot = slots[index]
            if slot is None:
                if self.next_file < len(self.files):
                    position = self.next_file
                    slots[index] = (position, self._open(position, 0))
                    self._saved[index] = [position, 0]
                    self.next_file += 1
                    continue
                if all(slot is None for slot in slots):
                    raise StopIteration
                self.cycle_index = (index + 1) % self._cycle
                continue
            position, reader = slot
            mine = self._share is None or self._mine()
            record = reader.read() if mine else (b"" if reader.skip() else None)
            self.cycle_index = (index + 1) % self._cycle
            if record is None:  # this file is done: its slot takes the next file
                reader.close()
                slots[index] = self._saved[index] = None
                continue
            self.seen += 1
            self._saved[index] = [position, reader.offset]
            if mine:
                return record

    def state(self) -> dict:
        return {
            "next_file": self.next_file,
            "cycle_index": self.cycle_index,
            "seen": self.seen,
            "slots": self._saved.copy(),
        }


def split_node(
    root: plan.Node, options: Options | None, index: int, count: int
) -> plan.Node | None:
    """`root` reading only process `index`'s share of its record files, or None to split
    the usual way (no record files, another kind of source beside them, OFF, one process).

    Raises:
      ValueError: the global batch does not divide by `count`, or FILE with fewer files
        than processes.
    """
    nodes = plan.chain(root)
    readers = [n for n in nodes if isinstance(n, RecordFiles)]
    others = [n for n in nodes if not plan.parents(n) and not isinstance(n, RecordFiles)]
    if not readers or others or count == 1:
        return None
    policy = AutoShardPolicy.AUTO
    if options is not None:
        policy = options.experimental_distribute.auto_shard_policy
    if policy == AutoShardPolicy.OFF:
        return None
    if any(r.share is not None for r in readers):
        return root  # already split (fit splits what it is given unless `split` is set)
    batches = [n for n in nodes if isinstance(n, StreamBatch)]
    size = batches[-1].size
    if size % count:
        raise ValueError(
            f"the global batch of {size} records does not split over {count} processes, "
            f"each reading its own share of the record files; use a multiple of {count} "
            f"(e.g. {size} -> {size + count - size % count}), or set "
            "options.experimental_distribute.auto_shard_policy = AutoShardPolicy.OFF to read "
            "every record on every process and keep each process's rows"
        )
    files = min(len(r.files) for r in readers)
    by_file = policy == AutoShardPolicy.FILE or (policy != AutoShardPolicy.DATA and files >= count)
    if by_file and files < count:
        raise ValueError(
            f"auto_shard_policy FILE needs at least as many files as processes ({count}), got "
            f"{files}; write more shards, or use AutoShardPolicy.DATA (or AUTO) to shard by "
            "record"
        )
    share = Share(by_file, index, count, size // count)
    seen = itertools.count(1)

    def change(node: plan.Node) -> plan.Node:
        if isinstance(node, RecordFiles):
            return dataclasses.replace(node, share=share)
        if isinstance(node, StreamBatch) and next(seen) == len(batches):
            fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(StreamBatch)}
            return ProcessBatch(**{**fields, "split": (index, count)}, rows=size // count)
        return node

    return plan.rebuild(root, change)


@dataclasses.dataclass(eq=False)
class ProcessBatch(StreamBatch):
    """This process's part of a global batch of `size` rows: batches of `rows` elements
    of its own share (`size` and `split` still say what the global batch is)."""

    rows: int = 0

    def open(self, key: plan.Key, state: dict | None) -> Any:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(StreamBatch)}
        return StreamBatch(**{**fields, "size": self.rows, "split": None}).open(key, state)
