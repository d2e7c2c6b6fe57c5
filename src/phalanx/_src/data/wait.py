"""`InputWaitMeter`: how much of an epoch the training loop spent waiting for input.

Why: an input-bound run looks like a slow model. The loop wraps each `next(iterator)` in
`meter.waiting()`; at the end of an epoch `epoch_summary()` reports the fraction of wall
time spent there, and the first time that fraction passes the threshold (10%) over an
epoch, one `InputBoundWarning` names the usual fixes. The clock is injectable so tests can
drive it with exact timings.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator

FIXES = (
    "parallel map workers (map(fn, num_parallel_calls=N))",
    "cache() after expensive maps",
    "a deeper prefetch (prefetch(N), or a larger host_depth/device_depth)",
    "a vectorised source (map after batch(), Dataset.from_tensor_slices over arrays)",
    "more steps per call (compile(steps_per_execution=K)) when a step takes about a "
    "millisecond and the host loop itself is what the devices wait for",
)


class InputBoundWarning(UserWarning):
    """The training loop spent more than the threshold of an epoch waiting for batches."""


class InputWaitMeter:
    """Measures the time each step waits for its batch, per epoch.

    Args:
      threshold: the wait fraction above which an epoch counts as input-bound (0.10).
      clock: seconds as a float; `time.perf_counter` unless a test injects its own.
      min_epoch_seconds: epochs shorter than this never warn (their wait is mostly start-up).

    Example:
      >>> meter = InputWaitMeter()
      >>> for batch_index in range(steps):
      ...     with meter.waiting():
      ...         batch = next(it)
      ...     state = step(state, batch)
      ...     meter.step_done()
      >>> logs.update(meter.epoch_summary())  # {"input_wait_fraction": 0.02, ...}
    """

    def __init__(
        self,
        threshold: float = 0.10,
        clock: Callable[[], float] = time.perf_counter,
        min_epoch_seconds: float = 1.0,
    ):
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}; e.g. 0.10.")
        if min_epoch_seconds < 0:
            raise ValueError(f"min_epoch_seconds must be >= 0, got {min_epoch_seconds}.")
        self.threshold = threshold
        self.min_epoch_seconds = min_epoch_seconds
        self._clock = clock
        self._warned = False
        self._start: float | None = None
        self._wait = 0.0
        self._steps = 0

    def start_epoch(self) -> None:
        """Starts the wall clock of an epoch (otherwise the first `waiting()` does)."""
        self._start = self._clock()
        self._wait = 0.0
        self._steps = 0

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Counts the time spent inside the block as waiting for input."""
        began = self._clock()
        if self._start is None:
            self._start = began
            self._wait, self._steps = 0.0, 0
        try:
            yield
        finally:
            self._wait += self._clock() - began

    def step_done(self, steps: int = 1) -> None:
        """Counts `steps` steps (for the per-step wait in the summary)."""
        self._steps += steps

    @property
    def wait_fraction(self) -> float:
        """The fraction of this epoch's wall time spent waiting so far (for progress bars)."""
        if self._start is None:
            return 0.0
        wall = self._clock() - self._start
        return self._wait / wall if wall > 0 else 0.0

    def epoch_summary(self) -> dict[str, float]:
        """Ends the epoch: returns its numbers and warns once per meter when input-bound.

        Returns:
          `{"input_wait_s", "wall_s", "input_wait_fraction", "steps", "input_wait_per_step_s"}`.

        Warns:
          InputBoundWarning: the first epoch whose wait fraction exceeds the threshold.
        """
        now = self._clock()
        wall = 0.0 if self._start is None else now - self._start
        fraction = self._wait / wall if wall > 0 else 0.0
        summary = {
            "input_wait_s": self._wait,
            "wall_s": wall,
            "input_wait_fraction": fraction,
            "steps": self._steps,
            "input_wait_per_step_s": self._wait / self._steps if self._steps else 0.0,
        }
        # An epoch shorter than min_epoch_seconds is mostly start-up (the first batch, thread
        # start): its fraction is reported but says little about the pipeline.
        if fraction > self.threshold and wall >= self.min_epoch_seconds and not self._warned:
            self._warned = True
            warnings.warn(
                f"the input pipeline is the bottleneck: steps waited {fraction:.0%} of the "
                f"epoch's {wall:.1f} s for their batches (over {self.threshold:.0%}). Likely "
                f"fixes: {'; '.join(FIXES)}.",
                InputBoundWarning,
                stacklevel=2,
            )
        self._start, self._wait, self._steps = None, 0.0, 0
        return summary
