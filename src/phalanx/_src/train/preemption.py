"""SIGTERM during `fit`: every process stops at the same step, backs up, and exits 143.

Schedulers (SLURM, Kubernetes, TPU maintenance) ask a job to stop with SIGTERM, usually to one
process or to each at slightly different times, and requeue it when it exits non-zero. In
a multi-process job JAX's distributed runtime already takes SIGTERM for its preemption
notifier, which agrees through the coordination service on one step at which every process
stops (`jax.experimental.multihost_utils.reached_preemption_sync_point`): the processes
exchange their step counters in background threads, so the training loop only asks a local,
mutex-guarded flag once per compiled call, with no host sync and no collective. A single
process has no such service; there a Python SIGTERM handler sets the flag.

At that step `fit` saves to the `BackupAndRestore` directory if the callback is present
(mid-epoch, with the data position, so the restarted job resumes bitwise where it stopped),
prints one `phalanx:` line and raises `Preempted` (a `SystemExit` with status 143,
128 + SIGTERM), which ends the program unless caught. From the first SIGTERM seen by
phalanx on, a second SIGTERM or a Ctrl-C ends the process at once.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx._src.train.model import Model

PREEMPTED_STATUS = 128 + signal.SIGTERM  # 143, what a shell reports for a SIGTERM death

# One counter per process for its whole life: JAX's sync point is "the fastest process's
# counter + 1", compared for equality, so the counter must go up by one per call and mean
# the same on every process (every process runs the same compiled calls).
_CALLS = itertools.count(1)


class Preempted(SystemExit):
    """`fit` stopped because of SIGTERM; exits with status 143 unless caught.

    Attributes:
      step: `model.train_step_count` when it stopped.
      saved_to: the `BackupAndRestore` directory written, or None.
    """

    def __init__(self, step: int, saved_to: str | None) -> None:
        super().__init__(PREEMPTED_STATUS)
        self.step, self.saved_to = step, saved_to


def _sync_manager() -> Any:
    """JAX's preemption sync manager when this process is part of a distributed job."""
    from jax._src import distributed  # no public accessor for the manager itself

    return distributed.global_state.preemption_sync_manager


def _exit_at_once_on_signals() -> None:
    """Make the next SIGTERM or Ctrl-C end the process immediately."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


class PreemptionWatch:
    """Installed by `fit` for its duration; checks once per compiled training call.

    Args:
      model: the model being fitted (its `_step_hooks` gain the check).
      callbacks: the fit's callbacks, searched for a `BackupAndRestore`.
    """

    def __init__(self, model: Model, callbacks: Any) -> None:
        self.model = model
        self.callbacks = callbacks
        self.requested = False
        self._sync = None
        self._previous: Any = None

    def start(self) -> PreemptionWatch:
        self._sync = _sync_manager()
        in_main = threading.current_thread() is threading.main_thread()
        if self._sync is None and in_main:
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.model._step_hooks.append(self.check)
        return self

    def stop(self) -> None:
        if self.check in self.model._step_hooks:
            self.model._step_hooks.remove(self.check)
        if self._previous is not None and not self.requested:
            signal.signal(signal.SIGTERM, self._previous)
        self._previous = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True
        _exit_at_once_on_signals()

    def _reached(self) -> bool:
        if self._sync is not None:
            return bool(self._sync.reached_sync_point(next(_CALLS)))
        return self.requested

    def check(self, steps: int, feed: Any) -> None:
        """The step hook: at the agreed step, back up and raise `Preempted`."""
        if not self._reached():
            return
        self.requested = True
        if threading.current_thread() is threading.main_thread():
            _exit_at_once_on_signals()
        backup = _find_backup(self.callbacks)
        saved_to = None
        if backup is not None:
            backup.save_now(steps, feed)
            saved_to = backup.backup_dir
        import jax

        step = self.model.train_step_count
        where = f"backed up to {saved_to}" if saved_to else "nothing saved (no BackupAndRestore)"
        sys.stdout.flush()
        print(
            f"phalanx: process {jax.process_index()} of {jax.process_count()}: SIGTERM, "
            f"stopped at step {step}; {where}; exiting with status {PREEMPTED_STATUS} so the "
            "scheduler can requeue the job",
            file=sys.stderr,
            flush=True,
        )
        raise Preempted(step, saved_to)


def _find_backup(callbacks: Any) -> Any:
    from phalanx._src.train.callbacks.backup import BackupAndRestore

    return next((cb for cb in callbacks if isinstance(cb, BackupAndRestore)), None)
