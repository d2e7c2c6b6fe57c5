"""SIGTERM during `fit`: every process stops at the same step, backs up, and exits 143.

Schedulers (SLURM, Kubernetes, TPU maintenance) ask a job to stop with SIGTERM, usually to one
process or to each at slightly different times, and requeue it when it exits non-zero.
During `fit` a Python handler takes SIGTERM and sets a local flag (in a multi-process job it
replaces the handler of JAX's preemption notifier; JAX's sync point is still asked, so a TPU
maintenance notice counts too).

One process stops after the compiled call during which the flag was set. Several processes
must all stop after the *same* call, and a local flag is seen at different calls. So with
several processes every call also dispatches a vote: a one-element-per-device array,
all-reduced with `max` (`StopVote`), and each process acts on the vote of the call
`MAX_IN_FLIGHT` calls back, which the loop waits for anyway to bound the calls in flight.
Every process reads the same votes at the same call counts, so all stop after the same call
by construction. (JAX's own sync point, "the fastest process's counter + 1", can be passed
by a process that runs ahead before the agreement reaches it: a hang in about 1 run in 3 on
a loaded machine.)

At that step `fit` saves to the `BackupAndRestore` directory if the callback is present
(mid-epoch, with the data position, so the restarted job resumes bitwise where it stopped),
prints one `phalanx:` line and raises `Preempted` (a `SystemExit` with status 143,
128 + SIGTERM), which ends the program unless caught. From the first SIGTERM seen by
phalanx on, a second SIGTERM or a Ctrl-C ends the process at once.
"""

from __future__ import annotations

import collections
import itertools
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from phalanx._src.strategy.strategy import Strategy
    from phalanx._src.train.engine.engine import Engine

PREEMPTED_STATUS = 128 + signal.SIGTERM  # 143, what a shell reports for a SIGTERM death

# One counter per process for its whole life: JAX's sync point is "the fastest process's
# counter + 1", compared for equality, so the counter must go up by one per call and mean
# the same on every process (every process runs the same compiled calls).
_CALLS = itertools.count(1)
# Calls between a vote and the decision read from it: the loop's bound on calls in flight
# (feed.MAX_IN_FLIGHT), so reading a vote never waits longer than the loop waits anyway.
VOTE_LAG = 8


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


class StopVote:
    """Every process's stop request, agreed at the same compiled call.

    `cast(mine)` dispatches this call's vote (an all-reduce of one value per device, from
    arrays made once: nothing crosses from the host per call) and returns the decision of
    the vote cast `lag` calls before, the same on every process.

    Example:
      >>> vote = StopVote(strategy, lag=2)
      >>> [vote.cast(i == 0) for i in range(4)]  # on every process
      [False, False, True, False]
    """

    def __init__(self, strategy: Strategy, lag: int = VOTE_LAG) -> None:
        local = strategy.num_local_replicas
        shape = (strategy.num_replicas_in_sync,)

        def ballot(value: bool) -> jax.Array:
            return jax.make_array_from_process_local_data(
                strategy.data_sharding, np.full(local, value, np.int32), shape
            )

        self._ballots = {False: ballot(False), True: ballot(True)}
        self._count = jax.jit(jnp.max, out_shardings=strategy.replicated_sharding)
        self._lag = lag
        self._pending: collections.deque = collections.deque()

    def cast(self, mine: bool) -> bool:
        self._pending.append(self._count(self._ballots[bool(mine)]))
        if len(self._pending) <= self._lag:
            return False
        return bool(self._pending.popleft())


class PreemptionWatch:
    """Installed by `fit` for its duration; checks once per compiled training call.

    Args:
      engine: the engine of the model being fitted (its step hooks gain the check).
      callbacks: the fit's callbacks, searched for a `BackupAndRestore`.
    """

    def __init__(self, engine: Engine, callbacks: Any) -> None:
        self.engine = engine
        self.callbacks = callbacks
        self.requested = False
        self._sync = None
        self._vote: StopVote | None = None
        self._installed = False
        self._previous: Any = None

    def start(self) -> PreemptionWatch:
        self._sync = _sync_manager()
        strategy = self.engine.strategy
        if len({d.process_index for d in strategy.devices}) > 1:
            self._vote = StopVote(strategy)
        if threading.current_thread() is threading.main_thread():
            # In a distributed job this replaces JAX's notifier handler for the fit's span.
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        self.engine.add_step_hook(self.check)
        return self

    def stop(self) -> None:
        self.engine.remove_step_hook(self.check)
        if self._installed and not self.requested:
            # A handler installed outside Python (JAX's notifier) cannot be put back: the
            # process then ends on SIGTERM, as any process does by default.
            previous = self._previous if self._previous is not None else signal.SIG_DFL
            signal.signal(signal.SIGTERM, previous)
        self._installed = False
        self._previous = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True
        _exit_at_once_on_signals()

    def check(self, steps: int, feed: Any) -> None:
        """The step hook: at the agreed step, back up and raise `Preempted`."""
        if self._sync is not None and self._sync.reached_sync_point(next(_CALLS)):
            self.requested = True  # JAX's notice (a TPU maintenance event) counts too
        if not (self.requested if self._vote is None else self._vote.cast(self.requested)):
            return
        self.requested = True
        if threading.current_thread() is threading.main_thread():
            _exit_at_once_on_signals()
        backup = _find_backup(self.callbacks)
        saved_to = None
        if backup is not None:
            backup.save_now(steps, feed)
            saved_to = backup.backup_dir
        step = self.engine.train_step_count
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
    from phalanx._src.train.checkpoint.backup import BackupAndRestore

    return next((cb for cb in callbacks if isinstance(cb, BackupAndRestore)), None)
