"""Who computes a pipeline's elements: the calling thread, threads, or worker processes.

Every element of a random-access pipeline is a pure function of its position
(`plan.element(root, key, step)`), so any executor may compute elements anywhere, a few
ahead, and hand them back in order: the results, the iterator state and an exact resume are
the same as computing them one by one in the calling thread. An executor is opened at a
step, returns elements in order from `next()` and stops its threads or processes in
`close()`. `open_executor` picks one from the dataset's settings:

- no `num_parallel_calls` and no `prefetch`: `Inline` (the calling thread);
- `map(fn, num_parallel_calls=N)` or `prefetch(N)`: `Threads` (N threads, or one thread N
  elements ahead);
- `map(fn, num_parallel_calls=N, workers="process")`: `workers.Processes`, kept by the
  dataset from one epoch to the next (`release`, `Dataset._park`);
- AUTOTUNE anywhere: `autotune.Autotuned`, which measures and picks among the above.

A map after a streaming op (TFRecordDataset, filter, from_generator) has no positions to
compute ahead from; `ParallelStreamMap` reads its parent in order and maps up to N
elements at once in threads instead.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from phalanx._src.data import autotune, stream, validation
from phalanx._src.data.element_ops import map_words
from phalanx._src.data.stream import Stream
from phalanx._src.image import randomness

Fetch = Callable[[int], Any]
AUTOTUNE = -1  # as tf.data.AUTOTUNE: let phalanx pick (measured; see `autotune`)
_ids = itertools.count()


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Inline:
    """Computes each element in the calling thread when it is asked for."""

    workers = 0

    def __init__(self, fetch: Fetch, start: int, stop: int) -> None:
        self._fetch = fetch
        self._step = start

    def next(self) -> Any:
        element = self._fetch(self._step)
        self._step += 1
        return element

    def close(self) -> None:
        return None

    def release(self, park: Callable[[Any], None]) -> None:
        """At an iteration's end (only process workers are kept for the next one)."""
        self.close()


class Threads:
    """`workers` threads compute elements in order, up to `ahead` elements ahead.

    Threads help where the work releases the GIL (NumPy on large arrays, I/O, decoding);
    Python-bound work is better served by processes (`workers.Processes`) or inline.
    Each element is timed where it is computed: `cost` is the last one's (wall, CPU, and
    beside: the seconds other workers computed during it), for AUTOTUNE. `stagger`: the
    n-th element starts n * stagger seconds late (an AUTOTUNE burst's second element), or
    as soon as an element ends, if sooner (a first element timed cold made `stagger` too
    long: the consumer would wait for a sleeping thread).
    """

    def __init__(
        self, fetch: Fetch, start: int, stop: int, workers: int, ahead: int, stagger: float = 0.0
    ) -> None:
        self.workers = workers
        self._start, self._stagger = start, stagger
        self._ended = threading.Event()  # an element ended (or the executor closed)
        self.cost: tuple[float, ...] = (0.0, 0.0, 0.0)
        self._fetch = fetch
        self._next = self._out = start
        self._stop = stop
        self._ahead = max(ahead, workers, 1)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix=f"phalanx-map-{next(_ids)}"
        )
        self._futures: collections.deque = collections.deque()
        self._spans: dict[int, list[float]] = {}  # step: [start, end] of elements started
        self._history: collections.deque = collections.deque(maxlen=2 * workers)

    def _timed(self, step: int) -> tuple[Any, float, float]:
        if self._stagger:
            self._ended.wait(self._stagger * (step - self._start))
        cpu = time.thread_time()
        span = self._spans[step] = [time.perf_counter(), math.inf]
        try:
            element = self._fetch(step)
        finally:
            self._ended.set()
        span[1] = time.perf_counter()
        return element, span[1] - span[0], time.thread_time() - cpu

    def _fill(self) -> None:
        while len(self._futures) < self._ahead and self._next < self._stop:
            self._futures.append(self._pool.submit(self._timed, self._next))
            self._next += 1

    def next(self) -> Any:
        self._fill()
        future = self._futures.popleft()
        element, wall, cpu = future.result()  # a worker's exception is raised here, in order
        span = self._spans.pop(self._out)
        self._out += 1
        others = [*self._history, *list(self._spans.values())]
        beside = sum(max(0.0, min(span[1], end) - max(span[0], start)) for start, end in others)
        self._history.append(span)
        self.cost = (wall, cpu, beside)
        self._fill()
        return element

    def drain(self) -> list[Any]:
        """Starts nothing more and takes the elements started, in order, up to the first
        that failed (whoever computes it next raises its error)."""
        for future in self._futures:
            future.cancel()
        elements = []
        for future in self._futures:
            if future.cancelled() or future.exception() is not None:
                break
            elements.append(future.result()[0])
        self.close()
        return elements

    def close(self) -> None:
        for future in self._futures:
            future.cancel()
        self._futures.clear()
        self._ended.set()  # a staggered element starts now, not after its wait
        self._pool.shutdown(wait=True)

    def release(self, park: Callable[[Any], None]) -> None:
        self.close()  # threads start in microseconds: none are kept


def open_executor(
    fetch: Fetch, start: int, stop: int, *, workers: int, ahead: int, stagger: float = 0.0
) -> Any:
    """An executor of `workers` threads (0: inline) reading `ahead` elements ahead."""
    if workers == 0 and ahead == 0:
        return Inline(fetch, start, stop)
    return Threads(fetch, start, stop, max(workers, 1), max(ahead, 2 * workers), stagger)


def for_pipeline(dataset: Any, node: Any, key: tuple[int, ...], start: int, stop: int) -> Any:
    """The executor for iterating `dataset` (whose plan is `node`) from `start`, or None
    when its elements are computed inline (no parallel map, no prefetch)."""
    import functools

    from phalanx._src.data import element_ops, plan

    maps = [n for n in plan.chain(node) if isinstance(n, element_ops.Map) and n.workers]
    prefetch = dataset._prefetch
    if not maps and not prefetch:
        return None
    processes = any(m.kind == "process" for m in maps)
    fixed = max((m.workers for m in maps if m.workers > 0), default=0)
    fetch = functools.partial(plan.element, node, key)

    def make(workers: int, step: int, end: int, stagger: float = 0.0) -> Any:
        ahead = max(prefetch, 2 * workers)
        if processes and workers > 0:
            from phalanx._src.data.workers import Processes

            pool = dataset._unpark(node, workers)
            if pool is None:
                # 4 elements in flight per worker hide the hand-over latency of a busy host.
                pool = Processes(node, workers, max(4, -(-ahead // workers)))
            return pool.begin(key, step, end)
        return open_executor(fetch, step, end, workers=workers, ahead=ahead, stagger=stagger)

    tuned_map = any(m.workers == AUTOTUNE for m in maps)
    if not tuned_map and (fixed or prefetch != AUTOTUNE):
        return make(fixed, start, stop)
    options = dataset.options()
    cap = options.threading.private_threadpool_size or cpu_count()
    top = max(fixed, cap) if tuned_map else 1
    if not options.autotune.enabled:
        return make(top, start, stop)
    tuner = dataset._tuner_for(top, "process" if processes else "thread")
    return autotune.Autotuned(tuner, fetch, make, start, stop)


# -- a streaming map computed by threads ------------------------------------------------------


@dataclasses.dataclass(eq=False)
class ParallelStreamMap(Stream):
    """`map(fn, num_parallel_calls=N)` after a streaming op (records, filter, generators).

    The parent is read in order in the consuming thread; up to N tasks are mapped at once
    by threads and handed back in order. A task maps a few consecutive elements: handing
    one element to a thread and its result back costs two thread wake-ups and GIL
    hand-overs, ~45 us of CPU per element on a 2-core VM (a constant map: 36 us per record
    inline, 79-84 in threads), so a task holds as many elements as take ~5 ms to map (at
    most 8; one in AUTOTUNE's bursts). The state is the parent's state *after the last
    element handed out* (snapshotted when it was read), so a restored iterator continues
    exactly, whatever was computed ahead. Random ops inside `fn` draw from the element's
    stream (its position in this iteration), as in random-access maps. AUTOTUNE times each
    task where it runs and follows a `Tuner` kept on the node, as `autotune.Autotuned`.
    """

    parent: Any
    fn: Callable[..., Any]
    workers: int  # 0: inline; N threads; AUTOTUNE
    tuner: Any = None  # the AUTOTUNE decision, shared by this node's iterations

    @property
    def cardinality(self) -> float | None:
        return self.parent.cardinality

    def open(self, key: tuple[int, ...], state: dict | None) -> Any:
        if self.workers == AUTOTUNE:
            with _tuner_lock:
                if self.tuner is None:
                    self.tuner = autotune.Tuner(max_level=cpu_count())
        return _ParallelMapCursor(self, key, state)


_TASK_SECONDS = 0.005  # a thread's task maps about this long (see ParallelStreamMap)
_MAX_TASK = 8  # elements in one task at most
_tuner_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class _Raised:
    """The exception an element's map raised, handed out in that element's place."""

    error: Exception


def _call(node: ParallelStreamMap, key: tuple[int, ...], element: Any, position: int) -> Any:
    # The words a random-access map over the same chain uses: the same numbers.
    with randomness.element_stream(map_words(node, key, position)):
        out = stream.call(node.fn, element)
    return validation.to_numpy_tree(out, "map output")


def _call_task(
    node: ParallelStreamMap, key: tuple[int, ...], elements: list, first: int
) -> tuple[list, float, float]:
    """Maps consecutive elements in a worker thread: their results (a `_Raised` for each
    that raised) and the wall and CPU seconds it took. A function, not a method: an error's
    traceback holds these frames, and through `results` they hold the error, so they must
    not hold the cursor, which that cycle would keep alive with its threads."""
    began, cpu, results = time.perf_counter(), time.thread_time(), []
    for offset, element in enumerate(elements):
        try:
            results.append(_call(node, key, element, first + offset))
        except Exception as error:  # raised in the consumer when it reaches the element
            results.append(_Raised(error))
    return results, time.perf_counter() - began, time.thread_time() - cpu


class _ParallelMapCursor:
    def __init__(self, node: ParallelStreamMap, key: tuple[int, ...], state: dict | None) -> None:
        self.node, self.key = node, key
        self.parent = stream.open_node(node.parent, key, None if state is None else state["parent"])
        self.position = 0 if state is None else int(state["position"])
        self._read = self.position  # elements read from the parent
        self._parent_state = self.parent.state()
        self._pending: collections.deque = collections.deque()  # (future, states, width)
        self._ready: collections.deque = collections.deque()  # (result, state, width)
        self._task = 1  # elements per task, from the time one takes to map (see _learn)
        self._done = False
        self._pool: Any = None
        self._tuner = node.tuner if node.workers == AUTOTUNE else None
        self._width = node.workers if self._tuner is None else self._tuner.level
        self._budget: int | None = None  # elements an AUTOTUNE burst may still start
        self._returned: float | None = None  # when the consumer took the last timed element
        self._skip = 0  # inline elements to map untimed before the next timed one
        self._untimed = 0  # of them, handed out and not told to the tuner yet

    def _fill(self) -> None:
        if self._pool is None and self._pending:
            # AUTOTUNE left a width: its tasks finish first, or the new pool would compute
            # ahead while they are handed out.
            return
        while not self._done and len(self._pending) < 2 * self._width and self._budget != 0:
            elements, states = [], []
            while len(elements) < (1 if self._budget is not None else self._task):
                try:
                    elements.append(next(self.parent))
                except StopIteration:
                    self._done = True
                    break
                states.append(self.parent.state())
            if not elements:
                return
            if self._budget is not None:
                self._budget -= 1
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self._width, thread_name_prefix=f"phalanx-map-{next(_ids)}"
                )
            future = self._pool.submit(_call_task, self.node, self.key, elements, self._read)
            self._pending.append((future, states, self._width))
            self._read += len(elements)

    def _learn(self, mapped: int, seconds: float) -> None:
        """Sizes the next tasks from how long this one's elements took to map."""
        if mapped:
            self._task = max(1, min(_MAX_TASK, int(_TASK_SECONDS * mapped / max(seconds, 1e-9))))

    def _inline(self) -> Any:
        if self._pool is not None:  # AUTOTUNE chose the calling thread: no idle threads kept
            self.close()
        element = next(self.parent)  # StopIteration ends the iteration
        self._read += 1
        self._parent_state = self.parent.state()
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            result = _call(self.node, self.key, element, self._read - 1)
        except Exception:
            self.position += 1  # the element is passed: the next call maps the one after
            raise
        if self._tuner is not None and not self._skip:
            self._tuner.computed(0, time.perf_counter() - began, time.thread_time() - cpu)
        return result

    def _threaded(self) -> tuple[Any, int]:
        if not self._ready:
            self._fill()
            if not self._pending:
                self.close()
                raise StopIteration
            future, states, width = self._pending.popleft()
            try:
                results, wall, cpu = future.result()
            except BaseException:
                self.close()  # a traceback may keep this cursor alive: stop its threads now
                raise
            self._learn(len(results), wall)
            if self._tuner is not None and results:
                self._tuner.computed(width, wall, cpu, count=len(results))
            self._ready.extend((r, s, width) for r, s in zip(results, states, strict=True))
            self._fill()
        result, self._parent_state, width = self._ready.popleft()
        if isinstance(result, _Raised):
            # The element is passed, as a tf.data iterator goes on after an error (and
            # `ignore_errors` drops it). A traceback may keep this cursor alive: its
            # threads stop once their queued tasks are done, and the next call starts
            # new ones.
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
            self.position += 1
            error = result.error
            try:
                raise error
            finally:  # this frame (it holds the cursor) must not hold its error
                del error, result
        return result, width

    def __next__(self) -> Any:
        tuner = self._tuner
        if self._skip:  # AUTOTUNE inline, between two timed elements: the map alone
            result = self._inline()
            self._skip -= 1
            self.position += 1
            self._untimed += 1
            if not self._skip:
                tuner.skipped(self._untimed)
                self._untimed = 0
                self._returned = time.perf_counter()
            return result
        began, cpu = time.perf_counter(), time.thread_time()
        width = self._width
        if width == 0 and not self._pending and not self._ready:
            result = self._inline()
        else:
            result, width = self._threaded()
        self.position += 1
        if tuner is not None:
            self._tune(began, cpu, width)
        return result

    def _tune(self, began: float, cpu: float, width: int) -> None:
        tuner, ended = self._tuner, time.perf_counter()
        own = None if self._returned is None else began - self._returned
        # The consumer's own time runs from this hand-out to its next request, also after
        # an element that is not timed: else the next one's would hold every element
        # handed out between (a width left drains 2 x width tasks).
        self._returned = ended
        if width != self._width:  # mapped at the width left: not this width's time
            tuner.skipped(1)
            return
        level = tuner.consumed(own, ended - began, time.thread_time() - cpu)
        if not tuner.trial:
            self._budget = None
        if level != self._width:
            # In-flight tasks finish at the old width; new ones start on a pool of the new
            # width (the old pool would run as many at once as before), a burst's exactly.
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
            self._width = level
            self._budget = level if tuner.trial else None
        if level == 0 and not self._pending and not self._ready:
            self._skip = tuner.stride - 1

    def state(self) -> dict:
        return {"parent": self._parent_state, "position": self.position}

    def close(self) -> None:
        if self._untimed:
            self._tuner.skipped(self._untimed)
            self._untimed = 0
        self._ready.clear()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        if hasattr(self, "_ready"):  # else __init__ raised (the parent did not open): nothing runs
            self.close()
