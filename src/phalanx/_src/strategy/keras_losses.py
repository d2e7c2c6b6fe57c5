"""`model.losses` inside a step, as TF's tape means it: the terms of the values being
differentiated, with their gradient.

TF's custom loops add `model.losses` (weight regularizers, activity regularizers,
`add_loss` terms) to the loss inside the `tf.GradientTape`, so the regularizers' gradient
is part of the update. Keras 3 on JAX has no tape: a step differentiates a function of the
weights' values, written with `model.stateless_call(trainable, non_trainable, x)`. A
`model.losses` read in that function would, left alone, compute the regularizers on the
variables' current values, which are constants of the differentiated function: the loss
would be right and its gradient silently short of the regularizers' share.

While a step is traced (`KerasState.scope`), phalanx therefore

  * makes each Keras model's `stateless_call` compute its losses (Keras's own
    `return_losses=True`) and remember them with the trace they were computed in, and
  * answers a `model.losses` read in the step (outside any `stateless_call`) with the
    losses of the model's last `stateless_call` when that call belongs to the function
    being differentiated at the read (the same trace, or one it encloses): they carry the
    gradient, as TF's tape would give it.

Where it cannot know which values are meant, the read is an error naming
`stateless_call(..., return_losses=True)`, never a value without its gradient: a read
inside a differentiated function that made no `stateless_call` of the model (for a model
with losses), or a read outside one of activity or `add_loss` terms computed by a call
whose trace has ended. Outside any differentiation, weight regularizers are computed on the
variables' current values, as TF computes them.

Whether a trace differentiates is read from JAX's trace classes, which JAX does not make
public: the differentiating ones (JVP, linearize) and the ones known not to (evaluation,
jit, vmap, shard_map, remat, partial evaluation). The check fails closed: a trace of any
other class (a JAX release that adds or renames one) counts as one that may differentiate,
so a read that would need to know is the error above, never a value without its gradient.

The patch is on the shared model object, so it is counted: threads that step the same
model at once share one patch, which the last of them to finish removes, and each thread
keeps the losses of its own last `stateless_call`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

try:  # the current trace: no public accessor in jax 0.10
    from jax._src import core as jax_core
    from jax._src.interpreters import ad as jax_ad

    _DIFFERENTIATING: tuple[type, ...] = (jax_ad.JVPTrace, jax_ad.LinearizeTrace)
    jax_core.unsafe_get_trace_stack  # noqa: B018 (probed: used at every read)
    jax_core.trace_ctx  # noqa: B018
except (ImportError, AttributeError):  # a JAX whose internals moved: reads become errors
    jax_core = None
    _DIFFERENTIATING = ()


def _known_not_differentiating() -> tuple[type, ...]:
    """The trace classes known not to differentiate that this JAX has (any it lacks is
    left out: a trace that is not listed counts as one that may differentiate)."""
    from importlib import import_module

    places = (
        ("jax._src.core", "EvalTrace"),
        ("jax._src.interpreters.partial_eval", "DynamicJaxprTrace"),
        ("jax._src.interpreters.partial_eval", "JaxprTrace"),
        ("jax._src.interpreters.batching", "BatchTrace"),
        ("jax._src.interpreters.remat", "RematTrace"),
        ("jax._src.shard_map", "ShardMapTrace"),
    )
    found = []
    for module, name in places:
        try:
            found.append(getattr(import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


_NOT_DIFFERENTIATING = _known_not_differentiating() if jax_core is not None else ()
_STATE = threading.local()  # the phalanx scope in force, to tell its reads from Keras's own
_PATCHES: dict[int, list] = {}  # id(model) -> [model, its _Losses, steps using it]
_PATCHES_LOCK = threading.Lock()


class _Record:
    """The losses of one model's last `stateless_call` and the trace they were made in."""

    __slots__ = ("losses", "trace")

    def __init__(self, losses: list, trace: Any) -> None:
        self.losses = losses
        self.trace = trace


def _trace_stack() -> list[Any]:
    return jax_core.unsafe_get_trace_stack(jax_core.trace_ctx.trace)


def _differentiating(stack: list[Any]) -> bool | None:
    """Whether a trace of `stack` differentiates: True, False, or None when one is of a
    class phalanx does not know (it may)."""
    if any(isinstance(trace, _DIFFERENTIATING) for trace in stack):
        return True
    if all(isinstance(trace, _NOT_DIFFERENTIATING) for trace in stack):
        return False
    return None


def _unknown(stack: list[Any]) -> str:
    names = {type(t).__name__ for t in stack if not isinstance(t, _NOT_DIFFERENTIATING)}
    return ", ".join(sorted(names))


def _fix(label: str) -> str:
    return (
        f"Compute them where the gradient is taken: `outputs, non_trainable, losses = "
        f"{label}.stateless_call(trainable, non_trainable, x, training=True, "
        "return_losses=True)` inside the function you differentiate, then add "
        "`phalanx.scale_regularization_loss(sum(losses))` to the loss (or read "
        f"`{label}.losses` there, after that stateless_call)"
    )


def _weight_regularized(model: Any) -> int:
    return sum(1 for v in model.trainable_weights if getattr(v, "regularizer", None) is not None)


def _activity_regularized(keras_model: Any) -> bool:
    layers = keras_model._flatten_layers()
    return any(getattr(layer, "activity_regularizer", None) for layer in layers)


class _Losses:
    """The patched `stateless_call` and `_get_regularization_losses` of one Keras model.

    With the phalanx scope collecting no losses, Keras's `losses` property reads as
    `[] + [] + keras_model._get_regularization_losses()` inside it, so that one method answers
    the whole read.
    """

    def __init__(self, keras_model: Any) -> None:
        self.layer = keras_model
        self.local = threading.local()  # per thread: its label, what, and last _Record
        self.original_call = keras_model.stateless_call
        self.original_regularization = keras_model._get_regularization_losses

    @property
    def label(self) -> str:
        return getattr(self.local, "label", "model")

    @property
    def what(self) -> str:
        return getattr(self.local, "what", "the step")

    @property
    def record(self) -> _Record | None:
        return getattr(self.local, "record", None)

    def stateless_call(self, *args: Any, return_losses: bool = False, **kwargs: Any) -> Any:
        if jax_core is None:
            return self.original_call(*args, return_losses=return_losses, **kwargs)
        outputs, non_trainable, losses = self.original_call(*args, return_losses=True, **kwargs)
        self.local.record = _Record(list(losses), jax_core.trace_ctx.trace)
        return (outputs, non_trainable, losses) if return_losses else (outputs, non_trainable)

    def regularization(self) -> list:
        if getattr(_STATE, "scope", None) is not _current_keras_scope():
            return self.original_regularization()  # Keras's own read (inside stateless_call)
        if jax_core is None:
            raise ValueError(
                f"{self.what}: the step reads `{self.label}.losses`, and this JAX version "
                "hides the trace phalanx needs to tell which weights' losses are meant, so "
                f"it cannot give them their gradient. {_fix(self.label)}"
            )
        stack = _trace_stack()
        record = self.record
        if record is not None:
            at = next((i for i, trace in enumerate(stack) if trace is record.trace), None)
            # Made in this function, or in one enclosing it with no gradient taken between.
            if at is not None and _differentiating(stack[at + 1 :]) is False:
                return list(record.losses)
        weights = _weight_regularized(self.layer)
        made = record is not None and len(record.losses) > 0
        differentiating = _differentiating(stack)
        if differentiating is None and (weights or made or _activity_regularized(self.layer)):
            raise ValueError(
                f"{self.what}: the step reads `{self.label}.losses` inside a JAX trace "
                f"phalanx does not know ({_unknown(stack)}), so it cannot tell whether that "
                "trace differentiates; computed on the variables' current values the losses "
                "would carry no gradient, and the update could silently leave the "
                f"regularizers out. {_fix(self.label)}"
            )
        if differentiating is not False:
            if weights or made or _activity_regularized(self.layer):
                raise ValueError(
                    f"{self.what}: the step reads `{self.label}.losses` inside a function "
                    "that JAX differentiates, but that function made no "
                    f"`{self.label}.stateless_call`, so phalanx cannot tell which weights' "
                    "losses are meant; computed on the variables' current values they would "
                    "carry no gradient, and the update would silently leave the "
                    f"regularizers out. {_fix(self.label)}"
                )
            return []
        if record is not None and len(record.losses) > weights:
            raise ValueError(
                f"{self.what}: the step reads `{self.label}.losses` outside the function "
                f"where its last `{self.label}.stateless_call` computed them; its activity "
                "regularizer and add_loss terms belong to that function and cannot be read "
                f"here. Return them from it (e.g. as auxiliary output). {_fix(self.label)}"
            )
        return self.original_regularization()


def _current_keras_scope() -> Any:
    from keras.src.backend.common import stateless_scope

    return stateless_scope.get_stateless_scope()


@contextlib.contextmanager
def carried(models: list[tuple[Any, str]], what: str, scope: Any) -> Iterator[None]:
    """Gives each Keras model of `models` (model, label) TF's `model.losses` while the
    step runs in the phalanx `scope` (a `keras.StatelessScope`); see the module doc.

    Example:
      >>> with carried([(model, "model")], "strategy.run", scope):
      ...     step(batch)
    """
    entered: list[tuple[Any, tuple]] = []
    previous = getattr(_STATE, "scope", None)
    _STATE.scope = scope
    try:
        for model, label in models:
            losses = _enter(model)
            if losses is None:
                continue  # the instance's own stateless_call, not phalanx's: left alone
            local = losses.local
            entered.append((model, (local.__dict__.get("label"), local.__dict__.get("what"))))
            if "label" not in local.__dict__:  # an enclosing trace's names stay
                local.label, local.what = label, what
        yield
    finally:
        _STATE.scope = previous
        for model, (label, what) in reversed(entered):
            _leave(model, label, what)


def _enter(model: Any) -> _Losses | None:
    """The patch on `model`, made by the first step to use it (None: the instance has a
    `stateless_call` of its own)."""
    with _PATCHES_LOCK:
        entry = _PATCHES.get(id(model))
        if entry is None:
            if "stateless_call" in vars(model):
                return None
            losses = _Losses(model)
            object.__setattr__(model, "stateless_call", losses.stateless_call)
            object.__setattr__(model, "_get_regularization_losses", losses.regularization)
            entry = _PATCHES[id(model)] = [model, losses, 0]
        entry[2] += 1
        return entry[1]


def _leave(model: Any, label: str | None, what: str | None) -> None:
    """Ends one step's use of the patch (restoring this thread's names, and its record
    when the thread is done with the model); the last one removes it."""
    with _PATCHES_LOCK:
        entry = _PATCHES[id(model)]
        local = entry[1].local
        if label is None:
            local.__dict__.clear()
        else:
            local.label, local.what = label, what
        entry[2] -= 1
        if entry[2] == 0:
            del _PATCHES[id(model)]
            object.__delattr__(model, "stateless_call")
            object.__delattr__(model, "_get_regularization_losses")
