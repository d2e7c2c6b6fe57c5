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
restores on another. It checks everything first (`Files.read`, `Layout.verify`): a damaged
checkpoint raises `CheckpointError` naming its file, and the model is left as it was.

Saving takes the folder (`claim`: created if missing, its lock file taken by process 0, see
`lock`), so a folder that is a file, cannot be written or is used by another job is refused
before the first save, and a second job cannot save into it meanwhile; `close` releases it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from phalanx._src import shutdown
from phalanx._src.train.checkpoint.files import RECORD, Files, to_devices, to_host
from phalanx._src.train.checkpoint.layout import Layout
from phalanx._src.train.checkpoint.lock import CLAIMS, LOCKS
from phalanx._src.train.checkpoint.record import CheckpointError
from phalanx._src.train.checkpoint.writer import WRITER

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine


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

    Raises:
      CheckpointError: when `directory` is a file.

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
        # Before anything (Orbax, a save) creates it: whether phalanx makes the folder.
        self.created = not os.path.exists(self.directory)
        self._claimed = False
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
            shutdown.track(self)  # its threads end (the save in flight written) before exit
        return self._manager

    def claim(self) -> None:
        """Takes the folder for saving: creates it if missing and takes its lock (process 0,
        for the job). `save` calls it first; call it earlier to refuse a bad folder before
        training. All processes must call it.

        Raises:
          CheckpointError: when another job saves into the folder (naming it).
          OSError: of the underlying kind (PermissionError...), naming the folder, when it
            cannot be created or written.
        """
        if self._claimed:
            if jax.process_index() == 0 and not LOCKS.held(self._files.directory):
                # Released by another checkpointer of this process: take it again (alone,
                # so saves stay free of collectives).
                LOCKS.acquire(self._files.directory)
            return
        error: BaseException | None = None
        if jax.process_index() == 0:
            try:
                self._files.prepare()
                LOCKS.acquire(self._files.directory)
            except (CheckpointError, OSError) as e:
                error = e
        if not _everyone(error is None) and error is None:
            if jax.process_index() == 0:
                LOCKS.release(self._files.directory)
            error = CheckpointError(
                f"process 0 could not take the checkpoint folder {self.directory}; its log says why"
            )
        if error is not None:
            raise error
        self._claimed = True

    def steps(self) -> list[int]:
        """Every complete checkpoint's number, oldest first."""
        self.wait_until_finished()
        return self._files.steps()

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's number, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, engine: Engine, record: dict[str, Any], wait: bool = False) -> None:
        """Writes `engine`'s train state and `record` (JSON-serialisable) as checkpoint `step`.

        Returns once a copy of the state is queued on the devices; the files are written in
        the background unless `wait` (or the checkpointer is synchronous).

        Raises:
          Exception: the previous background save's error, if it failed (an OSError naming
            the folder when it could not be written).
          CheckpointError, OSError: from `claim`, on the first save.
        """
        self.wait_until_finished()  # at most one save in progress (one extra state copy)
        self.claim()
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
        self._pending = WRITER.submit(write)
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

    def restore(
        self, engine: Engine, step: int | None = None, expect: Iterable[str] = ()
    ) -> dict[str, Any]:
        """Loads checkpoint `step` (default: the newest) into `engine`; returns its record.

        Every byte, the layout and the stored dtypes and shapes are checked against the
        record and against `engine`'s state before anything is assigned; so is that the
        record holds the keys in `expect`.

        Raises:
          FileNotFoundError: when there is no such checkpoint.
          CheckpointError: naming the file, when the checkpoint is damaged or does not fit
            the model; `engine` is then unchanged.
        """
        steps = self.steps()
        step = (steps[-1] if steps else None) if step is None else step
        if step not in steps:
            wanted = "" if step is None else f" {step}"
            raise FileNotFoundError(
                f"no checkpoint{wanted} in {self.directory} (its checkpoints: {steps})"
            )
        if self._files.is_ours(step):
            host, meta = self._files.read(step)
            source = os.path.join(self.directory, str(step), RECORD)
            layout = Layout.from_description(meta.get("layout"), source)
            specs = {name: (a.shape, a.dtype) for name, a in host.items()}
            layout.verify(engine.state, source, specs, meta.get("keys"))
            record = _record(meta, expect, source)
            arrays = to_devices(host, meta["keys"], layout.abstract(engine.state))
        else:
            import orbax.checkpoint as ocp

            manager = self._orbax()
            source = os.path.join(self.directory, str(step))
            meta = self.record(step, whole=True)
            layout = Layout.from_description(meta.get("layout"), source)
            layout.verify(engine.state, source)
            record = _record(meta, expect, source)
            target = ocp.args.StandardRestore(layout.abstract(engine.state))
            with _orbax_errors(source):
                arrays = manager.restore(step, args=ocp.args.Composite(state=target))["state"]
        engine.state = layout.unpack(arrays, engine.state)
        return record

    def record(self, step: int, whole: bool = False) -> dict[str, Any]:
        """Checkpoint `step`'s record alone (its arrays are not read); with `whole`, all
        its meta (the record, the layout...).

        Raises:
          CheckpointError: naming the file, when the record is damaged.
        """
        if self._files.is_ours(step):
            _, meta = self._files.read_meta(step)
            source = os.path.join(self.directory, str(step), RECORD)
        else:
            import orbax.checkpoint as ocp

            source = os.path.join(self.directory, str(step))
            with _orbax_errors(source):
                args = ocp.args.Composite(meta=ocp.args.JsonRestore())
                meta = self._orbax().restore(step, args=args)["meta"]
            if not isinstance(meta, dict):
                raise CheckpointError(f"the Orbax checkpoint {source} holds no phalanx meta")
        return meta if whole else _record(meta, (), source)

    def delete_all(self) -> None:
        """Removes every checkpoint, and what interrupted saves left (BackupAndRestore after
        a finished run); nothing else in the folder. All processes must call it."""
        self.wait_until_finished()
        self.claim()
        if self._manager is not None:
            # Orbax removes old steps in a thread of each process (max_to_keep): closing
            # joins it, so none of its removals races the ones below.
            manager, self._manager = self._manager, None
            manager.close()
        if jax.process_index() == 0:
            for step in self._files.steps():
                self._files.delete(step)
            self._files.delete_leftovers()

    def close(self) -> None:
        """Waits for the save in progress, then releases the writer's thread, Orbax's threads,
        if it had any, and the folder's lock."""
        try:
            self.wait_until_finished()
            WRITER.close()  # no thread lingers past the fit that saved
        finally:
            try:
                if self._manager is not None:
                    self._manager.close()
                    shutdown.forget(self)
            finally:
                if self._claimed and jax.process_index() == 0:
                    LOCKS.release(self._files.directory)
                self._claimed = False


def _record(meta: dict[str, Any], expect: Iterable[str], source: str) -> dict[str, Any]:
    record = meta.get("record")
    missing = [] if not isinstance(record, dict) else [k for k in expect if k not in record]
    if not isinstance(record, dict) or missing:
        raise CheckpointError(
            f"{source} holds no record with {sorted(expect) if missing else 'fields'} "
            f"(found {sorted(record) if isinstance(record, dict) else record!r}): it was "
            "written by another callback, or is damaged; use a folder of its own"
        )
    return dict(record)


@contextlib.contextmanager
def _orbax_errors(source: str) -> Iterator[None]:
    """Orbax's errors reading `source` (many kinds), as one CheckpointError naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"cannot read the Orbax checkpoint {source} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); it is damaged or incomplete: "
            "restore another step, or delete it"
        ) from error


def _everyone(ok: bool) -> bool:
    """Whether `ok` holds on every process (a collective when there are several)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def open_for(callback: Any, directory: str | os.PathLike, max_to_keep: int | None) -> Any:
    """The checkpointer of a checkpoint callback's `fit`: the folder claimed, and refused
    when another callback of the same fit saves there (`CLAIMS`).

    Raises:
      CheckpointError, OSError: see `CLAIMS.check` and `TrainCheckpointer.claim`.
    """
    folder = os.path.realpath(directory)
    CLAIMS.check(folder, callback)
    checkpointer = TrainCheckpointer(directory, max_to_keep=max_to_keep)
    try:
        checkpointer.claim()
    except BaseException:
        checkpointer.close()
        raise
    CLAIMS.take(folder, callback, checkpointer)
    return checkpointer


def close_for(callback: Any, checkpointer: TrainCheckpointer | None) -> None:
    """Closes a callback's checkpointer (if any) and drops its claim on the folder."""
    if checkpointer is None:
        return
    try:
        checkpointer.close()
    finally:
        CLAIMS.drop(os.path.realpath(checkpointer.directory), callback)
