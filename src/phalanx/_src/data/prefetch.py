"""`DevicePrefetcher`: host batches made ahead in a thread, then put on devices ahead.

Why: a training step should never wait for its input. While step i runs, a background
thread computes host batches i+1, i+2, ... into a bounded queue (`host_depth`), and the
consumer has already called `put_fn` (the strategy's sharded `device_put`, which only
enqueues a transfer) on the next `device_depth` batches, so their copies overlap step i.
Like grain's experimental `device_put`: host prefetch, then `device_put`, then a small
device-side buffer. `put_fn` runs in the consuming thread, where JAX dispatch belongs.

Skip it (iterate the source directly) when debugging input code: a stack trace from the
producer thread is re-raised in the consumer but its frames start in the thread.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from phalanx._src import shutdown
from phalanx._src.data import validation
from phalanx._src.data.autotune import Tuner
from phalanx._src.strategy import device_batch

_END = object()
_POLL_S = 0.05  # How often a blocked producer or consumer rechecks the stop flag.
_ids = itertools.count()


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def _is_checkpointable(iterator: Any) -> bool:
    declared = getattr(iterator, "checkpointable", None)
    if declared is not None:
        return bool(declared)
    # Grain's iterators say nothing but have both methods.
    return callable(getattr(iterator, "get_state", None)) and callable(
        getattr(iterator, "set_state", None)
    )


def _checked(put_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`put_fn` behind the device boundary's check: strings and Python objects are legal on
    the host, but a batch holding them gets a clear error here instead of one from XLA."""

    def put(batch: Any) -> Any:
        device_batch.check_device_batch(batch, "DevicePrefetcher's put_fn input")
        return put_fn(batch)

    return put


class _Maker:
    """Makes the next host batch (`put` on it in the thread, if asked), timed for AUTOTUNE;
    called by the thread (width 1) and by the consumer on its own turn (width 0). It holds
    nothing of its prefetcher, so the thread does not keep a dropped prefetcher alive."""

    def __init__(
        self,
        source: Any,
        put: Callable[[Any], Any],
        put_in_thread: bool,
        tuner: Tuner | None,
        clock: Callable[[], float],
        cpu: Callable[[], float],
    ):
        self.source, self.put, self.put_in_thread = source, put, put_in_thread
        self.tuner, self.clock, self.cpu = tuner, clock, cpu

    def __call__(self, width: int) -> Any:
        began, cpu = self.clock(), self.cpu()
        batch = next(self.source)
        if width and self.put_in_thread:
            batch = self.put(batch)
        if self.tuner is not None:
            self.tuner.computed(width, self.clock() - began, self.cpu() - cpu)
        return batch


class _Producer:
    """The thread's side of a `DevicePrefetcher`: reads the source into a bounded queue
    until the end, an error, or `halt()`.

    It holds no reference to its prefetcher, so a prefetcher its user dropped mid-way is
    collected, and its finalizer halts this thread (joined, never left running into the
    interpreter's exit with device arrays in its frames: see `shutdown`).
    """

    def __init__(self, make: _Maker, depth: int, saves: bool):
        self.make, self.saves = make, saves
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.leftover: Any = None  # what it made after it was told to stop
        self.thread = threading.Thread(
            target=self._run, name=f"phalanx-prefetch-{next(_ids)}", daemon=True
        )
        self.thread.start()

    def _offer(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while True:
                try:
                    batch = self.make(1)
                except StopIteration:
                    break
                state = self.make.source.get_state() if self.saves else None
                if not self._offer((batch, state)):
                    self.leftover = (batch, state)  # kept for the consumer's own turn
                    return
                del batch  # not held while blocked in the next read
            if not self._offer(_END):
                self.leftover = _END
        except BaseException as error:  # Everything, even KeyboardInterrupt, goes to the consumer.
            if not self._offer(_Raised(error)):
                self.leftover = _Raised(error)

    def halt(self) -> None:
        """Tells the thread to stop and waits for it."""
        self.stop.set()
        self.thread.join()


class DevicePrefetcher:
    """Iterates `put_fn(batch)` for every batch of `iterable`, prepared ahead of use.

    A context manager: leaving the `with` block (normally, by an exception, or by
    KeyboardInterrupt) or calling `close()` stops and joins the producer thread. It also
    closes itself when the source is exhausted or raises; a producer's exception is
    re-raised in the consumer, after the batches produced before it.

    `get_state()` returns the source iterator's state *as of the last batch returned to the
    consumer*, not of the batches read ahead, so a checkpoint resumes exactly.

    Args:
      iterable: host batches (a Dataset, a DatasetIterator, any iterable).
      put_fn: turns a host batch into device arrays; identity when None.
      host_depth: host batches computed ahead by the thread (>= 1).
      device_depth: batches already handed to `put_fn` ahead of the consumer (>= 1).
      put_in_thread: call `put_fn` in the producer thread too, so the consumer only takes
        ready device batches (JAX transfers are thread-safe). Worth it when the consumer's
        time is precious, e.g. when dispatching a step is what keeps the devices busy.
      autotune: choose, as `prefetch(AUTOTUNE)` does (`autotune.Tuner`), between the
        thread and the consumer making each batch itself when it asks: the thread pays
        where the consumer's own work (a step) overlaps the batches' making, not where
        both hold the GIL. Batches already made by the thread are handed out first on a
        switch. Pass a `Tuner(max_level=1)` instead of True to keep the measurements and
        the choice from one prefetcher (epoch) to the next.
      clock, cpu_clock: wall and thread CPU seconds, for `autotune`; tests inject theirs.

    Example:
      >>> with DevicePrefetcher(ds, put_fn=strategy_put, host_depth=2, device_depth=2) as batches:
      ...     for batch in batches:
      ...         state = step(state, batch)
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        put_fn: Callable[[Any], Any] | None = None,
        *,
        host_depth: int = 2,
        device_depth: int = 2,
        put_in_thread: bool = False,
        autotune: bool | Tuner = False,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        self._host_depth = validation.check_positive(host_depth, "host_depth", "host_depth=2")
        self._device_depth = validation.check_positive(
            device_depth, "device_depth", "device_depth=2"
        )
        self._source = iter(iterable)
        self._put = _checked(put_fn) if put_fn is not None else (lambda batch: batch)
        self._put_in_thread = put_in_thread
        self._checkpointable = _is_checkpointable(self._source)
        self._state = self._source.get_state() if self._checkpointable else None
        self._device: collections.deque = collections.deque()
        self._producer: _Producer | None = None
        self._finalizer: weakref.finalize | None = None  # halts the producer if dropped
        self._pending: Any = None  # _END or _Raised, once the producer has sent it.
        self._closed = False
        self._taken = False
        # autotune: level 0 makes each batch in the consumer's thread, level 1 in the thread.
        if isinstance(autotune, Tuner):
            self._tuner: Tuner | None = autotune  # kept by the caller across epochs
        else:
            self._tuner = Tuner(max_level=1) if autotune else None
        self._clock, self._cpu = clock, cpu_clock
        self._returned: float | None = None  # when the consumer took the last batch
        self._make = _Maker(self._source, self._put, put_in_thread, self._tuner, clock, cpu_clock)

    @property
    def checkpointable(self) -> bool:
        """Whether `get_state` works (the source iterator has get_state/set_state)."""
        return self._checkpointable

    def get_state(self) -> Any:
        """The source's state after the last batch this prefetcher returned."""
        if not self._checkpointable:
            raise TypeError(f"{type(self._source).__name__} does not support get_state().")
        return self._state

    def set_state(self, state: Any) -> None:
        """Restores the source's position; only before the first batch is taken."""
        if self._taken or self._producer is not None:
            raise RuntimeError("set_state() must come before the first batch is taken.")
        self._source.set_state(state)
        self._state = state

    def _take(self, block: bool) -> bool:
        """Moves one host batch to the device buffer; False when none is (yet) available."""
        if self._pending is not None:
            return False
        while True:
            try:
                source = self._producer.queue
                item = source.get(timeout=_POLL_S) if block else source.get_nowait()
                break
            except queue.Empty:
                if not block:
                    return False
                if not self._producer.thread.is_alive():
                    # It may have sent its last item just before exiting.
                    block = False
        if item is _END or isinstance(item, _Raised):
            self._pending = item
            return False
        batch, state = item
        self._device.append((batch if self._put_in_thread else self._put(batch), state))
        return True

    def __iter__(self) -> DevicePrefetcher:
        return self

    def ready(self) -> bool:
        """Whether `next` would return at once (a batch, or the end) without waiting."""
        if self._device or self._pending is not None or self._closed:
            return True
        if self._producer is None:
            return False
        self._take(block=False)
        return bool(self._device) or self._pending is not None

    def start(self) -> DevicePrefetcher:
        """Starts reading ahead now (e.g. while the step compiles); `next` does it otherwise.

        While AUTOTUNE has the consumer make its own batches, there is no thread to start.
        """
        if self._producer is None and not self._closed and self.threaded:
            self._producer = _Producer(self._make, self._host_depth, self._checkpointable)
            self._finalizer = weakref.finalize(self, self._producer.halt)
            shutdown.track(self)
        return self

    @property
    def threaded(self) -> bool:
        """Whether batches are being made in the thread (False: by the consumer, when it
        asks, after AUTOTUNE measured that to be faster)."""
        return self._tuner is None or self._tuner.level == 1

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        self._taken = True
        if self._tuner is None:
            return self._next_threaded()
        began, cpu = self._clock(), self._cpu()
        threaded = self.threaded
        made_before = not threaded and bool(self._device)  # by the thread, before a switch
        batch = self._next_threaded() if threaded else self._next_inline()
        ended = self._clock()
        if made_before:
            self._tuner.skipped(1)
        else:
            own = None if self._returned is None else began - self._returned
            level = self._tuner.consumed(own, ended - began, self._cpu() - cpu)
            if threaded and level == 0:
                self._stop_thread()
                ended = None  # the switch's own time is not the consumer's
        self._returned = ended
        return batch

    def _next_threaded(self) -> Any:
        self.start()
        if not self._device:
            self._take(block=True)
        if not self._device:
            pending = self._pending
            self.close()
            if isinstance(pending, _Raised):
                raise pending.error
            raise StopIteration
        batch, self._state = self._device.popleft()
        # Hand the next batches to put_fn now, so their transfers overlap this step.
        while len(self._device) < self._device_depth and self._take(block=False):
            pass
        return batch

    def _next_inline(self) -> Any:
        if self._device:  # made by the thread before the switch
            batch, self._state = self._device.popleft()
            return batch
        if self._pending is not None:
            pending = self._pending
            self.close()
            if isinstance(pending, _Raised):
                raise pending.error
            raise StopIteration
        try:
            batch = self._make(0)
        except BaseException:
            self.close()
            raise
        self._state = self._source.get_state() if self._checkpointable else None
        return self._put(batch)

    def _stop_thread(self) -> None:
        """Stops the thread and keeps, in order, every batch it made for the consumer."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        self._finalizer.detach()
        producer.halt()
        while self._pending is None:
            try:
                item = producer.queue.get_nowait()
            except queue.Empty:
                break
            if item is _END or isinstance(item, _Raised):
                self._pending = item
                break
            batch, state = item
            self._device.append((batch if self._put_in_thread else self._put(batch), state))
        leftover = producer.leftover
        if leftover is _END or isinstance(leftover, _Raised):
            self._pending = self._pending or leftover
        elif leftover is not None and self._pending is None:
            batch, state = leftover
            self._device.append((batch if self._put_in_thread else self._put(batch), state))

    def close(self) -> None:
        """Stops the producer thread and waits for it; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        producer, self._producer = self._producer, None
        if producer is not None:
            self._finalizer.detach()
            producer.halt()
        shutdown.forget(self)
        self._device.clear()
        close = getattr(self._source, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
