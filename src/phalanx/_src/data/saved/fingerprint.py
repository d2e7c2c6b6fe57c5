"""A pipeline's fingerprint: a hash of what decides its elements, for `snapshot` and `save`.

A snapshot is served only to the pipeline that wrote it, so the hash covers what changes
the elements, as tf.data's fingerprint of the dataset graph does: every node's kind and
settings (seeds, sizes, files with their sizes and modification times, in-memory arrays by
content), the functions' code, defaults, closures and the globals they use (a global value,
or a function of the user's, followed in turn; a library's function by its name and the
library's version), and the options. What only decides *how* elements are computed (the
number of worker threads or processes, AUTOTUNE's decisions) is left out, so changing it
keeps a snapshot. An object whose content cannot be read (no `__dict__`, not picklable,
a repr with a memory address) makes the fingerprint this process's own: the snapshot then
is never reused by another run rather than risk serving stale elements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import pickle
import sys
import types
from typing import Any

import numpy as np

from phalanx._src.data import plan

# Fields that say how elements are computed, not what they are, by node class name.
_HOW = {
    "Map": {"workers", "kind"},
    "ParallelStreamMap": {"workers", "tuner"},
    "Snapshot": {"path", "compression", "remote"},
    "StreamSnapshot": {"path", "compression", "remote"},
}
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def fingerprint(node: plan.Node, options: Any = None) -> str:
    """The hex fingerprint of the pipeline ending at `node` with `options`."""
    hasher = _Hasher()
    hasher.value(options)
    for each in plan.chain(node):
        hasher.node(each)
    return hasher.digest()


def _library(module: str | None) -> str | None:
    """`module`'s top package and version when it is not the user's code, else None."""
    if not module:
        return None
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return top
    file = getattr(sys.modules.get(top), "__file__", None) or ""
    if top == "phalanx" or "site-packages" in file or "dist-packages" in file:
        return f"{top}=={getattr(sys.modules.get(top), '__version__', '?')}"
    return None


class _Hasher:
    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self._seen: dict[int, int] = {}  # id -> order of first visit (cycles, shared objects)
        self._keep: list[Any] = []  # keeps the visited alive, so that ids stay unique

    def digest(self) -> str:
        return self._hash.hexdigest()

    def _put(self, *parts: Any) -> None:
        for part in parts:
            data = part if isinstance(part, bytes) else repr(part).encode()
            self._hash.update(len(data).to_bytes(8, "little") + data)

    def node(self, node: plan.Node) -> None:
        kind = type(node)
        self._put("node", kind.__module__, kind.__qualname__)
        skip = _HOW.get(kind.__name__, set())
        content = getattr(node, "content_id", None)  # a node over files it describes itself
        if content is not None:
            self._put(content())
        for field in dataclasses.fields(node):  # type: ignore[arg-type]
            if not field.repr or field.name in skip or field.name in ("parent", "parents"):
                continue
            value = getattr(node, field.name)
            self._put(field.name)
            self.value(value)
            for path in (
                [value] if isinstance(value, str) else value if isinstance(value, tuple) else []
            ):
                if isinstance(path, str) and os.path.isfile(path):
                    stat = os.stat(path)
                    self._put("file", stat.st_size, stat.st_mtime_ns)

    def value(self, value: Any) -> None:
        if isinstance(value, _PLAIN):
            self._put(type(value).__name__, value)
            return
        if id(value) in self._seen:
            self._put("seen", self._seen[id(value)])
            return
        self._seen[id(value)] = len(self._seen)
        self._keep.append(value)
        if isinstance(value, np.ndarray | np.generic):
            self._array(np.asarray(value))
        elif isinstance(value, tuple | list | set | frozenset):
            self._put(type(value).__name__, len(value))
            items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
            for item in items:
                self.value(item)
        elif isinstance(value, dict):
            self._put("dict", len(value))
            for key in sorted(value, key=repr):
                self.value(key)
                self.value(value[key])
        elif isinstance(value, functools.partial):
            self._put("partial")
            self.value(value.func)
            self.value(value.args)
            self.value(value.keywords)
        elif isinstance(value, types.FunctionType):
            self._function(value)
        elif isinstance(value, types.MethodType):
            self._put("method")
            self.value(value.__func__)
            self.value(value.__self__)
        elif isinstance(value, types.ModuleType):
            self._put("module", value.__name__, _library(value.__name__))
        elif isinstance(value, type):
            self._class(value)
        elif isinstance(value, plan.Node):
            for each in plan.chain(value):
                self.node(each)
        elif isinstance(getattr(value, "_node", None), plan.Node):
            # A Dataset (in a flat_map's closure, say): its plan and options, not its
            # epoch counter or AUTOTUNE's measurements, which change as it runs.
            self._put("dataset")
            self.value(value._node)
            self.value(getattr(value, "_options", None))
        elif callable(getattr(value, "__wrapped__", None)):  # jax.jit, functools.wraps
            self._put("wrapped", type(value).__qualname__)
            self.value(value.__wrapped__)
        else:
            self._object(value)

    def _array(self, array: np.ndarray) -> None:
        self._put("array", array.dtype.str, array.shape)
        if array.dtype.kind == "O":
            items = array.reshape(-1).tolist()
            if all(type(item) is str for item in items):  # file names: one hash call
                self._put("\x00".join(items))
                return
            for item in items:
                self.value(item)
        else:
            self._hash.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)

    def _function(self, fn: types.FunctionType) -> None:
        library = _library(fn.__module__)
        self._put("function", fn.__module__, fn.__qualname__, library)
        if library is not None and fn.__module__ != "__main__":
            return  # a library function: its name and the library's version
        self._code(fn.__code__)
        self.value(fn.__defaults__)
        self.value(fn.__kwdefaults__)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents)
            except ValueError:  # an empty cell
                self._put("empty cell")
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                self._put("global", name)
                self.value(fn.__globals__[name])

    def _code(self, code: types.CodeType) -> None:
        self._put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._code(const)
            else:
                self.value(const)

    def _class(self, cls: type) -> None:
        library = _library(cls.__module__)
        self._put("class", cls.__module__, cls.__qualname__, library)
        if library is None or cls.__module__ == "__main__":
            for name, member in sorted(vars(cls).items()):
                if isinstance(member, types.FunctionType | staticmethod | classmethod | property):
                    self._put(name)
                    self.value(getattr(member, "__func__", getattr(member, "fget", member)))

    def _object(self, value: Any) -> None:
        self._class(type(value))
        state = getattr(value, "__dict__", None)
        if state is not None:
            self.value({k: v for k, v in state.items() if not _unreadable(v)})
            return
        with contextlib.suppress(Exception):  # any failure means: unreadable
            self._put("pickle", pickle.dumps(value, protocol=4))
            return
        text = repr(value)
        # An address makes the fingerprint this process's own (see the module docstring).
        self._put("repr", text, os.getpid() if " at 0x" in text else None)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _unreadable(value: Any) -> bool:
    """Locks, threads and files: state that never decides an element."""
    return type(value).__module__ in ("_thread", "threading", "_io", "concurrent.futures")
