"""Dead and missing peers end the job in seconds, with one `phalanx:` line that says why.

JAX notices a dead peer only at its heartbeat timeout and then aborts every survivor from a
C++ thread (SIGABRT, a stack trace, no Python line). A peer that never starts makes
`jax.distributed.initialize` abort the same way, without naming it. So phalanx watches first:

* `StartupTimer` runs while `jax.distributed.initialize` waits for the others. At the
  start-up timeout it prints who is missing and where the coordinator is, and exits.
* `PeerWatchdog` runs for the life of the job. Every process posts a counter to JAX's
  coordination service (key-value store, no collective, no device work) about once a second
  and reads everyone's. A peer whose counter has not moved for the heartbeat timeout is
  reported by name, and the process exits. Process 0 is no exception: the service runs in a
  helper process that outlives it (see `service_host`), so only its counter stops.

JAX's own timeouts are set `JAX_BACKSTOP_SECONDS` later than phalanx's (see
`DistributedSettings.initialize_kwargs`), so phalanx's line always comes first, and JAX's
abort remains the backstop if a process is wedged so badly that its Python cannot run.
Exit status `PEER_LOST_STATUS` (75, EX_TEMPFAIL: "try again") tells schedulers to requeue.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from phalanx._src.cluster.native_terminate import (
    NATIVE_ABORT_STATUS,
    TerminateHook,
    native_failure_message,
)

PEER_LOST_STATUS = 75
JAX_BACKSTOP_SECONDS = 10
KEY_DIR = "phalanx/alive/"
WHAT_TO_DO = (
    "restart the whole job (a fit with phalanx.callbacks.BackupAndRestore resumes from its "
    "last backup)"
)
USUAL_CAUSES = (
    "usual causes: the process was not started or crashed before joining (check its log), "
    "a different PHALANX_NUM_PROCESSES or coordinator address on some process, a firewall "
    "or wrong host blocking the coordinator port, or a scheduler still starting the process "
    "(raise PHALANX_INIT_TIMEOUT)"
)


def _die(message: str, status: int = PEER_LOST_STATUS) -> None:
    """Print `message` on stderr and end the process at once (no exit barrier to hang in)."""
    sys.stdout.flush()
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(status)


def missing_message(
    process_id: int, num_processes: int, coordinator: str, waited: float, missing: str
) -> str:
    """The line printed when the job did not assemble in time.

    Example:
      >>> missing_message(0, 2, "127.0.0.1:1234", 60, "1")[:46]
      'phalanx: process 0 of 2 gave up after 60 s wai'
    """
    return (
        f"phalanx: process {process_id} of {num_processes} gave up after {waited:.0f} s "
        f"waiting for process(es) {missing} to join the job at coordinator {coordinator}; "
        f"{USUAL_CAUSES}"
    )


def lost_message(lost: int, num_processes: int, silent: float, role: str = "") -> str:
    """The line printed when a peer stopped responding.

    Example:
      >>> lost_message(1, 2, 12.3)[:47]
      'phalanx: process 1 of 2 stopped responding 12 s'
    """
    return (
        f"phalanx: process {lost} of {num_processes}{role} stopped responding {silent:.0f} s "
        f"ago; this process stops too, since synchronous training cannot go on without it; "
        f"{WHAT_TO_DO}"
    )


class StartupTimer:
    """Ends the process with a `phalanx:` line if the job has not assembled by `timeout` s.

    Args:
      process_id, num_processes, coordinator: this process's place in the job.
      timeout: seconds to wait for every process to join.
      die: what to call with the message (tests replace it).
    """

    def __init__(
        self,
        process_id: int | None,
        num_processes: int | None,
        coordinator: str | None,
        timeout: float,
        die: Callable[[str], None] = _die,
    ) -> None:
        self.process_id, self.num_processes = process_id, num_processes
        self.coordinator, self.timeout, self._die = coordinator, timeout, die
        self._timer = threading.Timer(timeout, self._expired)
        self._timer.name = "phalanx-startup-timer"
        self._timer.daemon = True

    def _expired(self) -> None:
        n = self.num_processes
        if self.process_id == 0 and n is not None:
            # The coordinator cannot tell which peers connected before all have; every other
            # id is a suspect.
            missing = ", ".join(str(i) for i in range(1, n)) if n <= 9 else f"1..{n - 1}"
            missing = f"among {missing}" if n > 2 else missing
        else:
            missing = f"0 (the coordinator) or another of the {n or '?'}"
        self._die(
            missing_message(
                self.process_id if self.process_id is not None else -1,
                n or 0,
                self.coordinator or "(auto-detected)",
                self.timeout,
                missing,
            )
        )

    def __enter__(self) -> StartupTimer:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


class PeerWatchdog:
    """A daemon thread that reports a peer silent for `timeout` s, then exits the process.

    Args:
      client: JAX's coordination-service client (`key_value_set`, `key_value_dir_get`).
      process_id: this process's index.
      num_processes: processes in the job.
      timeout: seconds of silence before a peer counts as stopped.
      interval: seconds between posts (default: timeout / 10, at most 1 s).
      die: what to call with the message (tests replace it).
      clock: a monotonic clock (tests replace it).
      native: the `TerminateHook` whose `fired` event says that a native thread called
        std::terminate (a collective library that saw the dead peer first); the watchdog
        then gives its verdict within the timeout, and names a native failure when no peer
        stopped. Uninstalled at exit.
    """

    def __init__(
        self,
        client: Any,
        process_id: int,
        num_processes: int,
        timeout: float,
        interval: float | None = None,
        die: Callable[..., None] = _die,
        clock: Callable[[], float] = time.monotonic,
        native: TerminateHook | None = None,
    ) -> None:
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout = timeout
        self.interval = interval if interval is not None else min(1.0, timeout / 10)
        self._die, self._clock = die, clock
        self.native = native
        self._native_since: float | None = None  # when the native hook fired, once seen
        self._count = 0
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self.exiting = False  # set at interpreter exit: a vanishing service is then expected
        self._thread = threading.Thread(target=self._run, name="phalanx-peer-watchdog")
        self._thread.daemon = True

    def start(self) -> PeerWatchdog:
        """Start watching; also marks interpreter exit so JAX's own shutdown is not reported."""
        global _ACTIVE
        _ACTIVE = self
        start = self._clock()
        self._seen = {p: ("", start) for p in range(self.num_processes)}
        # atexit runs last-registered first: this runs before JAX's distributed shutdown.
        atexit.register(self._at_exit)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the thread ends within one interval)."""
        self._stop.set()

    def await_verdict(self) -> None:
        """Waits (at most the heartbeat timeout and two intervals) for the thread to find a
        stopped peer, which ends the process; returns when none is found."""
        deadline = self._clock() + self.timeout + 2 * self.interval
        while self._thread.is_alive() and self._clock() < deadline:
            self._thread.join(self.interval)

    def _at_exit(self) -> None:
        # Leave the job here rather than in JAX's own exit hook (which runs after this one),
        # so this thread still posts while the exit barrier waits for slower peers, and is
        # gone before the interpreter tears down: a daemon thread caught inside a C++ call
        # at that point aborts the process.
        import jax

        self.exiting = True
        try:
            jax.distributed.shutdown()
        finally:
            self._stop.set()
            self._thread.join(timeout=5)
            if self.native is not None:  # the interpreter must not be called while it ends
                self.native.uninstall()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.check():
                return

    def check(self) -> bool:
        """Post this process's counter, read everyone's; False once watching should end."""
        self._count += 1
        try:
            self.client.key_value_set(
                f"{KEY_DIR}{self.process_id}", str(self._count), allow_overwrite=True
            )
            entries = self.client.key_value_dir_get(KEY_DIR)
        except Exception:  # any failure means the coordinator is unreachable
            if self.exiting or self._stop.is_set() or not _still_joined():
                return False  # our own or JAX's orderly shutdown
            silent = self._clock() - max(t for _, t in self._seen.values())
            self._die(lost_message(0, self.num_processes, silent, _role(0)))
            return False
        now = self._clock()
        for key, value in entries:
            try:
                peer = int(key.rsplit("/", 1)[-1])
            except ValueError:
                continue
            if peer in self._seen and self._seen[peer][0] != value:
                self._seen[peer] = (value, now)
        self._seen[self.process_id] = (str(self._count), now)
        lost = [(now - t, p) for p, (_, t) in self._seen.items() if now - t > self.timeout]
        if lost and not self.exiting:
            silent, peer = max(lost)
            self._die(lost_message(peer, self.num_processes, silent, _role(peer)))
            return False
        return self._native_ok(now)

    def _native_ok(self, now: float) -> bool:
        """False (after saying so) once a native std::terminate has waited out the timeout
        with every peer still answering: the failure was not a dead peer."""
        if self.native is None or not self.native.fired.is_set() or self.exiting:
            return True
        if self._native_since is None:
            self._native_since = now
        waited = now - self._native_since
        if waited <= self.timeout + 2 * self.interval:
            return True
        message = native_failure_message(self.process_id, self.num_processes, waited)
        self._die(message, NATIVE_ABORT_STATUS)
        return False


_ACTIVE: PeerWatchdog | None = None  # this process's watchdog, once started


@contextlib.contextmanager
def peer_failures() -> Iterator[None]:
    """Lets the watchdog name a dead peer before a failed collective's error propagates.

    When a peer dies, the survivors' next collective (Gloo: "Connection reset by peer")
    fails at once, long before the heartbeat timeout; without this, that error (and then
    JAX's abort) would be all the user sees. With a watchdog running, the error waits for
    its verdict: a stopped peer gets the `phalanx:` line and status 75; otherwise the error
    propagates as it came.

    Example:
      >>> with peer_failures():
      ...     model.fit(...)
    """
    try:
        yield
    except Exception:
        if _ACTIVE is not None and not _ACTIVE.exiting:
            _ACTIVE.await_verdict()
        raise


def _role(process_id: int) -> str:
    return " (the coordinator)" if process_id == 0 else ""


def _still_joined() -> bool:
    import jax

    return jax.distributed.is_initialized()
