"""Everything phalanx starts is stopped before the interpreter finalizes.

Why: at exit, Python finalizes while daemon threads may still run. Such a thread is ended
with `pthread_exit` the next time it takes the interpreter lock. When that happens inside a
C++ frame that must not unwind, the C++ runtime calls `std::terminate`, and a program that
printed all its results dies with "terminate called after throwing an instance of ''",
"FATAL: exception not rethrown" and exit status 134. That was the main job's abort in 2
runs of 10: the checkpoint writer's thread, lingering after its last save, released the
arrays of that save while Python finalized, and a `jax.Array`'s destructor waits for its
buffer with the lock released (its core dump: `PyArray_Storage::~PyArray_Storage ->
std::terminate` on the writer's thread, `Py_FinalizeEx` on the main thread).

So every object of phalanx that owns a thread, a pool or a process registers here with
`track`, and one exit hook calls `close()` on those still alive, newest first, while the
interpreter is whole. The hook is registered at the first `track`, after JAX's own exit
hooks (so it runs before them: `atexit` runs the last registered first). Objects are held
weakly: tracking never keeps one alive, and one collected earlier has closed itself.

Example:
  >>> class Pool:
  ...     def __init__(self):
  ...         self.thread = start_thread()
  ...         shutdown.track(self)           # closed at exit if still open
  ...     def close(self):
  ...         stop_and_join(self.thread)
  ...         shutdown.forget(self)
"""

from __future__ import annotations

import atexit
import sys
import threading
import weakref
from typing import Any

_lock = threading.Lock()
_live: dict[int, weakref.ref] = {}  # id -> the object, in the order tracked
_hooked = False


def track(obj: Any) -> Any:
    """Calls `obj.close()` at interpreter exit if `obj` is still alive then; returns `obj`."""
    global _hooked
    key = id(obj)
    with _lock:
        if not _hooked:
            atexit.register(close_all)
            _hooked = True
        _live.pop(key, None)  # tracked again: it moves to the end (closed first)
        _live[key] = weakref.ref(obj, lambda _, key=key: _forget_key(key))
    return obj


def forget(obj: Any) -> None:
    """Stops tracking `obj` (it closed itself); harmless if it was not tracked."""
    _forget_key(id(obj))


def _forget_key(key: int) -> None:
    with _lock:
        _live.pop(key, None)


def tracked() -> list[Any]:
    """The tracked objects still alive, oldest first (for tests and diagnostics)."""
    with _lock:
        refs = list(_live.values())
    return [obj for obj in (ref() for ref in refs) if obj is not None]


def close_all() -> None:
    """Closes every tracked object still alive, newest first. An object whose `close`
    raises is reported on stderr and the others are still closed: this runs at exit,
    where an exception would only hide the rest."""
    with _lock:
        refs = list(_live.values())
        _live.clear()
    for ref in reversed(refs):
        obj = ref()
        if obj is None:
            continue
        try:
            obj.close()
        except Exception as error:
            print(
                f"phalanx: closing {type(obj).__name__} at exit failed: "
                f"{type(error).__name__}: {error}",
                file=sys.stderr,
            )
