"""`phalanx.Model`: Keras's compile / fit / evaluate / predict for a Flax NNX module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optax
from flax import nnx

from phalanx._src.cluster.watchdog import peer_failures
from phalanx._src.strategy.strategy import Strategy, get_strategy, has_strategy
from phalanx._src.train.adapters import adapt
from phalanx._src.train.api import keras_bridge, multi_output
from phalanx._src.train.api import optimizers as optimizers_lib
from phalanx._src.train.api import precision as precision_lib
from phalanx._src.train.api.keras_bridge.losses import ModelOwnLoss
from phalanx._src.train.api.metrics import registry as metrics_registry
from phalanx._src.train.api.metrics import weighting
from phalanx._src.train.api.metrics.mean import Mean
from phalanx._src.train.api.optimizer_view import OptimizerView
from phalanx._src.train.engine.accumulation import accumulate_gradients
from phalanx._src.train.engine.engine import Engine
from phalanx._src.train.engine.step import Steps
from phalanx._src.train.export.api import Exportable


def _check_steps(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}; e.g. {name}=1")
    return value


class Model(Exportable):
    """A model with Keras's training API, data-parallel over a strategy.

    The model is a Flax NNX module (BatchNorm, Dropout and any other stateful layer
    included) or, with the `keras` extra, a Keras 3 model on the JAX backend; each framework
    plugs in through a model adapter.

    Build it inside `strategy.scope()` (or pass `strategy=`) and it trains on every replica
    of that strategy; otherwise on the default one-device strategy. Its `compile`, `fit`,
    `evaluate` and `predict` run on that strategy, outside any scope or inside its own;
    inside another strategy's scope they raise a ValueError, as tf.distribute does. `fit`,
    `evaluate` and `predict` give the numbers one device would give on the same global
    batches, whatever the number of replicas, and see every example exactly once.

    Args:
      module: a Flax NNX module (or Keras 3 model) mapping a batch of inputs to predictions.
      strategy: the strategy to train on; default: `phalanx.get_strategy()` at construction.
      layout_map: a Keras model's layout under `Strategy(model_parallel=M)`: `{regex: axes}`
        or a `keras.distribution.LayoutMap`, matched on variable paths as Keras does, e.g.
        `{".*dense.*kernel": (None, "model")}`; unmatched variables, and all of them on a
        strategy without a `model` axis, are replicated. NNX modules annotate their own.

    Raises:
      TypeError: `layout_map` for a non-Keras model, or neither a dict nor a LayoutMap.
      ValueError: a layout that does not fit its variable (the message names its path).

    Example:
      >>> strategy = phalanx.Strategy()
      >>> with strategy.scope():
      ...     model = phalanx.Model(MLP(rngs=nnx.Rngs(0)))
      ...     model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
      ...                   metrics=["accuracy"])
      >>> history = model.fit(x_train, y_train, batch_size=128 * 8, epochs=5)
      >>> model.evaluate(x_test, y_test, return_dict=True)
      {'loss': 0.08, 'accuracy': 0.975}
    """

    def __init__(
        self, module: Any, *, strategy: Strategy | None = None, layout_map: Any = None
    ) -> None:
        self.adapter = adapt(module)
        self._chosen_strategy = strategy is not None or has_strategy()  # else the default
        self.strategy = strategy if strategy is not None else get_strategy()
        if layout_map is not None:
            set_layout_map = getattr(self.adapter, "set_layout_map", None)
            if set_layout_map is None:
                raise TypeError(
                    f"layout_map is for Keras models; a {type(module).__name__} carries its "
                    "layout on its parameters (nnx.with_partitioning(init, (None, 'model'))). "
                    "Drop layout_map="
                )
            set_layout_map(layout_map, self.strategy)
        # The training state, compiled calls and fit's position; see `engine.Engine`.
        self.engine = Engine(self.strategy, self.adapter)
        self.history: Any = None
        self.compiled = False

    @property
    def stop_training(self) -> bool:
        """Set by a callback to stop `fit` after the current step, as in Keras."""
        return self.engine.stop_training

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self.engine.stop_training = value

    @property
    def train_step_count(self) -> int:
        """Batches trained on by `fit`, over all calls."""
        return self.engine.train_step_count

    @train_step_count.setter
    def train_step_count(self, value: int) -> None:
        self.engine.train_step_count = value

    def compile(
        self,
        optimizer: str | optax.GradientTransformation = "rmsprop",
        loss: str | Callable | None = None,
        metrics: Sequence[Any] | None = None,
        *,
        steps_per_execution: int | str = 1,
        gradient_accumulation_steps: int = 1,
        precision: str | precision_lib.Policy | None = None,
        loss_weights: Any = None,
        output_names: Sequence[str] | None = None,
        weighted_metrics: Sequence[Any] | None = None,
        extra_losses: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Configures training, as `keras.Model.compile`.

        Args:
          optimizer: an optax transformation or a Keras name ('adam', 'sgd', 'adamw',
            'rmsprop') with Keras's defaults (see `phalanx.optimizers.get` for clipping and
            learning rates).
          loss: a Keras loss name, a `phalanx.losses` object, or `fn(y_true, y_pred)`
            returning per-example losses; for a model with several outputs, a dict
            `{output: loss}` or a list with one loss per output.
          metrics: Keras metric names ('accuracy', ...) or `phalanx.metrics` objects; per
            output, a dict `{output: [metrics]}` or a list with one entry per output
            (logged as `{output}_{metric}`).
          steps_per_execution: K steps per call (one `lax.scan`); batch callbacks then fire
            every K steps. 'auto': K <= 50, scan or single calls, whichever times faster.
          gradient_accumulation_steps: k batches per optimizer update; the update equals one
            step on the k batches together.
          precision: 'float32', 'mixed_bfloat16' or 'mixed_float16' (dynamic loss scaling);
            default: `phalanx.mixed_precision.global_policy()`.
          loss_weights: per-output loss weights (a dict or list matching `loss`), or a
            float for a single loss; the total loss is the weighted sum.
          output_names: names for a tuple / list output (default `output_1`, ...).
          weighted_metrics: metrics weighed by `sample_weight` / `class_weight`, as in
            Keras 3 (the `metrics` count every example once); see
            `api.metrics.weighting`.
          extra_losses: for an NNX module, `fn(module) -> scalar or list of scalars` added
            to the loss once per global batch, like Keras's regularizers (e.g.
            `lambda m: 1e-4 * jnp.sum(m.linear.kernel[...] ** 2)`); a Keras model's own
            regularizers and `add_loss` terms are added without it.
          **kwargs: a subclassed Keras model's own `compile` arguments (e.g. the
            knowledge-distillation `Distiller`'s `student_loss_fn=`, `alpha=`), handed to
            its `compile` so its `compute_loss` reads them.

        Raises:
          ValueError: for an unknown name or a non-positive step count, or when called
            inside the scope of another strategy than the model's (see `fit`).
          TypeError: unknown keyword arguments, or `extra_losses` for a Keras model.
        """
        self._check_strategy("compile")
        if loss is None and not self.adapter.overrides_loss:
            raise ValueError(
                "compile() needs a loss, e.g. loss='sparse_categorical_crossentropy' or a "
                "function (y_true, y_pred) -> per-example loss"
            )
        if steps_per_execution != "auto":
            _check_steps(steps_per_execution, "steps_per_execution")
        accumulation = _check_steps(gradient_accumulation_steps, "gradient_accumulation_steps")
        self.policy = precision_lib.get(precision)
        self.adapter.compile_arguments(
            {
                "optimizer": optimizer,
                "loss": loss,
                "metrics": metrics,
                "weighted_metrics": weighted_metrics,
                "loss_weights": loss_weights,
            },
            kwargs,
        )
        self.adapter.set_extra_losses(extra_losses)
        with keras_bridge.keras_names(self.adapter.resolves_keras_names):
            self.loss, metric_objects = multi_output.resolve(
                loss if loss is not None else ModelOwnLoss(),
                metrics,
                loss_weights,
                output_names,
                metrics_registry.get,
            )
            taken = ["loss", *(m.name for m in metric_objects)]
            weighted = weighting.resolve(weighted_metrics, self.loss, taken, metrics_registry.get)
            inner = optimizers_lib.get(optimizer)
        tx = self.policy.wrap_optimizer(accumulate_gradients(inner, accumulation))
        self.optimizer = tx
        self.steps_per_execution = steps_per_execution
        self.gradient_accumulation_steps = accumulation
        self.loss_tracker = Mean(name="loss")
        self.metrics = metric_objects + weighted
        self._weighted = tuple([False] * len(metric_objects) + [True] * len(weighted))
        names = [m.name for m in [self.loss_tracker, *self.metrics]]
        if len(set(names)) != len(names):
            raise ValueError(f"metric names must be unique, got {names}; pass name=... to one")
        self._build_state()
        self.compiled = True

    def _build_state(self) -> None:
        engine = self.engine
        if engine.built:  # compiled again: keep the trained values, as Keras does
            self.adapter.assign(engine.state["params"], engine.state["rest"])
        self.adapter.set_policy(self.policy)
        params, rest = self.adapter.variables()
        params = self.policy.cast_to_param(params)
        metrics_graphdef, metrics_state = nnx.split([self.loss_tracker, *self.metrics])
        steps = Steps(
            adapter=self.adapter,
            metrics_graphdef=metrics_graphdef,
            loss=self.loss,
            tx=self._tx,
            weighted=self._weighted,
        )
        state = {
            "params": params,
            "rest": rest,
            "opt": self._tx.init(params),
            "metrics": metrics_state,
        }
        log_names = [m.name for m in (self.loss_tracker, *self.metrics)]
        engine.build(steps, log_names, self.steps_per_execution, self.policy, state)

    def _check_compiled(self, what: str) -> None:
        if not self.compiled:
            raise RuntimeError(
                f"call model.compile(optimizer=..., loss=...) before model.{what}(); the "
                "loss and optimizer define the compiled step"
            )

    def _check_strategy(self, what: str) -> None:
        """Refuses `what` inside the scope of a strategy other than the one the model was
        built for: the model would silently run on its own strategy's devices (a model built
        outside any scope: on one device). tf.distribute raises "Mixing different
        tf.distribute.Strategy objects" there. Outside any scope the model's own strategy is
        used, as built."""
        if not has_strategy():
            return
        current, mine = get_strategy(), self.strategy
        if current is mine or (
            current.devices == mine.devices
            and current.state_sharding == mine.state_sharding
            and current.model_parallel == mine.model_parallel
            and current.axis_rules == mine.axis_rules
        ):
            return
        how = (
            "inside its scope, or with strategy="
            if self._chosen_strategy
            else "outside any scope(), so on the default one-device strategy"
        )
        names = [repr(current), repr(mine)]
        if names[0] == names[1]:  # the same count and platform: tell them apart by device
            names = [f"{s!r} on devices {[d.id for d in s.devices]}" for s in (current, mine)]
        raise ValueError(
            f"model.{what}() was called inside the scope of {names[0]}, but the model was "
            f"built for {names[1]} ({how}); it would run on that strategy's devices, not on "
            "this one's replicas. Build the model in the scope it runs in: with "
            "strategy.scope(): model = phalanx.Model(module); model.compile(...); or pass "
            f"phalanx.Model(module, strategy=strategy); or call model.{what}() outside the "
            "other scope to use the model's own strategy"
        )

    @property
    def module(self) -> Any:
        """The wrapped NNX module (or Keras model), holding the latest trained values."""
        state = self.engine.state
        if state is not None:
            self.adapter.assign(state["params"], state["rest"])
        return self.adapter.model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def get_weights(self) -> list[np.ndarray]:
        """Every model variable as a host NumPy array (a snapshot, as Keras returns), in the
        framework's own order."""
        state = self.engine.state
        if state is None:
            return self.adapter.get_weights(*self.adapter.variables())
        return self.adapter.get_weights(state["params"], state["rest"])

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Restores variables from `get_weights()`'s list (same order and shapes)."""
        self.module  # noqa: B018 -- the user's object first holds the current values
        params, rest = self.adapter.set_weights(weights)
        if self.engine.built:
            self.engine.update_state(params=self.policy.cast_to_param(params), rest=rest)

    @property
    def optimizer(self) -> OptimizerView | None:
        """The compiled optimizer as Keras code reads it: `learning_rate` (settable between
        steps, e.g. from a callback) and `iterations`; None before `compile`, as in Keras."""
        if getattr(self, "_tx", None) is None:
            return None
        return OptimizerView(
            lambda: self.engine.state["opt"],
            lambda opt: self.engine.update_state(opt=opt),
            lambda: self.engine.train_step_count,
            self._tx,
        )

    @optimizer.setter
    def optimizer(self, tx: optax.GradientTransformation) -> None:
        self._tx = tx  # the transformation compile built (wrapped for precision, accumulation)

    @property
    def learning_rate(self) -> float:
        """The optimizer's current learning rate (settable between steps)."""
        self._check_compiled("learning_rate")
        return optimizers_lib.learning_rate(self.engine.state["opt"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._check_compiled("learning_rate")
        opt = optimizers_lib.set_learning_rate(self.engine.state["opt"], value)
        self.engine.update_state(opt=opt)

    @property
    def losses(self) -> list[Any]:
        """The extra loss terms for the current weights, as Keras's `model.losses`: a Keras
        model's regularizer losses (and `add_loss` terms of its last eager call); an NNX
        module's `compile(extra_losses=...)` terms. Training adds them to the loss."""
        state = self.engine.state
        params, rest = (
            (state["params"], state["rest"]) if state is not None else self.adapter.variables()
        )
        return self.adapter.current_losses(params, rest)

    def save_weights(self, filepath: str | Any, overwrite: bool = True) -> None:
        """Writes the weights: a Keras model to Keras's `.weights.h5` (loadable by plain
        Keras), an NNX module to a phalanx checkpoint directory; see
        `checkpoint.weights_files`.

        Example:
          >>> model.save_weights("final.weights.h5")     # a Keras model
        """
        from phalanx._src.train.checkpoint import weights_files

        weights_files.save_weights(self, filepath, overwrite)

    def load_weights(self, filepath: str | Any) -> None:
        """Reads weights written by `save_weights` / `save` (or by Keras itself for a
        Keras model); the optimizer's state is left as it is.

        Example:
          >>> model.load_weights("final.weights.h5")
        """
        from phalanx._src.train.checkpoint import weights_files

        weights_files.load_weights(self, filepath)

    def save(self, filepath: str | Any, overwrite: bool = True) -> None:
        """Saves the model: a Keras model as Keras's `.keras` file (`keras.models.load_model`
        reads it), an NNX module as a phalanx checkpoint directory.

        Example:
          >>> model.save("model.keras")
        """
        from phalanx._src.train.checkpoint import weights_files

        weights_files.save(self, filepath, overwrite)

    def load_checkpoint(self, directory: str | Any, step: int | None = None) -> dict[str, Any]:
        """Restores the training state saved by `ModelCheckpoint` (or `BackupAndRestore`).

        Args:
          directory: the checkpoint directory given to the callback.
          step: which checkpoint (the epoch number, or the step count with an int
            `save_freq`); default: the newest.

        Returns:
          The checkpoint's record (e.g. `{"epoch": 4, "logs": {...}}`).

        Raises:
          FileNotFoundError: no checkpoint in `directory`.

        Example:
          >>> model.compile(...)                       # the same configuration as when saved
          >>> model.load_checkpoint("runs/ckpt")
        """
        from phalanx._src.train.checkpoint.checkpointer import TrainCheckpointer

        self._check_compiled("load_checkpoint")
        checkpointer = TrainCheckpointer(directory)
        try:
            return checkpointer.restore(self.engine, step)
        finally:
            checkpointer.close()

    # ---- the loops ------------------------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
        """Trains, as `keras.Model.fit`: the same arguments, by the same names."""
        from phalanx._src.train.loops.fit import fit

        self._check_compiled("fit")
        self._check_strategy("fit")
        with peer_failures():
            history = fit(self, x, y, **kwargs)
        # The user's own object (a Keras model's get_weights/save/evaluate) sees the result.
        state = self.engine.state
        self.adapter.assign(state["params"], state["rest"])
        return history

    def evaluate(self, x: Any = None, y: Any = None, **kwargs: Any) -> dict[str, float]:
        """Loss and metrics over a dataset, each example counted once; see `loops.evaluate`."""
        from phalanx._src.train.loops.evaluate import evaluate

        self._check_compiled("evaluate")
        self._check_strategy("evaluate")
        with peer_failures():
            return evaluate(self, x, y, **kwargs)

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """Predictions for every example, in order, as NumPy; see `loops.predict`."""
        from phalanx._src.train.loops.predict import predict

        self._check_compiled("predict")
        self._check_strategy("predict")
        with peer_failures():
            return predict(self, x, **kwargs)

    def summary(
        self,
        x: Any = None,
        *,
        input_shape: Any = None,
        print_fn: Callable[[str], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Prints layers, output shapes, parameter counts and bytes, and each device's memory
        for parameters plus optimizer state, as `keras.Model.summary`.

        Output shapes need an input: `x` (a sample batch), `input_shape` (one example's
        shape, without the batch axis), or else the first batch `fit` / `evaluate` saw.

        Example:
          >>> model.summary(input_shape=(784,))
        """
        from phalanx._src.train import summary

        self._check_compiled("summary")
        summary.print_summary(self, print_fn, x=x, input_shape=input_shape, **kwargs)
