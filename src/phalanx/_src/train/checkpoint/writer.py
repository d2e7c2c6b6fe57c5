"""The background thread that writes checkpoints, one per process, shared by every
checkpointer so the saves of all of them reach Orbax's cross-process barriers in one order."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

from phalanx._src import shutdown


class _Writer:
    """One background thread per process running save tasks in submission order.

    It waits `LINGER` seconds for the next task before it ends, so saves every few steps
    reuse one thread (starting one per save cost the training thread ~1 ms: `start()` waits
    for the new thread, which then holds the interpreter while it writes), and nothing
    outlives the saves for long (an interrupted fit leaves no thread behind).

    A task's arrays are released as soon as it has run, in this thread while the interpreter
    is whole. `close()` (also called at interpreter exit, see `shutdown`) finishes the tasks
    submitted so far and joins the thread without lingering.
    """

    LINGER = 0.5  # seconds

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._tasks: list[tuple[Callable[[], None], concurrent.futures.Future]] = []
        self._thread: threading.Thread | None = None
        self._closing = False

    def submit(self, task: Callable[[], None]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._tasks.append((task, future))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="phalanx-checkpoint-writer", daemon=True
                )
                self._thread.start()
                shutdown.track(self)
            else:
                self._lock.notify()
        return future

    def close(self) -> None:
        """Runs the tasks already submitted, then ends the thread and waits for it."""
        with self._lock:
            thread = self._thread
            self._closing = True
            self._lock.notify()
        try:
            if thread is not None:
                thread.join()
        finally:
            with self._lock:
                self._closing = False
            shutdown.forget(self)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._tasks and not self._closing:
                    self._lock.wait(self.LINGER)
                if not self._tasks:
                    self._thread = None
                    shutdown.forget(self)
                    return
                task, future = self._tasks.pop(0)
            try:
                task()
            except BaseException as error:  # handed to the training thread by the future
                future.set_exception(error)
            else:
                future.set_result(None)
            # The task holds the save's arrays: drop them now, not when this frame is
            # cleared, which may be while the interpreter finalizes (see `shutdown`).
            del task, future


WRITER = _Writer()
