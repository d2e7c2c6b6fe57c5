"""The node behind `TFRecordDataset`: record files read as a stream, and shared over processes.

`RecordFiles` is a streaming node (see `stream`): files are read in order, or interleaved
`cycle` at a time exactly as tf.data's TFRecordDataset interleaves them (a cycle over the
open files, one record each; an exhausted file's slot takes the next file). Its position is
the next file to open, the cycle position and, for every open file, its index and the byte
offset of its next record, so a restored iterator re-opens those files at those offsets and
continues bitwise. What decides the order (the files, the width) is kept in the iterator
state beside it and checked on restore (`fingerprint`). At most `max_open` files are open
at once (`open_files`): a cycle wider than that reopens uncompressed files at their offsets.

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
from phalanx._src.data.records import fingerprint
from phalanx._src.data.records.indexed import IndexedRecords
from phalanx._src.data.records.open_files import DEFAULT_LIMIT
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
class RecordFiles(fingerprint.OrderedFiles, Stream):
    """The records of `files` (bytes), read `cycle` files at a time (`auto`: the width
    came from num_parallel_reads=AUTOTUNE); see the module doc."""

    files: tuple[str, ...]
    kind: str  # "", "GZIP" or "ZLIB"
    buffer_size: int | None
    cycle: int
    share: Share | None = None
    auto: bool = False
    max_open: int = DEFAULT_LIMIT

    level = 0

    def own_files(self) -> tuple[str, ...]:
        share = self.share
        if share is not None and share.by_file:
            return self.files[share.index :: share.count]
        return self.files

    @property
    def width(self) -> int:
        """The interleave width that decides the order (a cycle longer than the file list
        gives the order of one as long)."""
        return max(1, min(self.cycle, len(self.own_files())))

    def _order_of(self) -> tuple[str, Any]:
        return self.kind, self.share

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
        if not in_order:
            return IndexedRecords(self.files, max_open=self.max_open)
        return IndexedRecords(self.files, cycle=self.cycle, auto=self.auto, max_open=self.max_open)

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
    replaced when its file moves on and never changed in place. At most `node.max_open`
    readers are open: opening one more closes the least recently read, which reopens at
    its slot's offset when its turn comes (only a cycle wider than the limit does that).
    """

    def __init__(self, node: RecordFiles, state: dict | None) -> None:
        self.node = node
        self.files = node.own_files()
        share = node.share
        self._share = None if share is None or share.by_file else share  # sharded by record
        self._cycle = cycle = node.width
        if node.kind and cycle > node.max_open:
            raise ValueError(
                f"num_parallel_reads={cycle} keeps {cycle} {node.kind}-compressed files open, "
                f"more than options.experimental_max_open_files = {node.max_open}, and a "
                "compressed file cannot be reopened where it was left without decompressing "
                f"all before it; read at most {node.max_open} files at a time, or raise the "
                f"limit (options.experimental_max_open_files = {cycle})"
            )
        self._readers: list[RecordReader | None] = [None] * cycle  # open ones, per slot
        self._read_at = [0] * cycle  # when each slot was last read (`seen`): the LRU order
        state = state or {}
        self.next_file = int(state.get("next_file", 0))
        self.cycle_index = int(state.get("cycle_index", 0))
        self.seen = int(state.get("seen", 0))  # records passed over, when sharding by record
        self._saved: list[list[int] | None] = [None] * cycle  # [file index, offset] per slot
        saved = list(state.get("slots", [None] * cycle))
        if len(saved) != cycle or not 0 <= self.cycle_index < cycle:
            raise ValueError(
                f"the state reads {len(saved)} files at a time where this source reads "
                f"{cycle}; restore a state saved from the same pipeline"
            )
        for i, slot in enumerate(saved):
            if slot is not None:
                self._saved[i] = [int(slot[0]), int(slot[1])]

    def _mine(self) -> bool:
        """Whether the next record is this process's, when sharding by record."""
        share = self._share
        return (self.seen // share.block) % share.count == share.index

    def __next__(self) -> bytes:
        saved = self._saved
        while True:
            index = self.cycle_index
            slot = saved[index]
            if slot is None:
                if self.next_file < len(self.files):
                    saved[index] = [self.next_file, 0]
                    self.next_file += 1
                    continue
                if all(slot is None for slot in saved):
                    raise StopIteration
                self.cycle_index = (index + 1) % self._cycle
                continue
            position, offset = slot
            reader = self._readers[index]
            if reader is None:
                reader = self._open(index, position, offset)
            mine = self._share is None or self._mine()
            record = reader.read() if mine else (b"" if reader.skip() else None)
            self.cycle_index = (index + 1) % self._cycle
            if record is None:  # this file is done: its slot takes the next file
                reader.close()
                self._readers[index] = saved[index] = None
                continue
            self.seen += 1
            self._read_at[index] = self.seen
            saved[index] = [position, reader.offset]
            if mine:
                return record

    def _open(self, index: int, position: int, offset: int) -> RecordReader:
        """Slot `index`'s reader of file `position` at `offset`, the least recently read
        one closed first if `node.max_open` are open."""
        readers = self._readers
        open_slots = [i for i, reader in enumerate(readers) if reader is not None]
        if len(open_slots) >= self.node.max_open:
            oldest = min(open_slots, key=self._read_at.__getitem__)
            readers[oldest].close()  # type: ignore[union-attr]
            readers[oldest] = None
        node = self.node
        reader = RecordReader(self.files[position], node.kind, node.buffer_size, offset)
        readers[index] = reader
        return reader

    def state(self) -> dict:
        return {
            "next_file": self.next_file,
            "cycle_index": self.cycle_index,
            "seen": self.seen,
            "slots": self._saved.copy(),
        }

    def __del__(self) -> None:
        for reader in getattr(self, "_readers", ()):
            if reader is not None:
                reader.close()


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
