"""Process workers for Python-bound maps: elements computed in other processes, in order.

Why: a map of small NumPy operations driven from Python holds the GIL, so threads only
fight over it. Worker processes each run the pipeline's element function (sent once, with
cloudpickle, when the workers start) on the steps the parent hands them, round robin.

How results come back: the parent owns a few shared-memory slots per worker (created,
grown and unlinked by the parent, so its resource tracker cleans them up even if it is
killed). A worker writes an element's numeric arrays into the slot it was told to use and
sends only their layout (dtype, shape, offset, and the element's structure) through a pipe;
the parent copies the arrays out and reuses the slot. Strings, bytes and objects, which
shared memory cannot carry, travel pickled in the layout: an element comes back as made.

Lifetime: workers start from a fork server (one clean, single-threaded process per parent
that has already imported NumPy and phalanx, so a worker starts in milliseconds without
forking a process that runs JAX's threads). They stop when the iterator closes (a stop
message, then terminate, then kill), when the parent's pipe closes (the parent exited or
was killed: a blocked `recv` ends with EOF), and they check every second that the parent
still lives. A worker's exception is sent back with its formatted traceback and raised in
the consumer when it reaches that element, chained to the remote traceback.

Scripts that use process workers need an `if __name__ == "__main__":` guard: like every
`spawn`/`forkserver` process, a worker imports the main module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import traceback
from multiprocessing import shared_memory
from typing import Any

import cloudpickle
import jax
import numpy as np

from phalanx._src.data import plan

_ALIGN = 64
_FIRST_SLOT_BYTES = 1 << 16
_POLL_S = 1.0  # how often an idle worker checks that its parent still lives
_JOIN_S = 2.0
_context: Any = None


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """Where one numeric array of an element lies in a slot (`scalar`: a NumPy scalar), or
    (offset -1) a leaf shared memory cannot carry (strings, bytes, objects): `value`."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    scalar: bool = False
    value: Any = None


def _numeric(leaf: Any) -> bool:
    return isinstance(leaf, np.ndarray | np.generic) and leaf.dtype.kind in "biufcmM"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (the `__cause__`).

    Example:
      >>> try:
      ...     next(iter(ds.map(parse, num_parallel_calls=2, workers="process")))
      ... except ValueError as error:
      ...     print(error.__cause__)   # the worker's own traceback
    """

    def __str__(self) -> str:
        return "\n" + str(self.args[0])


def _get_context() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        # Imported once in the fork server, so each worker starts without importing them.
        _context.set_forkserver_preload(["numpy", "jax", "phalanx._src.data.workers"])
    return _context


def warm_up() -> None:
    """Starts the fork server now, so that its imports overlap whatever runs before the
    first epoch (a compile); called when a pipeline asks for process workers."""
    _get_context()
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _layout(leaves: list[Any]) -> tuple[list[int], int]:
    """Each numeric leaf's offset in a slot (-1: sent inline), and the bytes they need."""
    offsets, end = [], 0
    for leaf in leaves:
        if not _numeric(leaf):
            offsets.append(-1)
            continue
        offsets.append(end)
        end += -(-leaf.nbytes // _ALIGN) * _ALIGN
    return offsets, max(end, 1)


def _skeleton(treedef: Any, leaves: list[Any], offsets: list[int]) -> bytes:
    """The element's structure with each leaf's place in the slot, or the leaf itself."""
    parts = [
        _Leaf("", (), -1, value=leaf)
        if offset < 0
        else _Leaf(leaf.dtype.str, leaf.shape, offset, isinstance(leaf, np.generic))
        for leaf, offset in zip(leaves, offsets, strict=True)
    ]
    try:
        return cloudpickle.dumps(treedef.unflatten(parts))
    except Exception as error:
        raise TypeError(
            f"a map in worker processes returned a leaf that cannot be pickled back ({error}); "
            "return NumPy arrays, strings or bytes, or use workers='thread'"
        ) from error


def _serve(conn: Any, parent: int, payload: bytes) -> None:
    """A worker's loop: (key, step, slot, name, size) in, an element's layout (or error) out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    root = cloudpickle.loads(payload)
    slots: dict[int, shared_memory.SharedMemory] = {}
    pending: Any = None  # (step, leaves, treedef): computed, waiting for a larger slot
    try:
        while True:
            if not conn.poll(_POLL_S):
                if not _alive(parent):
                    return
                continue
            try:
                message = conn.recv()
            except EOFError:
                return  # the parent closed the pipe or died
            if message is None:
                return
            key, step, slot, name, size = message
            try:
                if pending is None or pending[0] != (key, step):
                    # As made: no np.ascontiguousarray, which makes a scalar 1-d.
                    began, cpu = time.perf_counter(), time.thread_time()  # for AUTOTUNE
                    leaves, treedef = jax.tree.flatten(plan.element(root, key, step))
                    cost = (time.perf_counter() - began, time.thread_time() - cpu)
                    pending = ((key, step), leaves, treedef, cost)
                _, leaves, treedef, cost = pending
                offsets, need = _layout(leaves)
                if need > size:
                    conn.send(("grow", step, need))
                    continue
                shm = slots.get(slot)
                if shm is None or shm.name != name:
                    if shm is not None:
                        shm.close()
                    shm = slots[slot] = shared_memory.SharedMemory(name=name)
                for leaf, offset in zip(leaves, offsets, strict=True):
                    if offset < 0:
                        continue
                    target = np.ndarray(leaf.shape, leaf.dtype, buffer=shm.buf, offset=offset)
                    target[...] = leaf
                    del target  # release the export of shm.buf
                pending = None
                conn.send(("ok", step, _skeleton(treedef, leaves, offsets), *cost))
            except Exception as error:  # sent to the parent, raised there in order
                pending = None
                try:
                    blob = cloudpickle.dumps(error)
                except Exception:
                    blob = None
                conn.send(("error", step, blob, traceback.format_exc(), repr(error)))
    except (BrokenPipeError, EOFError, KeyboardInterrupt):
        return
    finally:
        for shm in slots.values():
            shm.close()


class Processes:
    """`workers` processes compute the elements of plan `node`, `depth` each in flight.

    `begin(key, start, stop)` starts an iteration (elements `start, start+1, ...` of
    iteration `key`); between iterations the workers wait, so an epoch's end can hand them
    to the next epoch (`release`) instead of starting new ones.

    Raises (from `next`): the worker's own exception, chained to a `RemoteTraceback`; a
    RuntimeError if a worker dies without answering (killed, out of memory).
    """

    def __init__(self, node: Any, workers: int, depth: int = 2) -> None:
        try:
            payload = cloudpickle.dumps(node)
        except Exception as error:
            raise TypeError(
                f"workers='process' sends the pipeline to worker processes, but it cannot be "
                f"pickled ({type(error).__name__}: {error}). Make the map function and what it "
                "uses picklable (module-level functions, NumPy arrays), or use threads: drop "
                "workers='process'."
            ) from error
        self.node = node
        self.workers = workers
        self._key: tuple[int, ...] = ()
        self._start = self._stop = self._next_submit = self._next_out = 0
        self.cost = (0.0, 0.0)  # the last element's (wall, CPU) seconds in its worker
        self._costs: dict[int, tuple[float, float]] = {}
        self._depth = depth
        self._closed = False
        ctx = _get_context()
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._slots: list[list[Any]] = [[None] * depth for _ in range(workers)]
        self._free = [list(range(depth)) for _ in range(workers)]
        self._where: dict[int, tuple[int, int]] = {}  # step -> (worker, slot)
        self._done: dict[int, Any] = {}
        self._gone: set[int] = set()  # workers whose pipe closed
        try:
            for w in range(workers):
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_serve,
                    args=(theirs, os.getpid(), payload),
                    name=f"phalanx-worker-{w}",
                    daemon=True,
                )
                proc.start()
                theirs.close()  # only the worker holds its end: its recv sees our exit
                self._conns.append(mine)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def begin(self, key: tuple[int, ...], start: int, stop: int) -> Processes:
        """Starts iteration `key` at element `start` (the workers must be idle)."""
        if not self.idle:
            raise RuntimeError("begin() while elements are still in flight")
        self._key, self._start, self._stop = key, start, stop
        self._next_submit = self._next_out = start
        return self

    @property
    def idle(self) -> bool:
        """Whether no element is being computed or waiting to be taken."""
        return not self._closed and not self._where and not self._done

    @property
    def alive(self) -> bool:
        """Whether every worker still runs."""
        return not self._closed and all(p.is_alive() for p in self._procs)

    def drain(self) -> list[Any]:
        """Submits nothing more and takes the elements in flight, in order, so that the
        workers go idle and can be parked (`release`) when AUTOTUNE leaves this level: the
        elements were computed anyway and come next, and their slots are free again.

        Stops early at an element that failed or a worker that died, and then stops the
        workers: whoever computes that element next raises its error (or succeeds).
        """
        elements: list[Any] = []
        self._stop = self._next_submit
        while self.alive and self._next_out < self._stop:
            try:
                while self._next_out not in self._done:
                    self._receive()
            except RuntimeError:  # a worker died
                self.close()
                break
            element = self._done.pop(self._next_out)
            self._costs.pop(self._next_out, None)
            if isinstance(element, _Failure):
                self.close()
                break
            elements.append(element)
            self._next_out += 1
        return elements

    def release(self, park: Any) -> None:
        """At an iteration's end: hands idle workers to `park` for the next one, else stops."""
        if self.idle and self.alive:
            park(self)
        else:
            self.close()

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (for tests and monitoring)."""
        return [p.pid for p in self._procs]

    def _slot(self, w: int, slot: int, size: int) -> Any:
        shm = self._slots[w][slot]
        if shm is None or shm.size < size:
            if shm is not None:
                shm.close()
                shm.unlink()
            shm = self._slots[w][slot] = shared_memory.SharedMemory(create=True, size=size)
        return shm

    def _send(self, step: int, size: int = 0) -> None:
        w, slot = self._where[step]
        shm = self._slot(w, slot, max(size, _FIRST_SLOT_BYTES))
        self._conns[w].send((self._key, step, slot, shm.name, shm.size))

    def _submit(self) -> None:
        n = len(self._procs)
        while self._next_submit < self._stop:
            w = (self._next_submit - self._start) % n
            if not self._free[w]:
                return  # round robin keeps every worker's queue in step order
            self._where[self._next_submit] = (w, self._free[w].pop())
            self._send(self._next_submit)
            self._next_submit += 1

    def _copy_out(self, w: int, slot: int, blob: bytes) -> Any:
        buf = self._slots[w][slot].buf
        skeleton = cloudpickle.loads(blob)

        def read(leaf: _Leaf) -> Any:
            if leaf.offset < 0:
                return leaf.value
            view = np.ndarray(leaf.shape, np.dtype(leaf.dtype), buffer=buf, offset=leaf.offset)
            return view[()] if leaf.scalar else view.copy()

        return jax.tree.map(read, skeleton, is_leaf=lambda x: isinstance(x, _Leaf))

    def _receive(self) -> None:
        ready = multiprocessing.connection.wait(
            self._conns + [p.sentinel for p in self._procs], timeout=_POLL_S
        )
        for item in ready:
            if item in self._conns:
                w = self._conns.index(item)
                if w in self._gone:
                    continue
                try:
                    message = item.recv()
                except (EOFError, ConnectionResetError):  # reset: killed mid-message
                    self._gone.add(w)
                    continue
                self._handle(w, message)
        if self._next_out not in self._where:
            return
        w = self._where[self._next_out][0]
        proc = self._procs[w]
        if w in self._gone or (not proc.is_alive() and not self._conns[w].poll()):
            proc.join(_JOIN_S)
            code = proc.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            raise RuntimeError(
                f"map worker process {w} (pid {proc.pid}) died with {how} while computing "
                f"element {self._next_out}; if it ran out of memory, use fewer workers or "
                "smaller elements."
            )

    def _handle(self, w: int, message: tuple) -> None:
        kind, step = message[0], message[1]
        _, slot = self._where[step]
        if kind == "grow":
            self._send(step, 2 * message[2])
            return
        if kind == "ok":
            self._done[step] = self._copy_out(w, slot, message[2])
            self._costs[step] = message[3:5]
        else:
            self._done[step] = _Failure(*message[2:])
        del self._where[step]
        self._free[w].append(slot)

    def next(self) -> Any:
        if self._closed:
            raise RuntimeError("the worker processes were closed")
        self._submit()
        step = self._next_out
        while step not in self._done:
            self._receive()
            self._submit()
        element = self._done.pop(step)
        self.cost = self._costs.pop(step, (0.0, 0.0))
        self._next_out += 1
        if isinstance(element, _Failure):
            self.close()
            element.throw(step)
        self._submit()
        return element

    def close(self) -> None:
        """Stops the workers (asks, then terminates, then kills) and frees the slots."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(_JOIN_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(_JOIN_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        for row in self._slots:
            for shm in row:
                if shm is not None:
                    shm.close()
                    shm.unlink()
        self._slots = []
        self._done.clear()
        self._costs.clear()


@dataclasses.dataclass
class _Failure:
    blob: bytes | None
    formatted: str
    described: str

    def throw(self, step: int) -> None:
        remote = RemoteTraceback(self.formatted)
        error = None
        if self.blob is not None:
            try:
                error = cloudpickle.loads(self.blob)
            except Exception:
                error = None
        if not isinstance(error, BaseException):
            error = RuntimeError(f"map worker failed on element {step}: {self.described}")
        raise error from remote
