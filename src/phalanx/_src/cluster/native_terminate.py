"""A C++ `std::terminate` in a multi-process job waits for the watchdog's verdict.

Why: when a peer dies, the survivor's Gloo (or another native collective library) may see
the broken connection first, on one of XLA's threads, and throw a C++ exception no frame
catches (`gloo::EnforceNotMet`). The C++ runtime then calls `std::terminate`, which prints
"terminate called after throwing an instance of 'gloo::EnforceNotMet'" and aborts the
process at once, before phalanx's watchdog (`watchdog.PeerWatchdog`) can name the peer. No
Python code can catch that exception. So while the watchdog runs, phalanx installs its own
terminate handler: the failing thread parks there (it never returns to the code that
failed) and tells the watchdog, which names the stopped peer as usual (exit status 75), or,
if every peer is still answering after the heartbeat timeout, ends the process with a
`phalanx:` line saying that a native library failed (exit status 134, as the abort would
have given). The previous handler is restored at exit, before the interpreter finalizes.

The handler is set through the C++ runtime's `std::set_terminate` (libstdc++, or libc++ on
macOS), called with ctypes; where neither can be found, nothing is installed and the
process aborts as before.

Example:
  >>> hook = TerminateHook.install()     # the watchdog does this when it starts
  >>> hook.fired.is_set()                # True once a thread called std::terminate
  False
  >>> hook.uninstall()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

NATIVE_ABORT_STATUS = 134  # 128 + SIGABRT: what the process would have exited with
ENV = "PHALANX_NATIVE_TERMINATE"  # "0": install nothing (see the library's own message)
_HANDLER = ctypes.CFUNCTYPE(None)
# The C++ runtime's `std::set_terminate(void (*)())`, mangled.
_SET_TERMINATE = "_ZSt13set_terminatePFvvE"


def _runtime() -> ctypes.CDLL | None:
    """The C++ runtime library JAX's native code uses, or None."""
    names = ["libstdc++.so.6", "libc++.1.dylib"]
    found = ctypes.util.find_library("stdc++") or ctypes.util.find_library("c++")
    names += [found] if found else []
    for name in names:
        try:
            library = ctypes.CDLL(name)
            getattr(library, _SET_TERMINATE)
        except (OSError, AttributeError):
            continue
        return library
    return None


def native_failure_message(process_id: int, num_processes: int, waited: float) -> str:
    """The line printed when a native library called std::terminate and no peer stopped.

    Example:
      >>> native_failure_message(0, 2, 12.0)[:56]
      'phalanx: process 0 of 2: a native library (C++) failed '
    """
    return (
        f"phalanx: process {process_id} of {num_processes}: a native library (C++) failed "
        f"with an uncaught exception (std::terminate), and every peer was still answering "
        f"{waited:.0f} s later; the process stops, since its collectives can no longer be "
        "trusted. Run again; if it repeats, run with PHALANX_NATIVE_TERMINATE=0 to see the "
        "library's own message"
    )


class TerminateHook:
    """Phalanx's `std::terminate` handler while installed; `fired` is set when it ran."""

    def __init__(self, runtime: ctypes.CDLL) -> None:
        self.fired = threading.Event()
        self._set = getattr(runtime, _SET_TERMINATE)
        self._set.restype = ctypes.c_void_p
        self._set.argtypes = [ctypes.c_void_p]
        self._handler = _HANDLER(self._on_terminate)  # kept alive while installed
        self._previous: int | None = None

    @classmethod
    def install(cls) -> TerminateHook | None:
        """Installs the handler; None where the C++ runtime could not be found, or with
        PHALANX_NATIVE_TERMINATE=0."""
        runtime = None if os.environ.get(ENV, "1") == "0" else _runtime()
        if runtime is None:
            return None
        hook = cls(runtime)
        address = ctypes.cast(hook._handler, ctypes.c_void_p).value
        hook._previous = hook._set(address)
        return hook

    def uninstall(self) -> None:
        """Puts back the handler that was there before."""
        self._set(self._previous)

    def _on_terminate(self) -> None:
        # Runs on the failing native thread, which must never return into the code that
        # failed: it waits here (without the interpreter lock) for the watchdog to end the
        # process.
        sys.stderr.flush()
        self.fired.set()
        threading.Event().wait()
