"""Saving and restoring a Model's whole training state, atomically and in the background.

A checkpoint holds the train state (parameters, the module's other variables, optimizer
state with its accumulator and loss scale, metric sums) and a small JSON record (epoch,
steps done in it, the data iterator's position). It is written into a temporary directory
that is renamed when complete, so an interrupted save (a kill mid-write) never leaves a
checkpoint that looks whole: the previous one stays the newest.

Saves are asynchronous: `save` only queues one compiled call that copies the state on the
devices, its replicated leaves packed into one vector per dtype (`checkpoint_layout`: the
next training step may then overwrite the original, and the writer has two or three arrays
to write instead of every leaf), and returns. One background thread per process writes
the copies in order while training goes on. A checkpointer has at most one save in
progress: a new save first waits for the previous one, so device memory holds at most one
extra copy.

One process writes the arrays' bytes itself (`checkpoint_files`: ~1 ms of CPU a save, where
Orbax takes ~30). Several processes write with Orbax, whose async checkpointing is made for
it: each process writes the shards it holds (replicated arrays once), process 0 commits the
checkpoint after all processes have finished writing, and old checkpoints are deleted only
after that agreement; `save` and `restore` are then collective. The writer thread is
shared, so the saves of every checkpointer reach Orbax's cross-process barriers in the same
order on every process.

`restore` reads either format into the shardings of the engine's current state, whatever
they were at save time, so a checkpoint written on one device count (or process count)
restores on another.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from phalanx._src.train.checkpoint.files import Files, to_devices, to_host
from phalanx._src.train.checkpoint.layout import Layout

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine


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


_WRITER = _Writer()


def _use_coordination_barriers() -> None:
    """Make Orbax's cross-process barriers go through JAX's coordination service.

    Orbax's default barrier is a device collective (`sync_global_devices`); issued from its
    background thread while training steps run their own collectives, it can meet them in a
    different order on different processes and hang the job.
    """
    if jax.process_count() == 1:
        return
    import orbax.checkpoint  # noqa: F401 -- defines the flag
    from absl import flags

    flag = flags.FLAGS["experimental_orbax_use_distributed_barrier"]
    if not flag.value:
        flag.parse("true")  # also marks it present, so it reads without absl's flag parsing


class TrainCheckpointer:
    """Numbered checkpoints of a `Model`'s train state in one directory.

    Args:
      directory: where checkpoints go (created if missing); one sub-directory per save.
      max_to_keep: keep only the newest N (None: all).
      asynchronous: write in a background thread while training goes on (default); False
        makes every `save` return only once the checkpoint is on disk.

    Example:
      >>> ckpt = TrainCheckpointer("runs/ckpt", max_to_keep=2)
      >>> ckpt.save(10, model.engine, {"epoch": 3})
      >>> record = ckpt.restore(model.engine)          # the newest; returns {"epoch": 3}
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_to_keep: int | None = None,
        asynchronous: bool = True,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self._files = Files(self.directory)
        self._max_to_keep = max_to_keep
        self._asynchronous = asynchronous
        self._pending: concurrent.futures.Future | None = None
        self._layout: tuple[Any, Layout, dict[str, Any]] | None = None
        self._manager: Any = None  # Orbax's, made when several processes save or restore
        if jax.process_count() > 1:
            self._orbax()

    def _orbax(self) -> Any:
        """Orbax's CheckpointManager for this directory (1 s to import: only when needed)."""
        if self._manager is None:
            import orbax.checkpoint as ocp

            _use_coordination_barriers()
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=self._max_to_keep,
                    # Orbax's own thread writes while ours waits; ours keeps the loop free.
                    enable_async_checkpointing=True,
                    create=True,
                    # Old checkpoints are removed by a thread too, never by the training loop.
                    enable_background_delete=True,
                ),
            )
        return self._manager

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's number, or None."""
        self.wait_until_finished()
        steps = self._files.steps()
        return steps[-1] if steps else None

    def save(self, step: int, engine: Engine, record: dict[str, Any], wait: bool = False) -> None:
        """Writes `engine`'s train state and `record` (JSON-serialisable) as checkpoint `step`.

        Returns once a copy of the state is queued on the devices; the files are written in
        the background unless `wait` (or the checkpointer is synchronous).

        Raises:
          Exception: the previous background save's error, if it failed.
        """
        self.wait_until_finished()  # at most one save in progress (one extra state copy)
        leaves, treedef = jax.tree.flatten(engine.state)
        key = (treedef, tuple((a.shape, a.dtype, a.sharding) for a in leaves))
        if self._layout is None or self._layout[0] != key:
            layout = Layout.of(engine.state)
            self._layout = (key, layout, layout.describe())
        _, layout, description = self._layout
        # New buffers, queued on the devices: the next step donates (overwrites) the state's.
        arrays = layout.pack(leaves)
        meta = {"record": dict(record), "layout": description}
        if jax.process_count() > 1:
            # Orbax's barriers must reach every process in one order: save from this thread
            # (Orbax still writes in its own thread); see `_use_coordination_barriers`.
            manager = self._orbax()
            manager.save(step, args=self._orbax_args(arrays, meta), force=True)
            if wait or not self._asynchronous:
                manager.wait_until_finished()
            return

        def write() -> None:
            host, keys = to_host(arrays)
            self._files.write(step, host, {**meta, "keys": keys})
            if self._max_to_keep is not None:
                for old in self._files.steps()[: -self._max_to_keep]:
                    self._files.delete(old)

        if not self._asynchronous:
            write()
            return
        self._pending = _WRITER.submit(write)
        if wait:
            self.wait_until_finished()

    def _orbax_args(self, arrays: dict[str, jax.Array], meta: dict[str, Any]) -> Any:
        import orbax.checkpoint as ocp

        return ocp.args.Composite(state=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta))

    def wait_until_finished(self) -> None:
        """Blocks until the save in progress, if any, is on disk and committed.

        Raises:
          Exception: that save's error, if it failed.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
        if self._manager is not None:
            self._manager.wait_until_finished()

    def restore(self, engine: Engine, step: int | None = None) -> dict[str, Any]:
        """Loads checkpoint `step` (default: the newest) into `engine`; returns its record.

        Raises:
          FileNotFoundError: when there is no checkpoint.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if self._files.is_ours(step):
            host, meta = self._files.read(step)
            layout = Layout.from_description(meta["layout"])
            arrays = to_devices(host, meta["keys"], layout.abstract(engine.state))
        else:
            import orbax.checkpoint as ocp

            manager = self._orbax()
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = meta["meta"]
            layout = Layout.from_description(meta["layout"])
            target = ocp.args.StandardRestore(layout.abstract(engine.state))
            arrays = manager.restore(step, args=ocp.args.Composite(state=target))["state"]
        engine.state = layout.unpack(arrays, engine.state)
        return dict(meta["record"])

    def delete_all(self) -> None:
        """Removes every checkpoint (BackupAndRestore after a finished run)."""
        self.wait_until_finished()
        for step in self._files.steps():
            if not self._files.is_ours(step) and self._manager is not None:
                self._manager.delete(step)  # collective: Orbax agrees on it
            elif jax.process_index() == 0:
                self._files.delete(step)

    def close(self) -> None:
        """Waits for the save in progress, then releases Orbax's threads, if it had any."""
        try:
            self.wait_until_finished()
        finally:
            if self._manager is not None:
                self._manager.close()
