"""`Dataset.save`, `Dataset.load` and `Dataset.snapshot`: data preprocessed once.

Mixed into `Dataset`; the format is `codec`'s, the writing `writer`'s, the reading
`reader`'s and the snapshot's rules `snapshot`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.data import plan, stream
from phalanx._src.data.saved import codec, reader, snapshot, writer
from phalanx._src.data.saved.fingerprint import fingerprint

_CHECKPOINT_KEYS = ("checkpoint_interval",)


def _path(path: Any, where: str) -> str:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{where}() takes a directory path (str or os.PathLike), got {path!r}")
    return os.path.abspath(os.fspath(path))


def _interval(checkpoint_args: Any) -> int | None:
    """`checkpoint_args`' checkpoint interval in elements (None: no checkpoints)."""
    if checkpoint_args is None:
        return None
    if not isinstance(checkpoint_args, dict) or set(checkpoint_args) - set(_CHECKPOINT_KEYS):
        raise ValueError(
            f"checkpoint_args must be a dict with 'checkpoint_interval' (elements between "
            f"checkpoints), got {checkpoint_args!r}. tf.data's 'step_counter', 'directory' "
            "and 'max_to_keep' have no role here: the checkpoint lives beside the partial "
            "shards (<path>.partial); e.g. save(path, checkpoint_args={"
            "'checkpoint_interval': 1000})"
        )
    interval = checkpoint_args.get("checkpoint_interval", 1000)
    if isinstance(interval, bool) or not isinstance(interval, int | np.integer) or interval < 1:
        raise ValueError(f"checkpoint_interval must be an int >= 1, got {interval!r}")
    return int(interval)


class DatasetIO:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node
    _options: Any

    def _then(self, node: plan.Node) -> Any:
        raise NotImplementedError

    def save(
        self,
        path: str | os.PathLike,
        compression: str | None = None,
        shard_func: Callable[..., Any] | None = None,
        checkpoint_args: dict | None = None,
    ) -> None:
        """Writes one epoch of this dataset's elements to the directory `path`.

        Run the expensive preprocessing once, then train from `Dataset.load(path)`. The
        directory holds TFRecord shards of the encoded elements, an index and a JSON
        description (the format is documented in the "Preprocess once" guide). The save
        is built in `<path>.partial` and published by one rename, so `path` never holds a
        half-written dataset; an earlier saved dataset at `path` is replaced.

        With `checkpoint_args`, the save checkpoints every `checkpoint_interval`
        elements and on an error, and a save of the same pipeline to the same path
        resumes from the last checkpoint after a kill (the elements come out exactly as
        an uninterrupted save writes them, from the iterator's saved position). Without
        it a new save starts over; so does a save of a changed pipeline (its fingerprint,
        as `snapshot`'s: give a `shuffle` before it a seed, or every run differs).

        Differences from tf.data: `load` yields the elements in the saved order (tf.data
        interleaves the shards); `checkpoint_args` takes only `checkpoint_interval`;
        `compression` compresses each record on its own so reads stay random access.

        Args:
          path: the directory to publish to (created; an earlier saved dataset there is
            replaced, anything else is refused).
          compression: None, "GZIP" or "ZLIB".
          shard_func: element -> int, the shard file an element goes to (tf.data's); by
            default files of up to 256 MiB are filled one after another.
          checkpoint_args: `{"checkpoint_interval": N}` to checkpoint every N elements.

        Raises:
          ValueError: an infinite dataset, bad arguments, an element the format cannot
            hold (its structure, dtypes or ranks change between elements).
          FileExistsError: `path` holds something that is not a saved dataset.

        Example:
          >>> ds = TFRecordDataset(files).map(decode_and_resize)
          >>> ds.save("/data/imagenet-224", checkpoint_args={"checkpoint_interval": 5000})
          >>> train = Dataset.load("/data/imagenet-224").shuffle(10_000, seed=0).batch(256)
        """
        target = _path(path, "save")
        kind = codec.compression(compression, "save")
        interval = _interval(checkpoint_args)
        if shard_func is not None and not callable(shard_func):
            raise TypeError(f"shard_func must be a function element -> int, got {shard_func!r}")
        if not self._streaming and self._node.length is None:  # type: ignore[attr-defined]
            raise ValueError(
                "save() of an infinite dataset (repeat()) never ends; save before repeat"
            )
        writer.check_target(target)
        out = writer.Writer(
            target, fingerprint(self._node, self._options), kind, interval is not None
        )
        try:
            with iter(self) as iterator:  # type: ignore[call-overload]
                if out.extra is not None:
                    iterator.set_state(out.extra)
                try:
                    for element in iterator:
                        position = out.count
                        key = None if shard_func is None else _shard(shard_func, element)
                        out.add(position, element, key)
                        if interval is not None and out.count % interval == 0:
                            out.checkpoint(iterator.get_state())
                except BaseException:
                    # Kept only where the iterator and the files agree (an element the
                    # writer refused was taken from the iterator but not written).
                    if interval is not None and iterator.step == out.count:
                        out.checkpoint(iterator.get_state())
                    raise
            out.publish(out.count, self._node.level)
        finally:
            out.close()

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        element_spec: Any = None,
        compression: str | None = None,
    ) -> Any:
        """The dataset saved at `path` (by `save`, or a complete `snapshot` directory).

        Random access: `shuffle`, `process_split` and an iterator's exact resume work as
        over in-memory arrays, and the cardinality is known. Elements come back as saved
        (batches if the saved dataset was batched), in the saved order.

        Args:
          path: a directory `save` published.
          element_spec: optional, as tf.data's: the structure of `TensorSpec`s to give the
            elements (checked against the saved dtypes); by default the saved structure
            (a namedtuple's class must be importable).
          compression: optional; the saved dataset records its own, and a different value
            here is an error.

        Raises:
          FileNotFoundError: nothing is published at `path` (an unfinished save is named).
          ValueError: an element_spec or compression that does not match the saved data.

        Example:
          >>> ds = Dataset.load("/data/imagenet-224").shuffle(10_000, seed=0).batch(256)
        """
        target = _path(path, "load")
        meta = reader.read_meta(target)
        if (
            compression is not None
            and codec.compression(compression, "load") != meta["compression"]
        ):
            raise ValueError(
                f"{target!r} was saved with compression {meta['compression'] or None!r}, "
                f"not {compression!r}; pass compression=None"
            )
        treedef = None
        if element_spec is not None:
            treedef = reader.element_treedef(element_spec, meta, target)
        return cls(reader.Saved(target, treedef))  # type: ignore[call-arg]

    def snapshot(self, path: str | os.PathLike, compression: str | None = "AUTO") -> Any:
        """Computes the elements on the first complete pass and reads them back afterwards.

        The elements go to `path/<fingerprint>` while they are computed; once every one
        is there the snapshot is published and later passes, and later runs, read it
        instead of computing. The fingerprint covers the ops, the functions' code and
        the globals they use, seeds, files and options: change any and a new snapshot is
        written (the old one stays, unused). A half-written snapshot never serves; one cut
        short by a kill is continued by the next run. Elements are those of one fixed
        iteration, so whatever is random before the snapshot is frozen into it, as in
        tf.data (give `shuffle` a seed, or the fingerprint differs every run).

        Over a random-access pipeline the snapshot is random access (shuffle after it);
        after a streaming op (TFRecordDataset, filter, ...) it streams. Worker processes
        (`map(..., workers="process")`) read a complete snapshot but do not write one.

        Args:
          path: the directory holding snapshots (created).
          compression: "AUTO" or None (none: phalanx has no Snappy), "GZIP" or "ZLIB".

        Raises:
          ValueError: an infinite dataset, or a bad compression.

        Example:
          >>> ds = TFRecordDataset(files).map(decode_and_crop, num_parallel_calls=AUTOTUNE)
          >>> ds = ds.snapshot("/tmp/crops").batch(64)   # epoch 2 on: read, not decoded
        """
        root = _path(path, "snapshot")
        kind = codec.compression(compression, "snapshot")
        if os.path.exists(root) and not os.path.isdir(root):
            raise ValueError(f"snapshot() needs a directory; {root!r} is a file")
        if isinstance(self._node, stream.Stream):
            return self._then(snapshot.StreamSnapshot(self._node, root, kind, self._options))
        if self._node.length is None:
            raise ValueError(
                "snapshot() of an infinite dataset (repeat()) never completes; call "
                "snapshot() before repeat()"
            )
        return self._then(snapshot.Snapshot(self._node, root, kind, self._options))


def _shard(shard_func: Callable[..., Any], element: Any) -> int:
    value = np.asarray(stream.call(shard_func, element))
    if value.shape != () or value.dtype.kind not in "iu" or int(value) < 0:
        raise ValueError(f"shard_func must return one int >= 0, got {value!r}")
    return int(value)
