"""`Trial`: with `steps_per_execution='auto'`, the first training calls measure which way
runs a step faster, and the faster is kept.

K steps per call run as one compiled `lax.scan` (SCAN) or as K single calls (LOOP). The
scan saves K-1 dispatches and host round trips, but its body may run slower than the
single step: on XLA:CPU a convolution inside a loop misses the fast path (3.6-8x for the
families' CNN and ResNet, `benchmarks/bench_steps_per_execution.py`; stack-facts section
9), and each step copies its batch out of the stacked input. Where the model's forward
pass already rules the scan out (`execution.choose_mode`: a convolution on XLA:CPU) no
trial runs. Otherwise the first two items are made as K single calls and timed from their
second call on (a first call may compile), then scan calls, timed from the second (the
first compiles). Each time is an item's wall time over its steps, the queue drained
before it and its last logs read after it, as the loop reads them; each mode's fastest of
`SAMPLES` items counts (another job on the machine only ever slows an item down). The
mode with the shorter step is kept for the rest of the build, so `auto` never runs a step
slower than single calls do, beyond the trial's own calls and one more compiled program.

Example:
  >>> trial = Trial()
  >>> trial.mode()                       # the next item's mode: LOOP, then SCAN
  >>> watch = trial.watch(LOOP, calls=50, steps=1)
"""

from __future__ import annotations

import time
from typing import Any

import jax

from phalanx._src.train.engine.execution import LOOP, SCAN

SAMPLES = {LOOP: 2, SCAN: 3}  # items timed in each mode


class Trial:
    """The measurement above, for one build's training calls."""

    def __init__(self) -> None:
        self.made = {LOOP: 0, SCAN: 0}  # items made in each mode
        self.seen = {LOOP: 0, SCAN: 0}  # items dispatched in each mode
        self.per_step: dict[str, list[float]] = {LOOP: [], SCAN: []}  # seconds a step
        self.decided: str | None = None

    def mode(self) -> str:
        """The mode for the next items made: the decision, else LOOP for the first items
        and SCAN after them."""
        if self.decided is not None:
            return self.decided
        timed = len(self.per_step[LOOP]) >= SAMPLES[LOOP]
        return LOOP if not timed and self.made[LOOP] < 2 * SAMPLES[LOOP] else SCAN

    def note_made(self, mode: str, items: int) -> None:
        self.made[mode] += items

    def watch(self, mode: str, calls: int, steps: int) -> _Watch | None:
        """A stopwatch for the next dispatched item of `mode` (`calls` calls of `steps`
        steps), or None when it is not to be timed."""
        seen = self.seen[mode]
        self.seen[mode] += 1
        if self.decided is not None or len(self.per_step[mode]) >= SAMPLES[mode]:
            return None
        if mode == LOOP:  # from the second call on: a first call may compile
            return _Watch(self, mode, 1, (calls - 1) * steps) if calls > 1 else None
        return _Watch(self, mode, first=0, steps=calls * steps) if seen >= 1 else None

    def measured(self, mode: str, seconds: float) -> None:
        """Notes `mode`'s seconds a step; decides once both modes are measured."""
        self.per_step[mode].append(seconds)
        if all(len(self.per_step[m]) >= SAMPLES[m] for m in (LOOP, SCAN)):
            best = {m: min(times) for m, times in self.per_step.items()}
            self.decided = SCAN if best[SCAN] <= best[LOOP] else LOOP


class _Watch:
    """Times an item's calls from call `first` on: `before(at, state)` before each call
    (the state the last call returned: waited for), `after(tick)` once the last is queued."""

    def __init__(self, trial: Trial, mode: str, first: int, steps: int) -> None:
        self._trial = trial
        self._mode = mode
        self._first = first
        self._steps = steps
        self._start: float | None = None

    def before(self, at: int, state: Any) -> None:
        if at == self._first:
            jax.block_until_ready(state)  # the work queued before: not this item's
            self._start = time.perf_counter()

    def after(self, tick: Any) -> None:
        if self._start is None or self._steps <= 0:
            return
        tick.block_until_ready()
        self._trial.measured(self._mode, (time.perf_counter() - self._start) / self._steps)
