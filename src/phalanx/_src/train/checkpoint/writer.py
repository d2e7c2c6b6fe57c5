"""The background thread that writes checkpoints, one per process, shared by every
checkpointer so the saves of all of them reach Orbax's cross-process barriers in one order."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable


class _Writer:
    """One background thread per process running save tasks in submission order.

    It waits `LINGER` seconds for the next task before it ends, so saves every few steps
    reuse one thread (starting one per save cost the training thread ~1 ms: `start()` waits
    for the new thread, which then holds the interpreter while it writes), and nothing
    outlives the saves for long (an interrupted fit leaves no thread behind).
    """

    LINGER = 0.5  # seconds

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._tasks: list[tuple[Callable[[], None], concurrent.futures.Future]] = []
        self._thread: threading.Thread | None = None

    def submit(self, task: Callable[[], None]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._tasks.append((task, future))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="phalanx-checkpoint-writer", daemon=True
                )
                self._thread.start()
            else:
                self._lock.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._tasks:
                    self._lock.wait(self.LINGER)
                if not self._tasks:
                    self._thread = None
                    return
                task, future = self._tasks.pop(0)
            try:
                task()
            except BaseException as error:  # handed to the training thread by the future
                future.set_exception(error)
            else:
                future.set_result(None)


WRITER = _Writer()
