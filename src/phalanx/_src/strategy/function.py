"""`phalanx.function`: `tf.function`'s counterpart, a compiled call that closes over state.

`@tf.function` becomes `@phalanx.function` and nothing else changes: the decorated function
is compiled with `jax.jit` once per input signature (the shapes and dtypes of its array
arguments, and the values of its other arguments), and the Flax NNX objects and Keras 3
models, optimizers and metrics it reaches (passed in, or read from its closure and globals,
through the functions it calls: see `lifting.py`) are carried through the compiled call and
updated in place afterwards, so `strategy.run(train_step, ...)` inside it trains the model as
the TF program does.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import errors as flax_errors
from flax import nnx

from phalanx._src.strategy import lifting, padding
from phalanx._src.strategy.values import DISTRIBUTED, MIRRORED

_ARRAY = (jax.Array, np.ndarray, np.generic)
_NODE, _ARR, _STATIC = "node", "array", ""


def _is_data_stream(leaf: Any) -> bool:
    """A dataset or iterator: iterated in Python, not traced (as tf.function iterates one)."""
    if isinstance(leaf, (*_ARRAY, str, bytes, dict, list, tuple)) or nnx.graph.is_graph_node(leaf):
        return False
    return hasattr(leaf, "__iter__") or hasattr(leaf, "__next__")


def _static_key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


class _Signature:
    """One call's arguments split into NNX objects, traced arrays and static values."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        leaves, self.treedef = jax.tree.flatten((args, kwargs), is_leaf=nnx.graph.is_graph_node)
        self.kinds: list[str] = []
        self.arrays: list[Any] = []
        self.statics: list[Any] = []
        nodes: list[Any] = []
        for leaf in leaves:
            if nnx.graph.is_graph_node(leaf):
                self.kinds.append(_NODE)
                nodes.append(leaf)
            elif isinstance(leaf, _ARRAY):
                self.kinds.append(_ARR)
                self.arrays.append(leaf)
            else:
                self.kinds.append(_STATIC)
                self.statics.append(leaf)
        # A distributed batch that is a bare array carries its mask by identity; the traced
        # copy gets it again inside the trace.
        self.masks = [DISTRIBUTED.mask_of(a) for a in self.arrays]
        self.found = lifting.find_state(fn, "phalanx.function", tuple(self.statics))
        self.num_arg_nodes = len(nodes)
        self.lifted_index = lifting.join(nodes, self.found)
        self.nodes = nodes
        self.graphdef, self.state = nnx.split(nodes) if nodes else (None, None)

    def key(self) -> tuple:
        shapes = tuple((np.shape(a), str(a.dtype)) for a in self.arrays)
        return (
            self.treedef,
            tuple(self.kinds),
            tuple(_static_key(s) for s in self.statics),
            self.graphdef,
            tuple(self.found.labels),
            shapes,
            tuple(m is not None for m in self.masks),
        )


class _Traced:
    """The jitted function for one signature, and what its outputs are."""

    def __init__(self, function: Function, signature: _Signature) -> None:
        self.function = function
        self.sig = signature
        self.out_treedef: Any = None
        self.mirrored: list[bool] = []
        self.ignoring_mask: list[Callable] = []  # steps run without the mask (padding.py)
        self.call = jax.jit(self._body)

    def _body(self, state: Any, arrays: list, masks: list) -> Any:
        sig = self.sig
        merged = nnx.merge(sig.graphdef, state) if sig.graphdef is not None else []
        nodes, arrays_it, statics = (
            iter(merged[: sig.num_arg_nodes]),
            iter(arrays),
            iter(sig.statics),
        )
        leaves = []
        for kind in sig.kinds:
            if kind == _NODE:
                leaves.append(next(nodes))
            elif kind == _ARR:
                leaves.append(next(arrays_it))
            else:
                leaves.append(next(statics))
        for array, mask in zip(arrays, masks, strict=True):
            if mask is not None:
                DISTRIBUTED.register(array, mask)
        args, kwargs = jax.tree.unflatten(sig.treedef, leaves)
        copies = [merged[i] for i in sig.lifted_index]
        with (
            lifting.redirected(sig.found, copies, f"phalanx.function {self.function.__name__}"),
            padding.collecting() as self.ignoring_mask,
        ):
            out = self.function.python_function(*args, **kwargs)
        out_leaves, self.out_treedef = jax.tree.flatten(out)
        for leaf in out_leaves:
            if not isinstance(leaf, (*_ARRAY, bool, int, float, complex)):
                raise TypeError(
                    f"phalanx.function {self.function.__name__}: the function returned "
                    f"{type(leaf).__name__} {leaf!r:.60}; a compiled function returns arrays, "
                    "numbers, PerReplica values, or tuples / lists / dicts of them"
                )
        self.mirrored = [MIRRORED.get(leaf) is not None for leaf in out_leaves]
        return out_leaves, (nnx.state(merged) if sig.graphdef is not None else None)


class Function:
    """A function compiled once per input signature that may update the state it reaches.

    `phalanx.function` is `tf.function`'s counterpart; see `phalanx.function`.
    """

    def __init__(self, python_function: Callable, jit_compile: bool | None = None) -> None:
        if not callable(python_function):
            raise TypeError(f"phalanx.function needs a function, got {python_function!r}")
        functools.update_wrapper(self, python_function)
        self.python_function = python_function
        self.jit_compile = jit_compile
        self._cache: dict[Any, _Traced] = {}

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # A decorated method: bind like a function does.
        return self if instance is None else types.MethodType(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = jax.tree.leaves((args, kwargs), is_leaf=nnx.graph.is_graph_node)
        if any(_is_data_stream(leaf) for leaf in leaves):
            # A loop over a dataset inside the function (TF's `for x in dist_dataset:` in a
            # tf.function): the Python runs as written; each strategy.run in it is compiled.
            return self.python_function(*args, **kwargs)
        sig = _Signature(self.python_function, args, kwargs)
        key = sig.key()
        traced = self._cache.get(key)
        if traced is None:
            traced = self._cache[key] = _Traced(self, sig)
        traced.sig = sig  # this call's objects and slots, if jit traces again
        try:
            out_leaves, new_state = traced.call(sig.state, sig.arrays, sig.masks)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError) as e:
            raise _control_flow_error(self.__name__, e) from e
        except (flax_errors.TraceContextError, ValueError, TypeError) as error:
            clear = lifting.translated(f"phalanx.function {self.__name__}", error)
            if clear is None:
                raise
            raise clear from error
        if sig.nodes:
            nnx.update(sig.nodes, new_state)
        if traced.ignoring_mask:
            padding.warn_for(traced.ignoring_mask, [m for m in sig.masks if m is not None])
        for leaf, mirrored in zip(out_leaves, traced.mirrored, strict=True):
            if mirrored:
                MIRRORED.register(leaf)
        return jax.tree.unflatten(traced.out_treedef, out_leaves)

    def __repr__(self) -> str:
        return f"phalanx.function({self.__name__})"


def _control_flow_error(name: str, error: Exception) -> TypeError:
    first = str(error).splitlines()[0]
    return TypeError(
        f"phalanx.function {name}: the function branches or converts on a value computed "
        f"inside it ({first}). tf.function's AutoGraph rewrites `if` / `while` on tensors; "
        "JAX compiles Python as written, so use jnp.where, jax.lax.cond or jax.lax.while_loop "
        "for data-dependent control flow, and read values (float(x), x.item()) outside the "
        "phalanx.function"
    )


def function(
    func: Callable | None = None,
    *,
    input_signature: Any = None,
    jit_compile: bool | None = None,
    reduce_retracing: bool = False,
    autograph: bool = True,
) -> Any:
    """Compiles `func` once per input signature, as `tf.function` does; a decorator.

    The Flax NNX objects `func` uses (a model, an `nnx.Optimizer`, metrics), and Keras 3
    models, optimizers and metrics on the JAX backend, whether passed in or read from the
    enclosing scope by `func` or the functions it calls (such as the step it hands to
    `strategy.run`), travel through the compiled call and are updated in place when it
    returns. So a TF custom loop ports by renaming `@tf.function`:

    * a function whose arguments include a dataset or an iterator runs its Python as written
      (a `for` loop over a distributed dataset inside it), each `strategy.run` compiled;
    * Python control flow on computed values is an error naming `jax.lax.cond` /
      `jnp.where` (TF's AutoGraph rewrites it; JAX does not);
    * outputs are arrays or `PerReplica` values; mirrored results of `strategy.run` stay
      mirrored for `strategy.reduce` outside.

    Args:
      func: the function; `@phalanx.function` and `@phalanx.function()` both work.
      input_signature: accepted for TF's signature and not needed: the function compiles
        once per shape and dtype it sees (a dimension left None in TF compiles per size).
      jit_compile: None or True (phalanx always compiles with XLA).
      reduce_retracing: accepted for TF's signature; a new shape compiles anew.
      autograph: accepted for TF's signature; see control flow above.

    Returns:
      A callable `Function` with `python_function`, the undecorated `func`.

    Raises:
      TypeError: `jit_compile=False` is given; the function reaches an object phalanx
        cannot carry (a TensorFlow object, a Keras object on another backend).

    Example:
      >>> @phalanx.function
      ... def distributed_train_step(dataset_inputs):
      ...     per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
      ...     return strategy.reduce("sum", per_replica_losses, axis=None)
      >>> for x in train_dist_dataset:
      ...     loss = distributed_train_step(x)
    """
    # TF's knobs with nothing to choose in JAX: the function compiles once per shape and
    # dtype it is called with, so a signature (e.g. a distributed dataset's element_spec)
    # changes no number; it is accepted so TF code runs unchanged.
    del input_signature, reduce_retracing, autograph
    if jit_compile is False:
        raise TypeError(
            "phalanx.function(jit_compile=False): phalanx always compiles with XLA; to run "
            "the Python eagerly, call the undecorated function (or fn.python_function)"
        )

    def wrap(fn: Callable) -> Function:
        return Function(fn, jit_compile=jit_compile)

    return wrap if func is None else wrap(func)
