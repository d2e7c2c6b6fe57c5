"""Keras 3 models (JAX backend) under the model protocol, through `stateless_call`.

- **State.** `params` is the list of `model.trainable_variables`' values; `state` the list of
  `model.non_trainable_variables`' values: BatchNormalization's moving statistics, every
  `keras.random.SeedGenerator`'s state (Dropout, GaussianNoise...), other non-trainable
  weights. Both are lists of arrays in Keras's order; `apply` is
  `model.stateless_call(params, state, x, training=...)`, which returns the updated state.
- **Batch statistics.** Under the data-parallel jit a BatchNormalization sees the global
  batch, so its statistics are those of the global batch whatever the replica count. In
  training mode every BatchNormalization (normalising the last axis) whose input is
  batch-major receives the step's validity mask (Keras's `mask=` argument), so the padded
  rows of a partial batch do not enter the mean and variance.
- **Randomness.** SeedGenerator states advance every training step and are part of every
  checkpoint; random bits do not depend on how the batch is sharded.
- **Precision.** Keras's own policies (`keras.mixed_precision.set_global_policy`, a layer's
  `dtype=`) are honoured as Keras honours them. phalanx's `precision='mixed_bfloat16'` (or
  'mixed_float16') is applied, while tracing, to every layer whose policy is 'float32':
  variables stay float32 and are cast for the computation (Keras's autocast), and
  BatchNormalization keeps float32 statistics.
- **Model parallelism.** `Model(keras_model, layout_map=...)`: each variable's `path` is
  looked up as `keras.distribution.LayoutMap` does (the equal key, else the one key that
  `re.fullmatch`es it). A matched variable travels as an `nnx.Variable` with
  `out_sharding=<axes>`, the annotation the strategy lays NNX parameters out by (optax's
  moments inherit it); the others stay arrays. Axes absent from the mesh mean replicated; a
  `LayoutMap`'s device mesh and keys matching no variable (layer outputs) are ignored.
- keras is imported only when a Keras model was already built, i.e. never by phalanx itself.

- **Losses the model adds.** `apply_with_losses` returns Keras's `model.losses` of the call
  (weight regularizers on the step's parameters, `add_loss`, activity regularizers), each
  summed to a float32 scalar as Keras's trainer does; the step adds them once per global
  batch, in training and in evaluation, as Keras's `compute_loss` does.
- **Extension points.** An overridden `compute_loss` is called as Keras's `fit` calls it
  (`keras_loss`). An overridden `train_step`, `test_step` or `predict_step` is refused when
  the model is wrapped: phalanx compiles its own steps, and running the user's (written
  against Keras's optimizer and metric variables) would silently skip it or give other
  numbers.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from phalanx._src.strategy import missing_keys
from phalanx._src.strategy.annotations import AxisRules
from phalanx._src.train.adapters import keras_loss
from phalanx._src.train.api import precision
from phalanx._src.train.api.keras_bridge import is_keras_object

if TYPE_CHECKING:
    from phalanx._src.strategy.strategy import Strategy

# The batch mask of the step being traced, read by the patched BatchNormalization.call.
_BATCH_MASK: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar(
    "phalanx_keras_batch_mask", default=None
)


def _keras() -> Any:
    import keras  # optional dependency: imported only for a Keras model

    return keras


def _check_jax_backend() -> None:
    backend = _keras().backend.backend()
    if backend != "jax":
        raise TypeError(
            f"phalanx trains Keras models on the JAX backend, but keras runs on {backend!r}; "
            "set KERAS_BACKEND=jax in the environment before keras is first imported"
        )


@contextlib.contextmanager
def _masked_batch_norm(keras_model: Any, mask: jax.Array | None) -> Iterator[None]:
    """While tracing: every BatchNormalization class in `keras_model` passes `mask` to its call.

    The class, not the layer, is patched (and restored on exit): Keras layers track their
    attributes, and the patched call reads the mask from a context variable, so a layer
    called anywhere else (another thread, Keras's own fit) behaves exactly as before."""
    if mask is None:
        yield
        return
    keras = _keras()
    classes = {
        type(layer)
        for layer in keras_model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.BatchNormalization)
    }
    originals = {cls: cls.__dict__.get("call") for cls in classes}
    for cls in classes:
        base_call = cls.call

        def call(self, inputs, training=None, mask=None, _base=base_call):
            batch_mask = _BATCH_MASK.get()
            if (
                mask is None
                and batch_mask is not None
                and self.axis in (-1, len(inputs.shape) - 1)
                and inputs.shape[:1] == batch_mask.shape
            ):
                mask = jnp.broadcast_to(
                    (batch_mask > 0).reshape((-1,) + (1,) * (len(inputs.shape) - 2)),
                    inputs.shape[:-1],
                )
            return _base(self, inputs, training=training, mask=mask)

        cls.call = call
    token = _BATCH_MASK.set(mask)
    try:
        yield
    finally:
        _BATCH_MASK.reset(token)
        for cls, original in originals.items():
            if original is None:
                del cls.call
            else:
                cls.call = original


@contextlib.contextmanager
def _masked_activity_regularizers(keras_model: Any, mask: jax.Array | None) -> Iterator[None]:
    """While tracing a padded batch: activity regularizers see the real rows only.

    Keras adds `regularizer(output) / batch_size` per layer call; on a padded batch that
    would count the padding rows, so each regularizer gets the output with its padded rows
    zeroed and its result is rescaled from the padded to the real row count. For Keras's
    L1 / L2 / L1L2 (a sum over elements, 0 at 0) that is Keras's value on the real rows."""
    if mask is None:
        yield
        return
    layers = [
        layer
        for layer in keras_model._flatten_layers(include_self=False)
        if getattr(layer, "activity_regularizer", None) is not None
    ]
    originals = [layer.activity_regularizer for layer in layers]
    count = jnp.maximum(jnp.sum(mask), 1.0)
    for layer, regularizer in zip(layers, originals, strict=True):

        def masked(output, _regularizer=regularizer):
            if output.ndim == 0 or output.shape[:1] != mask.shape:
                return _regularizer(output)
            rows = mask.reshape((-1,) + (1,) * (output.ndim - 1)) > 0
            kept = jnp.where(rows, output, jnp.zeros((), output.dtype))
            return _regularizer(kept) * (mask.shape[0] / count).astype(output.dtype)

        layer.activity_regularizer = masked
    try:
        yield
    finally:
        for layer, regularizer in zip(layers, originals, strict=True):
            layer.activity_regularizer = regularizer


@contextlib.contextmanager
def _compute_dtype(keras_model: Any, policy: Any) -> Iterator[None]:
    """While tracing: layers on Keras's 'float32' policy follow phalanx's mixed `policy`."""
    if policy is None or policy.compute_dtype == jnp.float32:
        yield
        return
    switched = [
        layer
        for layer in keras_model._flatten_layers(include_self=True)
        if getattr(layer.dtype_policy, "name", None) == "float32"
    ]
    for layer in switched:
        layer.dtype_policy = policy.name
    try:
        yield
    finally:
        for layer in switched:
            layer.dtype_policy = "float32"


class KerasAdapter:
    """A Keras 3 model (JAX backend) as pure functions of `(params, state)`; see the module
    docstring.

    Example:
      >>> adapter = KerasAdapter(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
      >>> adapter.set_policy(phalanx.mixed_precision.Policy("float32"))
      >>> params, state = adapter.variables()
      >>> y, state = adapter.apply(params, state, x, training=True, mask=jnp.ones(len(x)))
    """

    resolves_keras_names = True

    def __init__(self, model: Any) -> None:
        if not self.accepts(model):
            raise TypeError(f"KerasAdapter wraps a keras.Model, got {type(model).__name__}")
        _check_jax_backend()
        if not model.built:
            raise ValueError(
                f"the Keras model {model.name!r} has no variables yet; build it before "
                "phalanx.Model(...), e.g. start a Sequential with keras.Input(shape=...), or "
                "call model.build(input_shape) / model(x) on one batch"
            )
        _refuse_custom_steps(model)
        self.model = model
        self._policy: Any = None
        self._call_has_training = "training" in _call_arguments(model)
        self.overrides_loss = keras_loss.overridden(model, "compute_loss")
        self._layouts: dict[str, tuple] = {}  # variable path -> axes, from `layout_map`

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return is_keras_object(model, "Model")

    def set_policy(self, policy: Any) -> None:
        self._policy = policy

    def set_layout_map(self, layout_map: Any, strategy: Strategy) -> None:
        """Lays the variables out as `layout_map` (`{regex: axes}` or a Keras `LayoutMap`)
        says, on `strategy`'s mesh; see the module docstring.

        Raises:
          TypeError: `layout_map` is neither a dict nor a LayoutMap.
          ValueError: a malformed key or layout, or one that does not fit its variable
            (named by path): several keys match, more axes than it has, a size the mesh
            axes do not divide, a name neither a mesh axis nor mapped by `axis_rules`.

        Example:
          >>> adapter.set_layout_map({".*dense.*kernel": (None, "model")}, strategy)
        """
        layouts = _check_layout_map(layout_map)
        rules = AxisRules(strategy.axis_rules, dict(strategy.mesh.shape), strategy.axis_name)
        self._layouts = {}
        model = self.model
        for variable in [*model.trainable_variables, *model.non_trainable_variables]:
            key, axes = _lookup(layouts, variable.path)
            if axes is None:
                continue
            try:
                rules.spec(axes, tuple(variable.shape), f"Keras variable {variable.path!r}")
            except ValueError as error:
                raise ValueError(f"{error}; or change layout_map[{key!r}]") from None
            self._layouts[variable.path] = axes

    def _copy(self, variable: Any, kind: type) -> Any:
        # A copy: the compiled steps donate their state, and the Keras variable keeps its own.
        value = jnp.array(variable.value, copy=True)
        axes = self._layouts.get(variable.path)
        # Not sharded here (eager_sharding=False): the engine places the whole state.
        return value if axes is None else kind(value, out_sharding=axes, eager_sharding=False)

    def variables(self) -> tuple[Any, Any]:
        params = [self._copy(v, nnx.Param) for v in self.model.trainable_variables]
        state = [self._copy(v, nnx.Variable) for v in self.model.non_trainable_variables]
        return params, state

    def _policy_now(self) -> Any:
        # Before compile (a custom loop's step): the global policy, as Keras layers use theirs.
        return self._policy if self._policy is not None else precision.get(None)

    def apply(
        self, params: Any, state: Any, inputs: Any, *, training: bool, mask: jax.Array
    ) -> tuple[Any, Any]:
        outputs, new_state, _ = self.apply_with_losses(
            params, state, inputs, training=training, mask=mask
        )
        return outputs, new_state

    def apply_with_losses(
        self, params: Any, state: Any, inputs: Any, *, training: bool, mask: jax.Array
    ) -> tuple[Any, Any, list[jax.Array]]:
        policy = self._policy_now()
        kwargs = {"training": training} if self._call_has_training else {}
        inputs = policy.cast_to_compute(inputs)
        with (
            _compute_dtype(self.model, policy),
            _masked_batch_norm(self.model, mask if training else None),
            _masked_activity_regularizers(self.model, mask),
            missing_keys.naming_keys(inputs, f"the model ({type(self.model).__name__})"),
        ):
            outputs, new_state, losses = self.model.stateless_call(
                _arrays(params), _arrays(state), inputs, return_losses=True, **kwargs
            )
        # Keras's `_aggregate_additional_loss`: each term summed to a scalar.
        losses = [jnp.sum(jnp.asarray(loss, jnp.float32)) for loss in losses]
        if not training:  # inference leaves every variable as it was (protocol)
            return outputs, state, losses
        return outputs, _like(new_state, state), losses

    def set_extra_losses(self, fn: Any) -> None:
        if fn is not None:
            raise TypeError(
                "compile(extra_losses=...) is for Flax NNX modules; a Keras model carries its "
                "own losses: give its layers kernel_regularizer= / activity_regularizer=, call "
                "self.add_loss(...) in call(), or override compute_loss"
            )

    def compile_arguments(self, arguments: dict[str, Any], custom: dict[str, Any]) -> None:
        keras_loss.compile_model(self.model, arguments, custom)

    def current_losses(self, params: Any, state: Any) -> list[jax.Array]:
        self.assign(params, state)
        return [jnp.asarray(loss) for loss in self.model.losses]

    def model_loss(
        self,
        params: Any,
        state: Any,
        losses: list[jax.Array],
        batch: tuple[Any, Any, Any],
        y_pred: Any,
        mask: jax.Array | None,
        *,
        training: bool,
    ) -> tuple[jax.Array, Any]:
        with _compute_dtype(self.model, self._policy_now()):
            rows, new_state = keras_loss.per_example(
                self.model, _arrays(params), _arrays(state), losses, batch, y_pred, mask, training
            )
        return rows, _like(new_state, state)

    def assign(self, params: Any, state: Any) -> None:
        # Host copies: Keras's own jitted functions then place them as they need.
        for variable, value in zip(self.model.trainable_variables, _arrays(params), strict=True):
            variable.assign(np.asarray(jax.device_get(value)))
        pairs = zip(self.model.non_trainable_variables, _arrays(state), strict=True)
        for variable, value in pairs:
            variable.assign(np.asarray(jax.device_get(value)))

    def get_weights(self, params: Any, state: Any) -> list[np.ndarray]:
        self.assign(params, state)
        return [np.array(v.value) for v in self.model.weights]  # Keras's get_weights order

    def set_weights(self, weights: Sequence[Any]) -> tuple[Any, Any]:
        current = self.model.weights
        if len(weights) != len(current):
            raise ValueError(
                f"set_weights got {len(weights)} arrays but the Keras model has "
                f"{len(current)} weights; pass the list model.get_weights() returned"
            )
        for index, (variable, new) in enumerate(zip(current, weights, strict=True)):
            if tuple(variable.shape) != np.shape(new):
                raise ValueError(
                    f"set_weights: weight {index} ({variable.path}) has shape {np.shape(new)} "
                    f"where the model has {tuple(variable.shape)}; pass the list "
                    "model.get_weights() returned"
                )
        self.model.set_weights(weights)
        return self.variables()


def _arrays(values: Sequence[Any]) -> list:
    """A variable list's arrays: the laid-out entries taken out of their `nnx.Variable`."""
    return [v.get_value() if isinstance(v, nnx.Variable) else v for v in values]


def _like(values: Sequence[Any], template: Sequence[Any]) -> list:
    """`values` (arrays) wrapped as `template`'s entries are: the same Variable type and
    layout, so a step's state keeps its structure."""
    return jax.tree.unflatten(jax.tree.structure(list(template)), list(values))


def _axes(key: str, value: Any) -> tuple | None:
    """One `layout_map` value as axis names (None: replicated)."""
    if is_keras_object(value, "distribution.TensorLayout"):
        value = value.axes
    value = tuple(value) if isinstance(value, P | list) else value
    entries = (type(None), str, tuple)
    if value is None or (isinstance(value, tuple) and all(isinstance(e, entries) for e in value)):
        return value
    raise ValueError(
        f"layout_map[{key!r}] is {value!r}; a layout is a tuple with a mesh axis name or None "
        "per axis of the variable, e.g. (None, 'model') splits a Dense kernel's output units "
        "over the model axis; or a PartitionSpec, a keras.distribution.TensorLayout, or None"
    )


def _check_layout_map(layout_map: Any) -> dict[str, tuple | None]:
    """`layout_map` (a dict or a `keras.distribution.LayoutMap`) as `{regex: axes}`."""
    if not isinstance(layout_map, Mapping):
        raise TypeError(
            f"layout_map must be a dict {{regex: axes}} or a keras.distribution.LayoutMap, "
            f"got {type(layout_map).__name__}; e.g. layout_map={{'.*dense.*kernel': "
            "(None, 'model')}"
        )
    layouts = {}
    for key, value in layout_map.items():
        try:
            re.compile(key)
        except (re.error, TypeError) as error:
            raise ValueError(
                f"layout_map key {key!r} is not a regex over variable paths ({error}); e.g. "
                "'.*dense.*kernel' matches 'sequential/dense/kernel'"
            ) from None
        layouts[key] = _axes(key, value)
    return layouts


def _lookup(layouts: dict[str, tuple | None], path: str) -> tuple[str | None, tuple | None]:
    """`(key, axes)` for the variable at `path`, as `keras.distribution.LayoutMap` looks it
    up: the key equal to `path`, else the one key that `re.fullmatch`es it; `(None, None)`
    when none does."""
    if path in layouts:
        return path, layouts[path]
    keys = [key for key in layouts if re.fullmatch(key, path)]
    if len(keys) > 1:
        raise ValueError(
            f"Keras variable {path!r} matches several layout_map keys, {keys}; make each "
            "variable's path match at most one (keys are regexes matched against the whole "
            "path, as keras.distribution.LayoutMap matches them)"
        )
    return (keys[0], layouts[keys[0]]) if keys else (None, None)


_STEP_ADVICE = {
    "train_step": "move the loss into compute_loss(self, x, y, y_pred, sample_weight, "
    "training) and the metrics into compile(metrics=...), which phalanx runs under the "
    "strategy, or train with Keras's own model.fit",
    "test_step": "move the loss into compute_loss and the metrics into compile(metrics=...), "
    "or evaluate with Keras's own model.evaluate",
    "predict_step": "post-process the outputs of phalanx's predict (or put the computation "
    "in call()), or predict with Keras's own model.predict",
}


def _refuse_custom_steps(keras_model: Any) -> None:
    """TypeError for a model whose class overrides Keras's train/test/predict step."""
    for method, advice in _STEP_ADVICE.items():
        if keras_loss.overridden(keras_model, method):
            raise TypeError(
                f"{type(keras_model).__name__} overrides keras.Model.{method}, which phalanx "
                f"does not run (it compiles its own step, so yours would be skipped); "
                f"{advice}"
            )


def _call_arguments(model: Any) -> set[str]:
    try:
        return set(inspect.signature(model.call).parameters)
    except (TypeError, ValueError):
        return {"training"}
