"""Who saves into a checkpoint folder: one job (a lock file), one callback of a fit.

Two jobs saving into one folder would delete and overwrite each other's checkpoints. The
first to save creates `.phalanx-lock` in the folder (exclusively: the file system decides
who wins), naming its host and process; the second is refused with that name. A lock left
by a process that died on this host is taken over; one from another host cannot be checked,
so the message says to delete it if that job is gone. A process holds a folder once: a
checkpointer left by an interrupted `fit` never locks its own process out, the first
`release` removes the file, and a checkpointer still saving there takes it again at its
next save (`held`). In a job of several processes, process 0 holds it for the job.

Within one `fit`, two checkpoint callbacks on one folder (`ModelCheckpoint` and
`BackupAndRestore`, or two of either) are refused by `CLAIMS` when the second one starts.

Example:
  >>> LOCKS.acquire(Path("runs/ckpt"))    # CheckpointError if another live job holds it
  >>> LOCKS.release(Path("runs/ckpt"))
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from phalanx._src.train.checkpoint.record import CheckpointError

LOCK = ".phalanx-lock"


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _holder(path: Path) -> dict[str, Any] | None:
    """The lock's holder, None when there is no lock file; raises when it is unreadable
    (read twice: the holder may be writing it this instant)."""
    for attempt in range(2):
        try:
            holder = json.loads(path.read_text())
            if isinstance(holder.get("host"), str) and type(holder.get("pid")) is int:
                return holder
        except FileNotFoundError:
            return None
        except (ValueError, AttributeError, OSError):
            pass
        if attempt == 0:
            time.sleep(0.1)
    raise CheckpointError(
        f"the lock file {path} is unreadable, so whether another job saves into "
        f"{path.parent} is unknown; if none does, delete {path} and start again"
    )


def describe(holder: dict[str, Any]) -> str:
    return f"host {holder['host']}, pid {holder['pid']}, since {holder.get('since', '?')}"


class _Locks:
    """The lock files of the folders this process saves into."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()

    def held(self, directory: Path) -> bool:
        """Whether `directory`'s lock file names this process (read at every save: ~20 us)."""
        try:
            holder = _holder(directory / LOCK)
        except CheckpointError:
            return False
        return holder is not None and _names(holder, _me())

    def acquire(self, directory: Path) -> None:
        """Takes `directory`'s lock for this process (the folder must exist).

        Raises:
          CheckpointError: when another live job holds it (naming its host and process).
          OSError: of the underlying kind (PermissionError...), naming the folder, when the
            lock file cannot be written there.
        """
        path = directory / LOCK
        me = _me()
        with self._mutex:
            for _ in range(5):
                if self._create(path):
                    return
                holder = _holder(path)
                if holder is None:  # released meanwhile
                    continue
                if _names(holder, me):
                    return
                if holder["host"] != me["host"] or _alive(holder["pid"]):
                    raise CheckpointError(_in_use(directory, path, holder, me["host"]))
                _take_over(path, holder)  # its process has died
            raise CheckpointError(
                f"could not take the lock {path}: other processes keep taking it; make sure "
                f"one job at a time saves into {directory}"
            )

    def _create(self, path: Path) -> bool:
        try:
            fd = _open_exclusive(path)
        except FileExistsError:
            return False
        except OSError as error:
            message = (
                f"cannot write into the checkpoint folder {path.parent} "
                f"({error.strerror or error}); make it writable, or pass a folder you can write"
            )
            if error.errno is None:
                raise OSError(message) from error
            raise OSError(error.errno, message) from error
        holder = {**_me(), "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(holder))
        return True

    def release(self, directory: Path) -> None:
        """Removes `directory`'s lock file if it names this process."""
        path = directory / LOCK
        with self._mutex, contextlib.suppress(CheckpointError, OSError):
            holder = _holder(path)
            if holder is not None and _names(holder, _me()):
                path.unlink()


def _names(holder: dict[str, Any], me: dict[str, Any]) -> bool:
    return holder["host"] == me["host"] and holder["pid"] == me["pid"]


def _open_exclusive(path: Path) -> int:
    """A new file at `path`, or FileExistsError: the file system picks one winner."""
    return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)


def _in_use(directory: Path, path: Path, holder: dict[str, Any], host: str) -> str:
    gone = (
        f"if it has stopped, delete {path}"
        if holder["host"] != host
        else "wait for it to end (the lock of a process that has died is taken over)"
    )
    return (
        f"another job saves checkpoints into {directory} ({describe(holder)}; lock file "
        f"{path}): two jobs in one folder would delete each other's checkpoints; give this "
        f"one its own folder, or {gone}"
    )


def _take_over(path: Path, stale: dict[str, Any]) -> None:
    """Removes `path` if it still names `stale`: renamed aside first, so of two processes
    taking over at once only one removes it, and one that took a fresh lock puts it back."""
    aside = path.with_name(f"{LOCK}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if _holder(aside) != stale:  # a fresh lock, taken since we read it: put it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
    except CheckpointError:
        pass
    finally:
        aside.unlink(missing_ok=True)


LOCKS = _Locks()


class _Claims:
    """Which checkpoint callback of the running `fit` saves into each folder, in this
    process. The callbacks of one `fit` share its params dict (`CallbackList` hands the
    same one to each), which tells a callback of this fit from one left by an interrupted
    fit (whose `on_train_end` never ran)."""

    def __init__(self) -> None:
        self._by_folder: dict[str, tuple[Any, Any, Any]] = {}

    def check(self, folder: str, callback: Any) -> None:
        """Raises CheckpointError if another callback of `callback`'s fit saves into
        `folder`; that one's checkpointer is then closed (its lock released)."""
        held = self._by_folder.get(folder)
        if held is None or held[0] is callback or held[1] is not callback.params:
            return
        other, _, checkpointer = held
        del self._by_folder[folder]
        if checkpointer is not None:
            checkpointer.close()
        raise CheckpointError(
            f"{type(other).__name__} and {type(callback).__name__} both save into {folder}: "
            "one would delete or overwrite the other's checkpoints; give each callback its "
            f"own folder, e.g. {os.path.join(folder, 'backup')!r} and "
            f"{os.path.join(folder, 'best')!r}"
        )

    def take(self, folder: str, callback: Any, checkpointer: Any) -> None:
        self._by_folder[folder] = (callback, callback.params, checkpointer)

    def drop(self, folder: str, callback: Any) -> None:
        if self._by_folder.get(folder, (None,))[0] is callback:
            del self._by_folder[folder]


CLAIMS = _Claims()
