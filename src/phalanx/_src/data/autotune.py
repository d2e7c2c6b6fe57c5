"""AUTOTUNE that never loses: measure what parallelism buys this pipeline, then keep the best.

Threads fight over the GIL: a map of small NumPy operations driven from Python runs about
half as fast on two threads as in the calling thread, while a map that releases the GIL
(large array kernels, decoding, file reads) gains. No rule decides this beforehand, so
`num_parallel_calls=AUTOTUNE` (and `prefetch(AUTOTUNE)`) measure it online: the elements are
computed at parallelism 0 (the calling thread alone), then 1, 2, 4, 8, ... workers (the
last level the CPU count), a window of elements each, and the pipeline settles on the
level whose *per-element wall time as the consumer sees it* is lowest. That time includes
the consumer's own work between elements and any slowdown the workers cause it, which is
what a training loop pays.

After the climb, the calling thread and the two best other levels are always measured
again, in turn, twice (the confirmation), however the climb's single windows compared: on a
loaded machine one 20 ms window can run at half speed, and a climb that gave up on a window,
or ranked two levels by one, chose by noise. On a shared VM a whole window can also run
~1.6x slower or faster for no reason of its own (the host's clock and scheduling follow
the load: the calling thread measured right after two busy threads, or after a pause, runs
slower for tens of ms). So every level, the calling thread included, is scored by the
median of all its windows (one odd window does not move it; the calling thread's first
window, measured while the pipeline warms up, is one of three), and a parallel level is
chosen only when it is faster than the calling thread by more than `margin` (10 %), so
AUTOTUNE is not slower than sequential by more than noise. An apparent gain between -10 %
and +35 % is within what the noise makes of one round: up to `rounds` rounds are measured
before it decides; a clear gain or loss decides after one.

Windows are short (3 elements and 20 ms at least, 1 element of warm-up after a switch):
an element is often a whole batch of 16-64 mapped examples, and the decision must come
early (earlier windows of 16 elements and 0.1 s took ~130 batches, longer than the
1,500-example runs of issue 34, which thus ran mostly at the levels being measured and
landed at ~1.0x sequential where 2 threads gave 1.8x). On 2 cores one round (9 windows)
takes ~240 elements of a 1 ms map and ~40 of a 10 ms one; three rounds ~480 and ~90.
Worker processes usually compute whole batches: their window is one burst (an element per
worker), and while measuring they start no more elements than the window needs (each one
in flight at a switch is handed out unmeasured): 24 batches on 2 cores, ~160 on 16.

The choice is kept on the Dataset, so later epochs start at it; `Tuner.describe()` (and
`Dataset.autotune_report`) says what was measured and chosen, and the choice is logged at
DEBUG level on the "phalanx.data" logger. Workers are threads unless the
map asked for processes (`map(fn, num_parallel_calls=AUTOTUNE, workers="process")`), in which
case the levels are process counts; AUTOTUNE never switches to processes on its own (they
need a picklable function and a `__main__` guard in scripts).

`Tuner` holds the decision and is fed measured windows, so its logic is tested with
injected timings; `Autotuned` is the executor that measures and switches.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

_MAX_WINDOW = 64  # elements in one measured window at most, however fast they are
# Gains (level 0's time over a level's) that one round of a shared VM's windows cannot tell
# apart from noise: another round is measured.
UNSURE = (0.9, 1.35)
_log = logging.getLogger("phalanx.data")


def per_element(intervals: Sequence[float], burst: int = 1) -> float:
    """The mean time between elements, not counting one isolated stall.

    N workers hand out elements in bursts of N: N-1 intervals near 0, then one gap of
    about N elements' time. So the intervals are summed burst by burst (`burst` = N), and
    one long stall in a window of 8 bursts or more (a compile in the consumer, a page-in)
    must not decide the level: a burst over 10x the median burst is counted as the
    median. (Compared interval by interval, the median at 8 workers is a near-0 one, and
    a burst's gap looked like a stall: 8 and 16 workers were measured 1.5-1,400x too
    fast.) A short window is kept whole: its gaps are the rate itself.
    """
    if not intervals:
        raise ValueError("a measured window needs at least one interval")
    burst = max(burst, 1)
    sums = sorted(sum(intervals[i : i + burst]) for i in range(0, len(intervals), burst))
    total = sum(sums)
    middle = sums[len(sums) // 2]
    if len(sums) >= 8 and sums[-1] > 10 * middle:
        total += middle - sums[-1]
    return total / len(intervals)


@dataclasses.dataclass
class Tuner:
    """Chooses a pipeline's parallelism (0: the calling thread) from measured windows.

    Levels 0, 1 and 2 are tried, then 4, 8, ... and `max_level` while each is not clearly
    worse than the one tried before it; then level 0 and the two best other levels are
    measured `confirmations` more times each, in turn. Each level's score is the median of
    its windows (the slower middle one of an even count); the best parallel level wins if
    it beats level 0 by `margin`. While the best one's gain is ambiguous (within
    `UNSURE`), up to `rounds` rounds are measured.

    Args:
      max_level: the most workers to try (the CPU count for a map, 1 for a prefetch).
      margin: the relative gain a parallel level needs over the calling thread (0.10).
      warmup: elements ignored after each switch (pool start-up, first calls).
      window: elements measured per trial (at least; longer while under `min_seconds`).
      min_seconds: a trial's shortest duration, so that timer noise stays small.
      confirmations: how many more times level 0 and the two best other levels are
        measured, in turn, in a round.
      rounds: the most rounds measured while the gain is ambiguous.

    Example:
      >>> tuner = Tuner(max_level=2)
      >>> while not tuner.settled:
      ...     tuner.observe(intervals_measured_at(tuner.level))
      >>> tuner.choice
    """

    max_level: int
    margin: float = 0.10
    warmup: int = 1
    window: int = 3
    min_seconds: float = 0.02
    confirmations: int = 2
    rounds: int = 3
    kind: str = "thread"  # what a level counts: "thread" or "process" workers
    samples: dict[int, list[float]] = dataclasses.field(default_factory=dict, init=False)
    # The window being measured, kept across iterators (a short epoch holds few elements).
    pending: list[float] = dataclasses.field(default_factory=list, init=False)
    since_switch: int = dataclasses.field(default=0, init=False)
    choice: int | None = dataclasses.field(default=None, init=False)
    elements: int = dataclasses.field(default=0, init=False)  # handed out while measuring
    level: int = dataclasses.field(default=0, init=False)
    _confirm: list[int] = dataclasses.field(default_factory=list, init=False)
    _climbing: bool = dataclasses.field(default=True, init=False)
    _candidates: list[int] = dataclasses.field(default_factory=list, init=False)  # confirming
    _rounds_done: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_level < 0:
            raise ValueError(f"max_level must be >= 0, got {self.max_level}")
        if self.max_level == 0:
            self.choice = 0

    @property
    def settled(self) -> bool:
        """Whether the choice is made (then `level` is `choice` for good)."""
        return self.choice is not None

    def enough(self, intervals: Sequence[float]) -> bool:
        """Whether a window of these intervals is long enough to be observed.

        At N workers elements tend to arrive in bursts of N, so a window holds a multiple
        of N intervals: whole bursts, whose mean is the rate.
        """
        n = len(intervals)
        if n >= _MAX_WINDOW:
            return True
        whole = n % max(self.level, 1) == 0
        return whole and n >= self.window and sum(intervals) >= self.min_seconds

    def tick(self, last: float | None, now: float) -> bool:
        """One element handed to the consumer at `now` (the one before at `last`, None for
        the first one an executor hands out): records the interval once past the warm-up,
        observes a full window, and says whether the level changed."""
        if last is not None and self.since_switch >= self.warmup:
            self.pending.append(now - last)
        self.since_switch += 1
        self.elements += not self.settled
        if not self.enough(self.pending):
            return False
        before = self.level
        self.observe(self.pending)
        return self.level != before

    def restart(self) -> None:
        """A new iteration starts at the current level: its workers start together, so
        its elements come in whole bursts from the first one on. A partial burst kept in
        the pending window from the iteration before is dropped: joined to the new bursts
        it would pair a short interval with none of the long ones (a window measured ~1.5x
        too fast at 2 workers when it spanned epochs)."""
        whole = len(self.pending) - len(self.pending) % max(self.level, 1)
        del self.pending[whole:]

    def needed(self, fresh: bool) -> int:
        """How many more elements the window at this level needs at the fewest (whole
        bursts, `window` intervals; more when they take under `min_seconds`), counting
        the unmeasured ones first: the warm-up, and one whose interval has no start
        (`fresh`: the first an executor hands out). An executor that computes ahead need
        not start more (`Autotuned` caps worker processes to this while measuring)."""
        burst = max(self.level, 1)
        have = len(self.pending)
        intervals = -(-max(self.window, have + 1) // burst) * burst - have
        unmeasured = max(self.warmup - self.since_switch, 1 if fresh else 0, 0)
        return intervals + unmeasured

    def carry_over(self, count: int) -> None:
        """The next `count` elements were started at the level just left (an executor that
        finishes its work in flight): they are not measured, as the warm-up is not."""
        self.since_switch -= count

    def observe(self, intervals: Sequence[float]) -> None:
        """Records a window measured at `self.level` and moves to the next level to try."""
        if self.settled:
            return
        before = self.level
        self.samples.setdefault(self.level, []).append(per_element(intervals, self.level))
        if self._climbing:
            self._climb()
        elif self._confirm:
            self.level = self._confirm.pop(0)
        else:
            self._decide()
        self.pending = []
        if self.level != before:
            self.since_switch = 0
        if self.settled:
            _log.debug("%s", self.describe())

    def describe(self) -> str:
        """What was measured (elements/s per level, window by window) and chosen."""

        def name(level: int) -> str:
            if level == 0:
                return "the calling thread"
            plural = "es" if self.kind.endswith("s") else "s"
            return f"{level} {self.kind}{plural if level > 1 else ''}"

        measured = "; ".join(
            f"{name(level)}: " + ", ".join(f"{1 / t:.4g}" for t in times)
            for level, times in sorted(self.samples.items())
        )
        if not self.settled:
            return (
                f"AUTOTUNE measuring (now at {name(self.level)}, {self.elements} elements so "
                f"far); elements/s: {measured}"
            )
        return (
            f"AUTOTUNE chose {name(self.choice)} after {self.elements} elements; elements/s "
            f"measured: {measured or '-'}"
        )

    def _time(self, level: int) -> float:
        return statistics.fmean(self.samples[level])

    def _climb(self) -> None:
        level = self.level
        below = max((lv for lv in self.samples if lv < level), default=0)
        # Levels 0, 1 and 2 are always tried: one worker only overlaps the consumer's own
        # work, so work that gains from two workers (I/O waits) may not gain from one.
        better_than_below = level < 2 or self._time(level) < self._time(below) * (1 + self.margin)
        if better_than_below and level < self.max_level:
            # Then doubling (4, 8, ..., and the top): 16 cores take 6 levels, not 17.
            self.level = level + 1 if level < 2 else min(2 * level, self.max_level)
            return
        self._climbing = False
        others = sorted((lv for lv in self.samples if lv > 0), key=self._time)
        self._candidates = others[:2]  # confirmed even when they looked worse than level 0
        self._next_round()

    def _next_round(self) -> None:
        """Measures level 0 and the candidates `confirmations` more times each, in turn."""
        self._rounds_done += 1
        self._confirm = self._candidates + [0, *self._candidates] * (self.confirmations - 1)
        self.level = 0

    def _decide(self) -> None:
        score = {lv: statistics.median_high(self.samples[lv]) for lv in (0, *self._candidates)}
        best = min(self._candidates, key=score.__getitem__)
        gain = score[0] / score[best]
        if UNSURE[0] < gain < UNSURE[1] and self._rounds_done < self.rounds:
            self._next_round()
            return
        wins = score[best] < score[0] * (1 - self.margin)
        self.choice = self.level = best if wins else 0


class Autotuned:
    """An executor that measures its consumer's per-element time and follows a `Tuner`.

    `factory(level, step)` opens the executor for a level at a step. Switching levels
    closes the current one (threads: work computed ahead is dropped; elements are pure
    functions of their step, so nothing is lost but time), except that worker processes,
    which take far longer to start than an element of a batched pipeline takes, are kept
    when there is a `park(pool, keep)` (`Dataset._park`): they finish the elements in
    flight, which are handed out next (unmeasured), and wait idle in the park, from which
    `factory` takes them back when the tuner returns to their level (it alternates the
    calling thread and the two best levels while confirming). Once settled, the other kept
    pools stop.
    """

    def __init__(
        self,
        tuner: Tuner,
        factory: Callable[[int, int], Any],
        start: int,
        clock: Callable[[], float] = time.perf_counter,
        park: Callable[..., None] | None = None,
    ) -> None:
        self._tuner = tuner
        self._factory = factory
        self._step = start
        self._clock = clock
        self._park = park
        self._executor: Any = None
        self._ready: collections.deque = collections.deque()  # drained from the last level
        self._last: float | None = None  # no interval before an iterator's first element
        self._capped = False  # whether the executor's starts are limited (`limit`)
        tuner.restart()

    @property
    def workers(self) -> int:
        return self._tuner.level

    @property
    def pids(self) -> list[int]:
        """The current level's worker processes (none for threads or inline)."""
        return list(getattr(self._executor, "pids", []))

    def next(self) -> Any:
        if self._ready:
            self._step += 1
            self._tuner.elements += not self._tuner.settled  # carried over, unmeasured
            return self._ready.popleft()
        if self._executor is None:
            self._executor = self._factory(self._tuner.level, self._step)
        if not self._tuner.settled and hasattr(self._executor, "limit"):
            # Worker processes start no more than the window needs, and the other workers'
            # next elements (so all stay busy to its end): few are in flight at a switch.
            burst = max(self._tuner.level, 1)
            self._executor.limit(self._step + self._tuner.needed(self._last is None) + burst - 1)
            self._capped = True
        element = self._executor.next()
        self._step += 1
        if not self._tuner.settled:
            self._measure()
        if self._capped and self._tuner.settled and self._executor is not None:
            self._executor.limit(None)  # the chosen level computes ahead freely
            self._capped = False
        if self._tuner.settled and self._park is not None and self._executor is not None:
            # Once the chosen level runs (its kept workers taken back), stop the others.
            self._park(None, keep=0)
            self._park = None
        return element

    def _measure(self) -> None:
        now = self._clock()
        changed, self._last = self._tuner.tick(self._last, now), now
        if changed:
            self._leave()  # the next call opens the new level where this one stopped
            self._last = None

    def _leave(self) -> None:
        """Leaves the current level: threads stop; worker processes hand over the elements
        in flight and are parked with the pool parked before them (2: the climb's last two
        levels, or the two best ones while confirming), or stop when the tuner has just
        chosen another level."""
        executor, self._executor = self._executor, None
        if self._park is None or not hasattr(executor, "drain"):
            executor.close()
            return
        self._ready.extend(executor.drain())
        if self._tuner.settled:  # the choice is another level: this one is not needed again
            executor.close()
            return
        executor.release(functools.partial(self._park, keep=2))

    def close(self) -> None:
        self._ready.clear()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    def release(self, park: Callable[[Any], None]) -> None:
        """At an iteration's end: the current level's executor may be kept (`park`; while
        measuring, with the level kept before it)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if not self._tuner.settled and self._park is not None:
            park = functools.partial(self._park, keep=2)
        executor.release(park)
