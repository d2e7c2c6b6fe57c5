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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

try:  # the current trace: no public accessor in jax 0.10
    from jax._src import core as jax_core
    from jax._src.interpreters import ad as jax_ad

    _DIFFERENTIATING = (jax_ad.JVPTrace, jax_ad.LinearizeTrace)
    jax_core.unsafe_get_trace_stack  # noqa: B018 (probed: used at every read)
    jax_core.trace_ctx  # noqa: B018
except (ImportError, AttributeError):  # a JAX whose internals moved: reads become errors
    jax_core = None
    _DIFFERENTIATING = ()
_STATE = threading.local()  # the phalanx scope in force, to tell its reads from Keras's own


class _Record:
    """The losses of one model's last `stateless_call` and the trace they were made in."""

    __slots__ = ("losses", "trace")

    def __init__(self, losses: list, trace: Any) -> None:
        self.losses = losses
        self.trace = trace


def _trace_stack() -> list[Any]:
    return jax_core.unsafe_get_trace_stack(jax_core.trace_ctx.trace)


def _differentiating(stack: list[Any]) -> bool:
    return any(isinstance(trace, _DIFFERENTIATING) for trace in stack)


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

    def __init__(self, keras_model: Any, label: str, what: str) -> None:
        self.layer = keras_model
        self.label = label
        self.what = what
        self.record: _Record | None = None
        self.original_call = keras_model.stateless_call
        self.original_regularization = keras_model._get_regularization_losses

    def stateless_call(self, *args: Any, return_losses: bool = False, **kwargs: Any) -> Any:
        if jax_core is None:
            return self.original_call(*args, return_losses=return_losses, **kwargs)
        outputs, non_trainable, losses = self.original_call(*args, return_losses=True, **kwargs)
        self.record = _Record(list(losses), jax_core.trace_ctx.trace)
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
            if at is not None and not _differentiating(stack[at + 1 :]):
                return list(record.losses)
        weights = _weight_regularized(self.layer)
        made = record is not None and len(record.losses) > 0
        if _differentiating(stack):
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
    patched: list[Any] = []
    previous = getattr(_STATE, "scope", None)
    _STATE.scope = scope
    try:
        for model, label in models:
            if "stateless_call" in vars(model):
                continue  # a nested trace already patched it
            losses = _Losses(model, label, what)
            object.__setattr__(model, "stateless_call", losses.stateless_call)
            object.__setattr__(model, "_get_regularization_losses", losses.regularization)
            patched.append(model)
        yield
    finally:
        _STATE.scope = previous
        for model in patched:
            object.__delattr__(model, "stateless_call")
            object.__delattr__(model, "_get_regularization_losses")
