"""Finding the state a step closes over, as TF programs write it, and redirecting it.

A TF custom loop's step reads `model`, `optimizer` and its metrics from the enclosing scope
(`def train_step(inputs): ... optimizer.apply_gradients(...)`). JAX traces functions of their
arguments, and Flax NNX refuses to let a traced step touch objects of another trace level.
`strategy.run` and `phalanx.function` therefore look for the NNX objects a step reaches,
carry their state through the compiled call as arguments, and inside the trace point the
names the step reads at fresh copies made from that state (then point them back).

What is searched, bounded in depth and count:
  * the step's closure cells and the globals its code names (nested functions, lambdas and
    comprehensions included);
  * the functions it reaches that way, recursively (library functions are skipped);
  * bound methods (their `self`), `functools.partial`s, `__wrapped__` functions;
  * the attributes of plain objects of the user's own classes, and lists / tuples / dicts
    held in those names.

What is carried: every Flax NNX graph node (modules, `nnx.Optimizer`, `nnx.metrics` and
`phalanx.metrics` objects), and the variables of Keras 3 models, layers, optimizers,
metrics, variables and seed generators on the JAX backend (keras_state.py: the step runs in
a `keras.StatelessScope` on their traced values). Objects phalanx cannot carry (TensorFlow
objects, Keras objects on another backend) raise a `TypeError` that names them and the fix.
Library objects (a `phalanx.Model`, a strategy, a dataset) are not searched.
"""

from __future__ import annotations

import contextlib
import functools
import sysconfig
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
from flax import nnx

from phalanx._src.strategy import keras_state

_MAX_FUNCTION_DEPTH = 8  # function -> function it calls -> ...
_MAX_OBJECT_DEPTH = 2  # plain object -> attribute -> attribute
_MAX_VISITS = 4000
# Functions of these packages never close over a user's model: their globals are not searched.
_LIBRARIES = frozenset(
    {
        "jax",
        "jaxlib",
        "flax",
        "optax",
        "numpy",
        "phalanx",
        "keras",
        "orbax",
        "grain",
        "tensorflow",
        "torch",
        "builtins",
        "functools",
        "typing",
        "collections",
        "contextlib",
        "abc",
        "importlib",
        "pytest",
        "_pytest",
        "pluggy",
    }
)
_STDLIB = sysconfig.get_paths().get("stdlib", "\0")


def _library(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in _LIBRARIES


class Slot:
    """A place that holds a value the step reads: a global, a closure cell, an attribute,
    a list or dict entry. `set` points it at another value."""

    __slots__ = ("get", "label", "root", "set")

    def __init__(
        self,
        label: str,
        get: Callable[[], Any],
        set: Callable[[Any], None],
        root: Slot | None = None,
    ) -> None:
        self.label = label
        self.get = get
        self.set = set
        self.root = root or self  # the slot whose value is put back afterwards


def _dict_slot(label: str, mapping: dict, key: Any) -> Slot:
    return Slot(label, lambda: mapping[key], lambda v: mapping.__setitem__(key, v))


def _cell_slot(label: str, cell: types.CellType) -> Slot:
    def put(value: Any) -> None:
        cell.cell_contents = value

    return Slot(label, lambda: cell.cell_contents, put)


def _attr_slot(label: str, obj: Any, name: str) -> Slot:
    return Slot(label, lambda: getattr(obj, name), lambda v: object.__setattr__(obj, name, v))


def _describe(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _unsupported(value: Any) -> str | None:
    """Why `value` cannot be carried through a compiled step, or None when it is not state."""
    if keras_state.is_keras_state(value):
        return keras_state.unsupported_backend()
    if (type(value).__module__ or "").split(".")[0] == "tensorflow":
        return (
            "a TensorFlow object; phalanx runs JAX, not TensorFlow graphs. Use a Flax NNX "
            "module, nnx.Optimizer and phalanx.metrics objects in the step"
        )
    return None


class Found:
    """The NNX objects a step reaches, the slots to redirect while it is traced, and the
    Keras objects' state (its carrier is among `nodes`)."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.labels: list[str] = []
        self.slots: list[Slot] = []
        self.keras: list[keras_state.KerasState] = []
        self._ids: set[int] = set()

    def add_node(self, node: Any, label: str) -> None:
        if id(node) not in self._ids:
            self._ids.add(id(node))
            self.nodes.append(node)
            self.labels.append(label)


def _code_names(code: types.CodeType, seen: set[int]) -> Iterator[str]:
    if id(code) in seen:
        return
    seen.add(id(code))
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const, seen)


class _Walker:
    def __init__(self, what: str) -> None:
        self.what = what
        self.found = Found()
        self.keras: dict[int, tuple[Any, str]] = {}
        self.visits = 0
        self.seen_functions: set[int] = set()
        self.seen_objects: set[int] = set()

    def function(self, fn: Any, depth: int) -> None:
        if depth > _MAX_FUNCTION_DEPTH or id(fn) in self.seen_functions:
            return
        self.seen_functions.add(id(fn))
        if isinstance(fn, functools.partial):
            self.function(fn.func, depth)
            for index, arg in enumerate(fn.args):
                self.value(arg, None, f"partial argument {index}", depth, 0)
            for key, arg in fn.keywords.items():
                self.value(arg, None, f"partial argument {key}", depth, 0)
            return
        if isinstance(fn, types.MethodType):
            self.value(fn.__self__, None, f"{fn.__func__.__qualname__}'s self", depth, 0)
            self.function(fn.__func__, depth)
            return
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None and callable(wrapped):
            self.function(wrapped, depth)
        if not isinstance(fn, types.FunctionType):
            inner = getattr(fn, "python_function", None)  # a phalanx.function object
            if callable(inner):
                self.function(inner, depth)
            return
        code = fn.__code__
        if _library(fn.__module__) or code.co_filename.startswith(_STDLIB):
            return
        if fn.__closure__:
            for name, cell in zip(code.co_freevars, fn.__closure__, strict=True):
                try:
                    contents = cell.cell_contents
                except ValueError:  # a cell not filled yet
                    continue
                self.value(contents, _cell_slot(name, cell), name, depth, 0)
        names = fn.__globals__
        for name in dict.fromkeys(_code_names(code, set())):
            if name in names:
                self.value(names[name], _dict_slot(name, names, name), name, depth, 0)

    def value(self, value: Any, slot: Slot | None, label: str, depth: int, obj_depth: int):
        self.visits += 1
        if self.visits > _MAX_VISITS:
            return
        if nnx.graph.is_graph_node(value):
            if slot is None:
                raise TypeError(
                    f"{self.what}: the step reaches the Flax NNX object `{label}` "
                    f"({_describe(value)}) through a bound method or functools.partial, where "
                    "phalanx cannot redirect it to the state it carries through the compiled "
                    "call; read it from a global or closure variable instead, or pass it as "
                    "an argument: strategy.run(step, args=(model, batch))"
                )
            self.found.add_node(value, label)
            self.found.slots.append(slot)
            return
        if isinstance(value, (types.ModuleType, type, str, bytes, int, float, bool)):
            return
        if value is None:
            return
        reason = _unsupported(value)
        if reason is not None:
            raise TypeError(
                f"{self.what}: the step reaches `{label}` ({_describe(value)}), {reason}"
            )
        if keras_state.is_keras_state(value):
            self.keras.setdefault(id(value), (value, label))
            return
        if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
            self.function(value, depth + 1)
            return
        if callable(value) and (
            hasattr(value, "python_function") or hasattr(value, "__wrapped__")
        ):  # a phalanx.function, a jax.jit or functools.wraps wrapper of the user's function
            self.function(value, depth + 1)
            return
        if isinstance(value, (list, dict, tuple)) and obj_depth < _MAX_OBJECT_DEPTH:
            self._container(value, slot, label, depth, obj_depth)
            return
        cls = type(value)
        if _library(cls.__module__) or obj_depth >= _MAX_OBJECT_DEPTH:
            return
        if id(value) in self.seen_objects:
            return
        self.seen_objects.add(id(value))
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            for name, attr in list(attributes.items()):
                self.value(
                    attr,
                    _attr_slot(f"{label}.{name}", value, name),
                    f"{label}.{name}",
                    depth,
                    obj_depth + 1,
                )
        call = vars(cls).get("__call__")
        if isinstance(call, types.FunctionType):
            self.function(call, depth + 1)

    def _container(self, value: Any, slot: Slot | None, label: str, depth: int, obj_depth: int):
        if id(value) in self.seen_objects:
            return
        self.seen_objects.add(id(value))
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        if isinstance(value, tuple):
            # A tuple cannot change in place: its slot is the name holding it, rebuilt.
            for index, item in items:
                self.value(
                    item,
                    _tuple_slot(slot, index) if slot else None,
                    f"{label}[{index}]",
                    depth,
                    obj_depth + 1,
                )
            return
        for key, item in items:
            self.value(
                item,
                _dict_slot(f"{label}[{key!r}]", value, key),
                f"{label}[{key!r}]",
                depth,
                obj_depth + 1,
            )


def _tuple_slot(parent: Slot, index: int) -> Slot:
    def put(v: Any) -> None:
        old = parent.get()
        items = list(old)
        items[index] = v
        parent.set(type(old)(*items) if hasattr(old, "_fields") else type(old)(items))

    return Slot(f"{parent.label}[{index}]", lambda: parent.get()[index], put, parent.root)


def find_state(fn: Callable, what: str = "strategy.run", arguments: tuple = ()) -> Found:
    """The NNX and Keras objects `fn` reaches through its closure and globals (see the
    module doc), and through the attributes of `arguments` (the call's non-array arguments:
    a trainer object passed as `self`, say).

    Raises:
      TypeError: `fn` reaches an object phalanx cannot carry; the message names it.
      ValueError: `fn` reaches a Keras model that is not built (keras_state.collect).
    """
    walker = _Walker(what)
    walker.function(fn, 0)
    for index, argument in enumerate(arguments):
        if not nnx.graph.is_graph_node(argument):  # those travel as arguments already
            walker.value(argument, None, f"argument {index}", 0, 0)
    if walker.keras:
        state = keras_state.collect(list(walker.keras.values()), what)
        walker.found.keras.append(state)
        walker.found.add_node(state.carrier, state.label)
    return walker.found


def join(nodes: list[Any], found: Found) -> list[int]:
    """Appends to `nodes` (the NNX objects passed as arguments) the found ones not among
    them, so that all travel in one split (objects shared between them stay shared);
    returns each found object's index in `nodes`."""
    index = {id(node): i for i, node in enumerate(nodes)}
    for node in found.nodes:
        if id(node) not in index:
            index[id(node)] = len(nodes)
            nodes.append(node)
    return [index[id(node)] for node in found.nodes]


@contextlib.contextmanager
def redirected(found: Found, copies: list[Any], what: str = "strategy.run") -> Iterator[None]:
    """Points every slot of `found` at the copy of the object it held, then back, and runs
    the Keras objects found on their copies' traced values (`KerasState.scope`); meanwhile
    a read of an NNX variable the search did not find is an error (`_uncarried_reads`)."""
    by_id = {id(node): copy for node, copy in zip(found.nodes, copies, strict=True)}
    saved: dict[int, tuple[Slot, Any]] = {}
    try:
        for slot in found.slots:
            old = slot.get()
            if id(old) in by_id:
                root = slot.root
                saved.setdefault(id(root), (root, root.get()))
                slot.set(by_id[id(old)])
        with _uncarried_reads(what), contextlib.ExitStack() as keras_scopes:
            for state in found.keras:
                keras_scopes.enter_context(state.scope(by_id[id(state.carrier)]))
            yield
    finally:
        for root, old in reversed(list(saved.values())):
            root.set(old)


_WATCH = threading.local()


@contextlib.contextmanager
def _uncarried_reads(what: str) -> Iterator[None]:
    """Refuses, while a step is traced, to read an NNX variable of an object that was not
    carried: one made outside this trace (by a route the search does not cover, such as a
    class attribute) whose value is a concrete array. XLA would bake that value into the
    compiled step as a constant, and a later change to the object (a training step outside
    this one, a restore) would go unseen: TF reads a variable's current value every call."""
    original = nnx.Variable.get_value
    depth = getattr(_WATCH, "depth", 0)
    _WATCH.depth = depth + 1
    if depth == 0:
        owner = threading.get_ident()

        def get_value(self: nnx.Variable, *args: Any, **kwargs: Any) -> Any:
            if (
                threading.get_ident() == owner
                and getattr(_WATCH, "depth", 0)
                and not self.hijax
                and not self._can_update
                and isinstance(self.get_raw_value(), jax.Array)
                and not isinstance(self.get_raw_value(), jax.core.Tracer)
            ):
                raise ValueError(
                    f"{what}: the step reads a {type(self).__name__} of shape "
                    f"{tuple(self.get_raw_value().shape)} from a Flax NNX object phalanx did "
                    "not find among the objects the step names (its globals, closure variables "
                    "and the attributes of your own objects, two levels deep). Its value would "
                    "be compiled in as a constant and later changes to it missed. Pass the "
                    "object as an argument, e.g. strategy.run(step, args=(model, batch)), or "
                    "name it from the step directly"
                )
            return original(self, *args, **kwargs)

        nnx.Variable.get_value = get_value  # type: ignore[method-assign]
    try:
        yield
    finally:
        _WATCH.depth = depth
        if depth == 0:
            nnx.Variable.get_value = original  # type: ignore[method-assign]


def is_trace_level_error(error: Exception) -> bool:
    """True for Flax's errors about an NNX object used from another trace level."""
    text = str(error)
    return type(error).__name__ == "TraceContextError" or "different trace level" in text


def trace_error(what: str, error: Exception) -> ValueError:
    """The error for a step that changed an NNX object phalanx did not find."""
    return ValueError(
        f"{what}: the step changed a Flax NNX object that phalanx did not find in its "
        f"closure or globals ({error}). phalanx carries the objects a step names directly "
        "(globals, closure variables, attributes of your own objects); pass any other one as "
        "an argument, e.g. strategy.run(step, args=(model, optimizer, batch))"
    )


def translated(what: str, error: Exception) -> Exception | None:
    """A clear error for a TF idiom that ends in a raw JAX / Flax error inside a step, or
    None when `error` is not one of those."""
    text = str(error)
    if is_trace_level_error(error):
        return trace_error(what, error)
    if isinstance(error, TypeError) and "requires at least 1 positional argument" in text:
        return TypeError(
            f"{what}: the step differentiates a function of no arguments ({text}), as a "
            "tf.GradientTape records a computation. JAX differentiates a function with "
            "respect to its arguments: write `def loss_fn(model): ...` and "
            "`loss, grads = nnx.value_and_grad(loss_fn)(model)`, then "
            f"`optimizer.update(model, grads)`. {_KERAS_GRADIENTS}"
        )
    if "__jax_array__" in text:
        return TypeError(
            f"{what}: the step passes objects that are not arrays, such as Keras variables "
            f"(model.trainable_variables), to a JAX transform ({text}). {_KERAS_GRADIENTS}"
        )
    return None


_KERAS_GRADIENTS = (
    "With a Keras model, differentiate a function of the variables' values, as Keras's JAX "
    "training loop does: `def loss_fn(trainable): logits, non_trainable_updates = "
    "model.stateless_call(trainable, non_trainable, x, training=True); ...`, "
    "`grads = jax.grad(loss_fn)([v.value for v in model.trainable_variables])`, then "
    "`optimizer.apply_gradients(zip(grads, model.trainable_variables))`"
)
