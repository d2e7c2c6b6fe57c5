"""Keras 3 models, optimizers and metrics a step reaches, carried like NNX objects.

A TF custom loop's step reads a Keras model, optimizer and metrics from its closure and
changes them (`optimizer.apply_gradients(...)`, `train_accuracy.update_state(...)`). On
the JAX backend, Keras keeps each variable's value in the Python object, out of reach of a
compiled call, and offers `keras.StatelessScope` to run Keras code on given values and
collect what it assigns. phalanx uses that scope:

  * `collect` gathers the Keras variables of the objects found (`lifting.find_state`) into
    a `KerasState`, whose `carrier` (an `nnx.Module` of one `nnx.Variable` per Keras
    variable) travels through the compiled call with the NNX objects;
  * while the step is traced, `KerasState.scope` runs it in a `keras.StatelessScope` that
    maps each Keras variable to its traced value, then puts the values the step assigned
    into the carrier's traced copy;
  * the compiled call's new values return into the carrier (`nnx.update`), whose variables
    assign them to the Keras variables: the Keras objects hold the trained state.

Inside `strategy.run` each Keras variable is combined over replicas as its `aggregation`
says, as tf.distribute does: metric counters (`"sum"`) add every replica's increments,
weights and optimizer slots take replica 0's value (`"only_first_replica"`), and layers'
other float non-trainable variables (BatchNorm's moving statistics) take the mean. A Keras
optimizer's `apply` (so `apply_gradients` and `stateless_apply`) sums gradients that still
vary over replicas, as TF's `apply_gradients` does (gradients.py), never twice; a Keras
metric's `update_state` leaves out the padded rows of a partial batch. A seed generator's
state is one variable like the others, so Keras's random layers (Dropout) draw the same
numbers on every replica, and its state advances once per step.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from collections.abc import Iterator
from typing import Any

import jax
from flax import nnx

from phalanx._src.strategy import aggregation, gradients, keras_losses, replica_context


class KerasValue(nnx.Variable):
    """The value of one Keras variable, carried through a compiled call; the carrier's own
    copy assigns what `nnx.update` gives it to the Keras variable (its `target`)."""

    __slots__ = ("target",)

    def update_from_state(self, variable_state: nnx.Variable) -> None:
        super().update_from_state(variable_state)
        _assign(getattr(self, "target", None), self.get_raw_value())

    def set_raw_value(self, value: Any, *, _unsafe_bypass_check: bool = False) -> None:
        super().set_raw_value(value, _unsafe_bypass_check=_unsafe_bypass_check)
        _assign(getattr(self, "target", None), value)


class KerasMeanValue(KerasValue):
    """A Keras variable whose replicas' values are averaged (BatchNorm moving statistics)."""


class KerasSumValue(KerasValue):
    """A Keras variable whose replicas' increments are added (metric counters)."""


aggregation.register_variable_aggregation(KerasMeanValue, "mean")
aggregation.register_variable_aggregation(KerasSumValue, "sum")
_ACTIVE = threading.local()  # how many phalanx Keras scopes are open (a trace in progress)


def _assign(target: Any, value: Any) -> None:
    if target is None:
        return
    if isinstance(value, jax.core.Tracer) and not getattr(_ACTIVE, "depth", 0):
        raise ValueError(
            "strategy.run (or a phalanx.function) was called inside jax.jit (or another JAX "
            f"transform) with a step that changes the Keras variable {target.path!r}, whose "
            "new value cannot leave that trace. Decorate the outer function with "
            "@phalanx.function instead of @jax.jit (as @tf.function is written): it carries "
            "the variables through the compiled call"
        )
    target.assign(value)


class KerasCarrier(nnx.Module):
    """The values of a step's Keras variables, as NNX variables, in `KerasState` order."""

    def __init__(self, variables: list[KerasValue]) -> None:
        self.values = nnx.List(variables)


def _keras() -> Any:
    return sys.modules.get("keras")


def _kinds(keras: Any) -> tuple[type, ...]:
    return (
        keras.Layer,
        keras.optimizers.Optimizer,
        keras.metrics.Metric,
        keras.Variable,
        keras.random.SeedGenerator,
    )


def is_keras_state(value: Any) -> bool:
    """True for a Keras 3 layer, model, optimizer, metric, variable or seed generator."""
    keras = _keras()  # a Keras object implies keras is imported: never import it here
    return keras is not None and isinstance(value, _kinds(keras))


def unsupported_backend() -> str | None:
    """Why Keras objects cannot be carried under the Keras backend in use, or None."""
    keras = _keras()
    if keras.backend.backend() != "jax":
        return (
            f"a Keras 3 object on the {keras.backend.backend()!r} backend; phalanx carries "
            "Keras state through a compiled step on the JAX backend only. Set "
            "KERAS_BACKEND=jax before keras is first imported"
        )
    return None


def _variable_type(keras: Any, obj: Any, variable: Any) -> type[KerasValue]:
    if variable.aggregation == "sum":
        return KerasSumValue
    if variable.aggregation == "mean":
        return KerasMeanValue
    if (
        variable.aggregation == "none"
        and isinstance(obj, keras.Layer)
        and not variable.trainable
        and keras.backend.is_float_dtype(variable.dtype)
    ):
        return KerasMeanValue  # tf.keras's ON_READ / MEAN rule for BatchNorm statistics
    return KerasValue


def _variables_of(keras: Any, obj: Any) -> list[Any]:
    if isinstance(obj, keras.Variable):
        return [obj]
    if isinstance(obj, keras.random.SeedGenerator):
        return [obj.state]
    return list(obj.variables)


class KerasState:
    """The Keras objects a step reaches, their variables, and the carrier of their values.

    Example:
      >>> state = KerasState([model, optimizer], ["model", "optimizer"], "strategy.run")
      >>> graphdef, values = nnx.split(state.carrier)  # one value per Keras variable
    """

    def __init__(self, objects: list[Any], labels: list[str], what: str) -> None:
        keras = _keras()
        self.what = what
        self.label = "Keras state of " + ", ".join(labels)
        _check_built(keras, objects, labels, what)
        self.optimizers = [o for o in objects if isinstance(o, keras.optimizers.Optimizer)]
        self.metrics = [o for o in objects if isinstance(o, keras.metrics.Metric)]
        self.layers = [
            (o, label)
            for o, label in zip(objects, labels, strict=True)
            if isinstance(o, keras.Layer)
        ]
        self.variables: list[Any] = []
        carried: list[KerasValue] = []
        seen: set[int] = set()
        for obj in objects:
            for variable in _variables_of(keras, obj):
                if id(variable) in seen:
                    continue
                seen.add(id(variable))
                self.variables.append(variable)
                carried.append(_variable_type(keras, obj, variable)(variable.value))
        self.carrier = KerasCarrier(carried)
        for variable, value in zip(self.variables, carried, strict=True):
            object.__setattr__(value, "target", variable)

    @contextlib.contextmanager
    def scope(self, copy: KerasCarrier) -> Iterator[None]:
        """Runs the step on the traced values of `copy` (the carrier inside the trace) and
        puts the values the step assigned back into `copy`."""
        values = list(copy.values)
        mapping = [(var, v.get_value()) for var, v in zip(self.variables, values, strict=True)]
        with (
            _scope_class()(mapping, self.what) as scope,
            _summing(self.optimizers),
            _masking(self.metrics),
            keras_losses.carried(self.layers, self.what, scope),
        ):
            yield
        for variable, value in zip(self.variables, values, strict=True):
            value.set_value(scope.get_current_value(variable))


def collect(found: list[tuple[Any, str]], what: str) -> KerasState:
    """The `KerasState` of the Keras objects `found` (object, label) pairs name.

    Builds an optimizer that is not built yet from the trainable variables of the Keras
    model found beside it, as its first `apply_gradients` would.

    Raises:
      ValueError: a model is not built, or an optimizer is not built and not exactly one
        model was found to build it from.

    Example:
      >>> state = collect([(model, "model"), (optimizer, "optimizer")], "strategy.run")
      >>> len(state.variables) == len(model.variables) + len(optimizer.variables)
      True
    """
    return KerasState([obj for obj, _ in found], [label for _, label in found], what)


def _check_built(keras: Any, objects: list[Any], labels: list[str], what: str) -> None:
    for obj, label in zip(objects, labels, strict=True):
        if isinstance(obj, keras.Layer) and not obj.built:
            raise ValueError(
                f"{what}: the step reaches the Keras layer `{label}` ({type(obj).__name__}), "
                "which is not built, so its variables do not exist yet and cannot be carried "
                "through the compiled step. Build it first: give the model a keras.Input, "
                "call model.build(input_shape), or call it once on a batch outside the step"
            )
    # The models found, less the layers found inside one of them.
    owned = {
        id(obj): ({id(v) for v in obj.trainable_variables}, obj, label)
        for obj, label in zip(objects, labels, strict=True)
        if isinstance(obj, keras.Layer) and obj.trainable_variables
    }
    models = [
        (obj, label)
        for key, (ids, obj, label) in owned.items()
        if not any(other != key and ids <= ids_other for other, (ids_other, _, _) in owned.items())
    ]
    for obj, label in zip(objects, labels, strict=True):
        if not isinstance(obj, keras.optimizers.Optimizer) or obj.built:
            continue
        if len(models) != 1:
            found = ", ".join(f"`{name}`" for _, name in models) or "none"
            raise ValueError(
                f"{what}: the step reaches the Keras optimizer `{label}`, which is not built, "
                f"and phalanx cannot tell which model's variables to build it from (Keras "
                f"models with trainable variables found: {found}). Build it before the step: "
                f"{label}.build(model.trainable_variables)"
            )
        obj.build(models[0][0].trainable_variables)


@functools.cache
def _scope_class() -> type:
    """A `keras.StatelessScope` that refuses to read a Keras variable it does not map."""
    import keras

    class Scope(keras.StatelessScope):
        def __init__(self, mapping: list, what: str) -> None:
            super().__init__(state_mapping=mapping)
            self.what = what

        def __enter__(self) -> Scope:
            _ACTIVE.depth = getattr(_ACTIVE, "depth", 0) + 1
            return super().__enter__()

        def __exit__(self, *exc: Any) -> None:
            _ACTIVE.depth -= 1
            super().__exit__(*exc)

        def get_current_value(self, variable: Any) -> Any:
            value = super().get_current_value(variable)
            if value is None:
                raise ValueError(
                    f"{self.what}: the step reads the Keras variable {variable.path!r}, which "
                    "belongs to no Keras model, optimizer or metric phalanx found among the "
                    "objects the step names (its globals, closure variables and the "
                    "attributes of your own objects, two levels deep). Its value would be "
                    "compiled in as a constant and its changes lost. Name the object that "
                    "holds it from the step directly, or build it outside the step"
                )
            return value

    return Scope


@contextlib.contextmanager
def _patched(objects: list[Any], name: str, wrap: Any) -> Iterator[None]:
    """Replaces method `name` of each object by `wrap(method)` (on the instance) while the
    step traces; an object already patched (a nested trace) is left alone."""
    wrapped = []
    for obj in objects:
        if name in vars(obj):
            continue
        object.__setattr__(obj, name, wrap(getattr(obj, name)))
        wrapped.append(obj)
    try:
        yield
    finally:
        for obj in wrapped:
            object.__delattr__(obj, name)


def _summing(optimizers: list[Any]) -> Any:
    """Makes each Keras optimizer's `apply` (behind `apply_gradients` and `stateless_apply`)
    sum the gradients that still vary over replicas inside `strategy.run`, as TF's
    `apply_gradients` does."""
    return _patched(optimizers, "apply", _summing_apply)


def _masking(metrics: list[Any]) -> Any:
    """Makes each Keras metric's `update_state` (and so its `__call__`) leave out the padded
    rows of a partial last batch inside `strategy.run`, as phalanx's metrics do, by
    weighting each row with the batch's validity mask."""
    return _patched(metrics, "update_state", _masked_update)


def _masked_update(update_state: Any) -> Any:
    signature = inspect.signature(update_state)

    def masked(*args: Any, **kwargs: Any) -> Any:
        rows = jax.numpy.shape(args[0])[:1] if args else ()
        mask = replica_context.current_example_mask(rows[0]) if rows else None
        if mask is None or "sample_weight" not in signature.parameters:
            return update_state(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        weight = bound.arguments.get("sample_weight")
        if weight is None:
            bound.arguments["sample_weight"] = mask
        else:
            weight = jax.numpy.asarray(weight)
            bound.arguments["sample_weight"] = weight * mask.reshape(
                mask.shape + (1,) * (weight.ndim - 1)
            )
        return update_state(*bound.args, **bound.kwargs)

    return masked


def _summing_apply(apply: Any) -> Any:
    def summing(grads: Any, trainable_variables: Any = None) -> Any:
        if replica_context.in_replica_fn():
            axis = replica_context.get_replica_context().strategy.axis_name
            grads = gradients.sum_unreduced(list(grads), axis, "optimizer.apply_gradients")
        return apply(grads, trainable_variables)

    return summing
