"""`Dataset`'s element computations: `map` (in threads or worker processes), `cache`,
`prefetch`, and `with_workers`. Mixed into `Dataset`; who computes the elements is decided
when iterating (`executors`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import weakref
from collections.abc import Callable
from typing import Any

from phalanx._src.data import element_ops, executors, plan, stream_cache, validation

AUTOTUNE = executors.AUTOTUNE  # as tf.data.AUTOTUNE: measured, see `autotune`
_WORKER_KINDS = ("thread", "process")


class DatasetMap:
    """Mixed into `Dataset`; see the module docstring."""

    _node: plan.Node
    _prefetch: int
    _options: Any
    _streaming: bool
    _parked: list[Any] | None = None  # [worker processes kept between epochs]

    def _then(self, node: plan.Node) -> Any:
        raise NotImplementedError

    def map(
        self,
        fn: Callable[..., Any],
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        *,
        workers: str = "thread",
    ) -> Any:
        """Applies `fn` to every element (a row before `batch`, a batch after it).

        A tuple element is unpacked into positional arguments, as in tf.data. Mapping after
        `batch` runs `fn` once per batch on whole arrays, which is much faster than per row.
        Elements always come back in order (`deterministic` is accepted for tf.data's sake).

        `num_parallel_calls=AUTOTUNE` times each element where it is computed (wall and
        thread CPU time, so the share that holds the GIL shows) and the consumer's waits,
        and runs the fewest workers (0: the calling thread) that a model of these predicts
        within 10 % of the fastest, capped by the cores; it re-evaluates all the run
        through (see `autotune`).

        Args:
          fn: a pure function of one element; it returns arrays, numbers, strings or bytes
            (in a structure), and the elements are the same whoever computes them.
          num_parallel_calls: None computes elements in the consuming thread; N > 0 computes
            N elements at once; AUTOTUNE measures and picks (0 included).
          deterministic: accepted for tf.data compatibility; the order is always kept.
          workers: "thread" (default) or "process". Threads help when `fn` releases the GIL
            (large NumPy kernels, decoding, file reads); processes run Python-bound `fn`s
            (per-example augmentation) in parallel. Process workers receive the pipeline
            once through cloudpickle, send results back through shared memory, stop with
            the iterator, and need an `if __name__ == "__main__":` guard in scripts.
            AUTOTUNE never picks processes by itself: with workers="process" it measures
            process counts instead of thread counts. Right after `TFRecordDataset`
            (uncompressed files) the records are then read by index, in the same order
            (the files are indexed once, as for `shuffle`); after other streaming ops
            (filter, from_generator, ...) maps run in threads.

        Raises:
          ValueError: workers="process" after a streaming op other than TFRecordDataset, or
            over compressed TFRecord files.

        Example:
          >>> ds.map(augment, num_parallel_calls=2, workers="process").batch(128)
        """
        del deterministic
        if workers not in _WORKER_KINDS:
            raise ValueError(
                f"workers must be 'thread' or 'process', got {workers!r}; e.g. "
                "map(fn, num_parallel_calls=2, workers='process')"
            )
        count = 0
        if num_parallel_calls == AUTOTUNE:
            count = AUTOTUNE
        elif num_parallel_calls is not None:
            count = validation.check_positive(
                num_parallel_calls, "num_parallel_calls", "map(fn, num_parallel_calls=2)"
            )
        if self._streaming:  # read in order; mapped by threads when asked (or inline)
            if workers == "process":
                return self._records_by_index("map(..., workers='process')").map(
                    fn, num_parallel_calls, workers=workers
                )
            return self._then(executors.ParallelStreamMap(self._node, fn, count))
        if workers == "process" and count:
            from phalanx._src.data.workers import warm_up

            warm_up()
        return self._then(element_ops.Map(self._node, fn, count, workers))

    def _records_by_index(self, op: str) -> Any:
        """This streaming dataset with random access, in the same order, for `op`: worker
        processes each read the elements they map, which needs random access. Uncompressed
        TFRecord files give it, by an index of their records (`records/indexed.py`).

        Raises:
          ValueError: compressed files, or another streaming op (naming `op`).
        """
        hook = getattr(self._node, "random_access", None)
        indexed = None if hook is None else hook(in_order=True, op=op)
        if indexed is None:
            raise ValueError(
                f"{op} needs random access to the elements, which a streaming op (filter, "
                "from_generator, interleave, ...) does not give; map in threads instead "
                "(map(fn, num_parallel_calls=AUTOTUNE)), or map in processes right after "
                "TFRecordDataset (uncompressed files), ArrayRecordDataset or an in-memory "
                "source"
            )
        return self._then(indexed)

    def with_workers(self, num_workers: int) -> Any:
        """Runs this pipeline's maps in `num_workers` worker processes (0: none).

        The same as passing `num_parallel_calls=num_workers, workers="process"` to every
        `map` before this call.

        Example:
          >>> ds.map(augment).batch(128).with_workers(2)
        """
        if num_workers != 0 and num_workers != AUTOTUNE:
            num_workers = validation.check_positive(num_workers, "num_workers", "with_workers(2)")

        if num_workers:
            from phalanx._src.data.workers import warm_up

            warm_up()

        def change(node: plan.Node) -> plan.Node:
            if isinstance(node, element_ops.Map):
                kind = "process" if num_workers else "thread"
                return dataclasses.replace(node, workers=num_workers, kind=kind)
            return node

        nodes = plan.chain(self._node)
        if not any(isinstance(n, element_ops.Map) for n in nodes):
            if any(isinstance(n, executors.ParallelStreamMap) for n in nodes):
                raise ValueError(
                    "with_workers() runs random-access maps in processes; this dataset's maps "
                    "follow a streaming op (TFRecordDataset, filter, from_generator, ...). "
                    "Pass workers='process' to the map itself, right after TFRecordDataset "
                    "(uncompressed files): map(fn, num_parallel_calls=2, workers='process')"
                )
            raise ValueError("with_workers() runs maps in processes; this dataset has no map()")
        return self._then(plan.rebuild(self._node, change))

    def cache(self, filename: str = "") -> Any:
        """Keeps every element the first time it is computed, so later epochs skip `map`.

        Cache after an expensive `map` and before `shuffle`/`repeat`. After any op: over
        random access (map, shuffle, batch, ...) each element is kept when first computed;
        after a streaming op (filter, flat_map, interleave, unbatch, ...) the elements of
        the first complete pass are kept (`stream_cache`), as in tf.data.

        Args:
          filename: "" keeps the elements in memory. A path keeps them in the file
            `filename + ".phalanx-cache"` too, written (atomically) once complete and read
            by later passes and later runs; as in tf.data, the file is not tied to the
            pipeline that wrote it (delete it when the pipeline changes). It is read with
            pickle: cache only to files you wrote.

        Raises:
          ValueError: an infinite dataset (call repeat() after cache()).

        Example:
          >>> ds.map(decode).cache("/tmp/decoded").shuffle(1000, seed=0).batch(32)
        """
        path = os.fspath(filename) or None
        if self._node.cardinality == math.inf:
            raise ValueError("cache() needs a finite dataset; call repeat() after cache().")
        if self._streaming:
            return self._then(stream_cache.StreamCache(self._node, path))
        return self._then(element_ops.Cache(self._node, path))

    def prefetch(self, buffer_size: int) -> Any:
        """Computes up to `buffer_size` elements ahead in a background thread.

        `prefetch(AUTOTUNE)` measures whether a thread reading ahead makes the consumer
        faster than computing each element when it is asked for, and keeps the faster.
        """
        if buffer_size != AUTOTUNE:
            buffer_size = validation.check_positive(buffer_size, "buffer_size", "prefetch(2)")
        return type(self)(self._node, buffer_size, self._options)  # type: ignore[call-arg]

    @property
    def autotune_report(self) -> str | None:
        """What AUTOTUNE chose, after how many elements, and what it measured; None before
        it ran.

        Example:
          >>> ds = ds.map(preprocess, num_parallel_calls=AUTOTUNE).batch(64)
          >>> for batch in ds: ...
          >>> ds.autotune_report
          'AUTOTUNE chose 2 threads after 3 elements; an element alone: 35.7 ms ...'
        """
        tuner = getattr(self, "_tuner", None)
        if tuner is None:  # a map after a streaming op keeps its decision on its node
            tuners = [
                node.tuner
                for node in plan.chain(self._node)
                if isinstance(node, executors.ParallelStreamMap) and node.tuner is not None
            ]
            tuner = tuners[-1] if tuners else None
        return None if tuner is None else tuner.describe()

    # -- worker processes kept between epochs -------------------------------------------------

    def _park(self, pool: Any) -> None:
        """Keeps idle worker processes for this dataset's next epoch (as PyTorch's
        persistent_workers); a pool parked before stops. They stop when the dataset is
        garbage-collected or at exit."""
        if self._parked is None:
            self._parked = []
            weakref.finalize(self, _close_all, self._parked)
        self._parked.append(pool)
        while len(self._parked) > 1:
            self._parked.pop(0).close()

    def _unpark(self, node: plan.Node, workers: int) -> Any:
        """The kept worker processes if some run `node` with `workers` workers, else None;
        kept pools of another plan (an earlier pipeline state) or with a dead worker stop."""
        for pool in list(self._parked or []):
            if pool.node is node and pool.alive:
                if pool.workers == workers:
                    self._parked.remove(pool)
                    return pool
            else:
                self._parked.remove(pool)
                pool.close()
        return None


def _close_all(pools: list[Any]) -> None:
    while pools:
        pools.pop().close()
