"""AUTOTUNE: one model of what an element costs, and the number of workers it asks for.

Measured the run through: where each element is computed (a worker, or the calling
thread), its wall and thread CPU time (wall minus CPU: what it waited, for the GIL among
others); in the consumer, its own time between two requests (`own`), its waits, and the
CPU it spends taking an element from the workers (`handle`). The model is tf.data's
autotuner's, with the GIL as one more shared resource: an element alone takes `w0`
(timed inline), so inline an element comes every `w0 + own`; m workers deliver
`S(m) = m / (1 + s(m) (m - 1))` elements per `w0`: `s(m)`, the serial share, is what an
element beside m - 1 others loses to them (~1 or more for a map that holds the GIL, ~0
for one that releases it), a line `sigma + kappa m` fitted to the widths measured (the
universal scalability law: each GIL hand-over wakes one of more waiters; `kappa = 0` is
Amdahl's), so past some width more threads are slower. An element comes every
`max(own + handle, w0 / S(m))`. AUTOTUNE runs the fewest workers within `MARGIN` of the
best, capped by the cores. `s` shows only where elements run side by side: while it is
unknown or stale, one burst of 2 threads measures it (2 elements, no more, the second
started half an element late; about half an element's time on a GIL-bound map). Widths
left are measured again when that costs less than `BUDGET` of the elements since.
docs/input-performance.md ("AUTOTUNE") says more.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MARGIN = 0.10  # more workers must be predicted this much faster than fewer
CHECK = 8  # timed elements between two re-evaluations
BUDGET = 0.01  # the share of the run spent measuring again widths that were left
_TIMING_S = 5e-6  # timing an element inline (and its share of a decision): 1/10 of BUDGET
_SPAN = 8  # samples a running mean averages over
# The same for what the consumer does: its own time comes in bursts (a batch's stacking,
# once in 64 elements: 4-80 ms where an element takes 0.5), and its intervals in bursts of
# N workers. Their means must span several bursts, or one decides the width.
_BURSTS = 256
_log = logging.getLogger("phalanx.data")


class _Mean:
    """The mean of the first `span` samples, then an exponential mean of that span."""

    __slots__ = ("count", "span", "value")

    def __init__(self, span: int = _SPAN) -> None:
        self.value: float | None = None
        self.count, self.span = 0, span

    def add(self, x: float, weight: int = 1) -> None:
        self.count += weight
        if self.value is None:
            self.value = x
        else:
            self.value += (x - self.value) * min(1.0, weight / min(self.count, self.span))


class Tuner:
    """How many workers compute a pipeline's elements (0: the calling thread), and why.

    Fed by its drivers (`Autotuned`, the streaming map, `DevicePrefetcher`) with what each
    element cost where it was computed (`computed`) and in the consumer (`consumed`, which
    returns the width for the next ones). Locked: iterators in several threads may feed it.

    Args:
      max_level: the most workers (the cores, or `private_threadpool_size`; 1 for a
        prefetch thread).
      kind: "thread" or "process" (no GIL between workers).

    Example:
      >>> tuner = Tuner(max_level=2)
      >>> tuner.computed(0, wall=0.010, cpu=0.010)          # an element, computed inline
      >>> width = tuner.consumed(own=0.0, wait=0.010, cpu=0.010)
      >>> tuner.describe()
    """

    def __init__(self, max_level: int, kind: str = "thread") -> None:
        if max_level < 0:
            raise ValueError(f"max_level must be >= 0, got {max_level}")
        self.max_level, self.kind = max_level, kind
        self.level = 0  # the width elements are computed at now
        self.trial = False  # whether `level` is a burst that measures the serial share
        self.choice: int | None = 0 if max_level == 0 else None  # the last width chosen
        self.elements = 0  # handed to the consumer so far
        self.changed_at = 0  # elements handed out when `choice` last changed
        self._lock = threading.Lock()
        self._alone, self._cpu0 = _Mean(), _Mean()  # an element computed inline
        self._shares: dict[int, _Mean] = {}  # width: the serial share measured there
        self._own, self._handle = _Mean(_BURSTS), _Mean()  # the consumer's, at any width
        self._wall, self._cpu = _Mean(), _Mean()  # an element's, at `level`
        self._interval = _Mean(_BURSTS)  # the consumer's, at `level`
        self._seen: dict[int, tuple[float, int]] = {}  # width: (interval, trusted until)
        self._timed = 0  # elements timed by the consumer
        self._due = 1  # `_timed` at the next decision
        self._serial_until = 0  # the serial share is trusted until then (elements)
        if kind != "thread":  # no GIL between processes
            self._shares[2] = _Mean()
            self._shares[2].add(0.0)
            self._serial_until = sys.maxsize

    @property
    def settled(self) -> bool:
        """Whether a width was chosen (not only measured)."""
        return self.choice is not None

    @property
    def stride(self) -> int:
        """Inline, after a choice: time one element in this many (1 while measuring)."""
        if self.choice is None or self.level or not self.alone:
            return 1
        return min(1024, max(1, math.ceil(_TIMING_S / (BUDGET / 10 * self.alone))))

    @property
    def alone(self) -> float:
        """Seconds an element takes computed alone (0 before any was timed)."""
        return self._alone.value or 0.0

    def computed(
        self, width: int, wall: float, cpu: float, beside: float | None = None, count: int = 1
    ) -> None:
        """`count` elements computed by `width` workers (0: inline) took `wall` and `cpu`
        seconds in all, where they were computed, while the other workers computed for
        `beside` seconds (None: all the while)."""
        with self._lock:
            wall, cpu = wall / count, cpu / count
            if width == self.level:
                self._wall.add(wall, count)
                self._cpu.add(cpu, count)
            if width == 0:  # the calling thread alone
                self._alone.add(wall, count)
                self._cpu0.add(cpu, count)
            elif width > 1 and self._alone.value is not None:
                # Beside n others an element runs at 1 / (1 + s n) of its speed alone, so
                # it takes `excess` = beside s / (1 + s n) longer (beside: n times the time
                # shared): its waits for the GIL, and the work contention adds.
                others = width - 1
                beside = others * wall if beside is None else beside / count
                excess = max(wall - self._alone.value, 0.0)
                if beside > 0.1 * wall and beside > others * excess:
                    share = self._shares.setdefault(width, _Mean())
                    share.add(excess / (beside - others * excess), count)
                    self._serial_until = max(self._serial_until, self.elements + CHECK)

    def consumed(self, own: float | None, wait: float, cpu: float, fill: bool = False) -> int:
        """The consumer took an element: `own` seconds of its own work before asking
        (None: unknown), then `wait` seconds asking, `cpu` of them on its CPU; `fill`: one
        of the first elements of workers just started, which waited for their start and
        for a whole element. Returns the width for the next elements."""
        with self._lock:
            self.elements += 1
            if self._alone.value is None:  # nothing timed inline yet
                return self.level
            if own is not None:
                self._own.add(own)
            if self.level and not fill:
                self._handle.add(cpu)
                self._interval.add((own or 0.0) + wait)
            self._timed += 1
            if self._timed >= self._due:
                self._decide()
            return self.level

    def skipped(self, count: int) -> None:
        """`count` elements were handed out untimed (inline, between two timed ones)."""
        with self._lock:
            self.elements += count

    def _serial(self) -> tuple[float, float]:
        """(sigma, kappa) of the serial share `s(m) = sigma + kappa m` (the module doc):
        least squares over the widths measured, weighted by their samples."""
        points = [(m, mean.value, min(mean.count, _SPAN)) for m, mean in self._shares.items()]
        total = sum(w for _, _, w in points)
        m_bar, s_bar = (sum(p[i] * p[2] for p in points) / total for i in (0, 1))
        spread = sum(w * (m - m_bar) ** 2 for m, _, w in points)
        slope = sum(w * (m - m_bar) * (v - s_bar) for m, v, w in points) / spread if spread else 0
        return s_bar - max(slope, 0.0) * m_bar, max(slope, 0.0)

    def _predict(self, width: int, serial: tuple[float, float] | None) -> float:
        """Seconds between two elements the consumer takes, with `width` workers: measured
        at the current width (walls, or the consumer's intervals if longer; a burst's by
        its share) and at widths measured lately, else the model (`serial` None: s = 0)."""
        alone = self._alone.value
        own = self._own.value or 0.0
        if width == 0:
            return alone + own
        floor = own + (self._handle.value or 0.0)  # the consumer's own part
        measured = width == self.level and self._wall.value is not None
        if measured and not (self.trial and serial is not None):
            return max(floor, self._wall.value / width, self._interval.value or 0.0)
        interval, until = self._seen.get(width, (0.0, 0))
        if self.elements < until:
            return interval
        share = 0.0 if serial is None else max(serial[0] + serial[1] * width, 0.0)
        return max(floor, alone * (1 + share * (width - 1)) / width)

    def _decide(self) -> None:
        level = self.level
        known = bool(self._shares) and self.elements < self._serial_until
        serial = self._serial() if known else None
        predicted = [self._predict(m, serial) for m in range(self.max_level + 1)]
        best = min(predicted)
        pick = next(m for m, t in enumerate(predicted) if t <= best * (1 + MARGIN))
        if level and pick != level and self._wall.value is not None:
            # What was measured here is trusted while measuring it again (a burst of 2, or
            # CHECK elements) would cost more than BUDGET of the elements since.
            burst = 2 if level >= 2 and self.kind == "thread" else CHECK
            lost = burst * max(predicted[level] / predicted[pick] - 1, 0.0)
            until = self.elements + max(2 * CHECK, int(lost / BUDGET))
            self._seen[level] = (predicted[level], until)
            if level >= 2 and self.kind == "thread":
                self._serial_until = until
        fresh = self.elements < self._seen.get(pick, (0.0, 0))[1]
        # (Elements too short to overlap leave it unknown: then the width runs on, measured.)
        self.trial = pick >= 2 and not known and not fresh and not self.trial
        if self.trial:  # one burst of 2 measures the serial share again (into the mean
            pick = 2  # of the earlier ones: one burst beside a batch's stacking reads high)
        self._due = self._timed + (pick if self.trial else CHECK)
        if pick != level:
            self.level, self._wall, self._cpu = pick, _Mean(), _Mean()
            self._interval = _Mean(_BURSTS)
        if not self.trial and pick != self.choice:
            self.choice, self.changed_at = pick, self.elements
            _log.debug("%s", self._describe())

    def describe(self) -> str:
        """What was measured (per element) and chosen, after how many elements."""
        with self._lock:
            return self._describe()

    def _name(self, width: int) -> str:
        if width == 0:
            return "the calling thread"
        return f"{width} {self.kind}{('es' if self.kind == 'process' else 's') * (width > 1)}"

    def _describe(self) -> str:
        elements = self.elements if self.choice is None else self.changed_at
        elements = f"{elements} element{'s' * (elements != 1)}"
        if self.choice is None:
            head = f"AUTOTUNE measuring (now at {self._name(self.level)}, {elements} so far)"
        else:
            head = f"AUTOTUNE chose {self._name(self.choice)} after {elements}"
        if self._alone.value is None:
            return head

        def ms(seconds: float) -> str:
            return f"{seconds * 1e3:.3g} ms"

        text = f"{head}; an element alone: {ms(self.alone)} ({ms(self._cpu0.value)} of CPU)"
        if self.level and self._wall.value is not None:
            text += f", with {self._name(self.level)}: {ms(self._wall.value)} "
            text += f"({ms(self._cpu.value)} of CPU)"
        serial = self._serial() if self._shares else None
        share = "not measured" if serial is None else f"{serial[0] + 2 * serial[1]:.2f}"
        if serial and serial[1]:  # as at 2 workers, and its growth
            share += f" with 2 workers, {serial[1]:+.3f} a worker"
        times = ", ".join(
            f"{self._name(m)} {ms(self._predict(m, serial))}" for m in range(self.max_level + 1)
        )
        own = self._own.value or 0.0
        return (
            f"{text}; serial share {share}; the consumer's own time {ms(own)}; "
            f"between elements: {times}"
        )


class Autotuned:
    """An executor that computes elements at the width its `Tuner` asks for, timing them.

    `fetch(step)` computes element `step` in the calling thread; `open(width, start, stop,
    stagger)` opens `width` workers for elements start..stop-1, the n-th started n *
    stagger seconds late (a burst's, which starts exactly its 2 elements): their `next()`
    returns them in order, `cost` the last one's (wall, cpu[, beside]), `drain()` those in
    flight, handed out next at a width change (elements are pure functions of their step).
    """

    def __init__(
        self,
        tuner: Tuner,
        fetch: Callable[[int], Any],
        open: Callable[[int, int, int], Any],
        start: int,
        stop: int,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._tuner, self._fetch, self._open = tuner, fetch, open
        self._step, self._stop = start, stop
        self._clock, self._cpu = clock, cpu_clock
        self._width = tuner.level
        self._executor: Any = None
        self._until = 0  # the executor starts no element at or past it
        self._ready: collections.deque = collections.deque()  # drained at a width change
        self._returned: float | None = None  # when the consumer took the last timed element
        self._skip = 0  # inline elements to compute untimed before the next timed one
        self._untimed = 0  # of them, handed out and not told to the tuner yet

    @property
    def pids(self) -> list[int]:
        """The current worker processes (none for threads or inline)."""
        return list(getattr(self._executor, "pids", []))

    def next(self) -> Any:
        if self._skip:  # inline, between two timed elements: the map alone
            element = self._fetch(self._step)
            self._step += 1
            self._skip -= 1
            self._untimed += 1
            if not self._skip:
                self._flush()
                self._returned = self._clock()
            return element
        if self._ready:
            self._step += 1
            self._tuner.skipped(1)  # computed at the width left: not this width's time
            return self._ready.popleft()
        began, cpu = self._clock(), self._cpu()
        own = None if self._returned is None else began - self._returned
        fill = self._width and (self._executor is None or self._step >= self._until)
        if self._width == 0:
            element = self._fetch(self._step)
            ended, used = self._clock(), self._cpu() - cpu
            self._tuner.computed(0, ended - began, used)
        else:
            if fill:  # the first element waits for the workers' start
                self._reopen()
            element = self._executor.next()
            ended, used = self._clock(), self._cpu() - cpu
            self._tuner.computed(self._width, *self._executor.cost)
        self._step += 1
        width = self._tuner.consumed(own, ended - began, used, bool(fill))
        self._returned = ended
        if width != self._width:
            self._switch(width)
            self._returned = None  # the switch's own time is not the consumer's
        self._skip = self._tuner.stride - 1 if width == 0 else 0
        return element

    def _flush(self) -> None:
        if self._untimed:
            self._tuner.skipped(self._untimed)
            self._untimed = 0

    def _reopen(self) -> None:
        if self._executor is not None:  # a burst's workers, done
            self._executor.close()
        burst = self._tuner.trial  # 2 elements side by side, and no more
        self._until = min(self._stop, self._step + self._width) if burst else self._stop
        # A burst's second element starts half an element late: half the overlap still
        # measures the serial share, and a GIL-bound map loses half as much to it.
        stagger = self._tuner.alone / 2 if burst else 0.0
        self._executor = self._open(self._width, self._step, self._until, stagger)

    def _switch(self, width: int) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            self._ready.extend(executor.drain())
            executor.close()
        self._width = width

    def close(self) -> None:
        self._flush()
        self._ready.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    def release(self, park: Callable[[Any], None]) -> None:
        """At an iteration's end: worker processes may be kept for the next (`park`)."""
        self._flush()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.release(park)
