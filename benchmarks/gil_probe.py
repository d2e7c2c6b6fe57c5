"""How long code holds the GIL: a probe thread that asks for it without pause (Linux).

The probe loops on `select.select([], [], [], 0)`, which releases the GIL and takes it back
at once (it never sleeps). Whenever another thread holds the GIL, the probe waits for it,
asleep in CPython's GIL wait; the kernel's per-thread scheduler statistics
(/proc/self/task/TID/schedstat: CPU time and run-queue wait) separate that sleep from the
time the probe ran or waited for a core, so a busy neighbour on a shared machine does not
count as GIL time:

    GIL held by the others = wall - probe's CPU time - probe's run-queue wait

Measured over windows long against a time slice (the kernel books those times when it
switches threads) and divided by the calls (or images) measured, that is the GIL-held time
per call: the serial part that bounds how many threads can scale (Amdahl).

While the probe runs, the switch interval is raised to a second: a waiting thread then
sleeps until the holder lets go, instead of waking every 5 ms to request a switch (on a
busy machine those wake-ups wait in the run queue and would hide the holder's time).
Threads still switch whenever one releases the GIL for a native call or a blocking wait,
which pipeline threads do many times per element.
"""

from __future__ import annotations

import select
import sys
import threading
import time
from collections.abc import Callable


def _queued() -> float:
    """This thread's run-queue wait so far, in seconds (the kernel's schedstat)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stats:
        return int(stats.read().split()[1]) / 1e9


class GilProbe:
    """A context: `held` is the seconds other threads held the GIL while it was open.

    The probe stamps its own window (wall clock, its CPU time, its run-queue wait) from
    inside its thread: CLOCK_THREAD_CPUTIME_ID counts up to the instant it is read, where
    the schedstat file's CPU time is booked only when the thread is switched.

    Example:
      >>> with GilProbe() as probe:
      ...     for _ in range(1000):
      ...         work()
      >>> probe.held / 1000   # seconds of GIL per call of work()
    """

    def __enter__(self) -> GilProbe:
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(1.0)
        self._stop = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait()
        return self

    def _run(self) -> None:
        poll = select.select
        for _ in range(1000):  # settle: the first wake-ups of a new thread
            poll((), (), (), 0)
        begin = (time.perf_counter(), time.thread_time(), _queued())
        self._started.set()
        while not self._stop:
            poll((), (), (), 0)
        end = (time.perf_counter(), time.thread_time(), _queued())
        self.wall, cpu, queued = (b - a for a, b in zip(begin, end, strict=True))
        self.held = max(self.wall - cpu - queued, 0.0)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()
        sys.setswitchinterval(self._interval)


def held_per_call(
    fn: Callable[[int], object], count: int, seconds: float = 0.5
) -> tuple[float, float]:
    """(GIL-held seconds, wall seconds) per call of fn(0), ..., fn(count - 1), repeated for
    at least `seconds`: the kernel books a thread's CPU and queue time when it is switched,
    so a window must be long against a time slice (milliseconds)."""
    calls = 0
    with GilProbe() as probe:
        end = time.perf_counter() + seconds
        while calls < count or time.perf_counter() < end:
            fn(calls % count)
            calls += 1
    return probe.held / calls, probe.wall / calls
