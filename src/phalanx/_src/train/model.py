"""`phalanx.Model`: Keras's compile / fit / evaluate / predict for a Flax NNX module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from phalanx._src.cluster.watchdog import peer_failures
from phalanx._src.strategy.strategy import Strategy, get_strategy
from phalanx._src.train.adapters import adapt
from phalanx._src.train.api import keras_bridge, multi_output
from phalanx._src.train.api import optimizers as optimizers_lib
from phalanx._src.train.api import precision as precision_lib
from phalanx._src.train.api.metrics import registry as metrics_registry
from phalanx._src.train.api.metrics.mean import Mean
from phalanx._src.train.engine.accumulation import accumulate_gradients
from phalanx._src.train.engine.packing import Packing
from phalanx._src.train.engine.step import Steps


def _check_steps(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}; e.g. {name}=1")
    return value


class Model:
    """A model with Keras's training API, data-parallel over a strategy.

    The model is a Flax NNX module (BatchNorm, Dropout and any other stateful layer
    included) or, with the `keras` extra, a Keras 3 model on the JAX backend; each framework
    plugs in through a model adapter (`phalanx._src.train.adapters`).

    Build it inside `strategy.scope()` (or pass `strategy=`) and it trains on every replica
    of that strategy; otherwise on the default one-device strategy. `fit`, `evaluate` and
    `predict` give the numbers one device would give on the same global batches, whatever the
    number of replicas, and see every example exactly once.

    Args:
      module: a Flax NNX module (or Keras 3 model) mapping a batch of inputs to predictions.
      strategy: the strategy to train on; default: `phalanx.get_strategy()` at construction.

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

    def __init__(self, module: Any, *, strategy: Strategy | None = None) -> None:
        self.adapter = adapt(module)
        self.strategy = strategy if strategy is not None else get_strategy()
        self.stop_training = False
        self.train_step_count = 0  # batches trained on by fit, over all calls
        self.history: Any = None
        self.compiled = False
        self._tree: dict | None = None  # the training state; see `_state`
        self._leaves: list | None = None  # or its packed leaves, as the compiled calls take them
        self._packing: Packing | None = None
        self._last_logs: Any = None  # the log values of the current metric sums, on device
        self._next_table: Any = None  # fit's next epoch's first inputs (`feed.Tables`)
        self._compiled_fns: dict[Any, Callable] = {}
        self._step_hooks: list[Callable[[int, Any], None]] = []
        # Where fit is, for the checkpoint callbacks: the epoch, the steps already done in it
        # before a resume, the data position at the last epoch end, a position to resume.
        self._fit_epoch = 0
        self._fit_steps_done = 0
        self._last_data_state: Any = None
        self._fit_resume: dict | None = None

    # ---- compile --------------------------------------------------------------------------
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
    ) -> None:
        """Configures training, as `keras.Model.compile`.

        Args:
          optimizer: an optax transformation or a Keras name ('adam', 'sgd', 'adamw',
            'rmsprop') with Keras's defaults (see `phalanx.optimizers.get` for clipping and
            learning rates).
          loss: a Keras loss name, a `phalanx.losses` object, or `fn(y_true, y_pred)`
            returning per-example losses; for a model with several outputs, a dict
            `{output: loss}` or a list with one loss per output (see
            `phalanx._src.train.api.multi_output`).
          metrics: Keras metric names ('accuracy', ...) or `phalanx.metrics` objects; per
            output, a dict `{output: [metrics]}` or a list with one entry per output
            (logged as `{output}_{metric}`).
          steps_per_execution: K optimizer steps per compiled call (K batches in one
            `lax.scan`); batch-level callbacks then fire every K steps. 'auto' picks K.
          gradient_accumulation_steps: k batches per optimizer update; the update equals one
            step on the k batches together.
          precision: 'float32', 'mixed_bfloat16' or 'mixed_float16' (dynamic loss scaling);
            default: `phalanx.mixed_precision.global_policy()`.
          loss_weights: per-output loss weights (a dict or list matching `loss`), or a
            float for a single loss; the total loss is the weighted sum.
          output_names: names for a tuple / list output (default `output_1`, ...).

        Raises:
          ValueError: for an unknown name or a non-positive step count.
        """
        if loss is None:
            raise ValueError(
                "compile() needs a loss, e.g. loss='sparse_categorical_crossentropy' or a "
                "function (y_true, y_pred) -> per-example loss"
            )
        if steps_per_execution != "auto":
            _check_steps(steps_per_execution, "steps_per_execution")
        accumulation = _check_steps(gradient_accumulation_steps, "gradient_accumulation_steps")
        self.policy = precision_lib.get(precision)
        with keras_bridge.keras_names(self.adapter.resolves_keras_names):
            self.loss, metric_objects = multi_output.resolve(
                loss, metrics, loss_weights, output_names, metrics_registry.get
            )
            inner = optimizers_lib.get(optimizer)
        tx = self.policy.wrap_optimizer(accumulate_gradients(inner, accumulation))
        self.optimizer = tx
        self.steps_per_execution = steps_per_execution
        self.gradient_accumulation_steps = accumulation
        self.loss_tracker = Mean(name="loss")
        self.metrics = metric_objects
        names = [m.name for m in [self.loss_tracker, *self.metrics]]
        if len(set(names)) != len(names):
            raise ValueError(f"metric names must be unique, got {names}; pass name=... to one")
        self._build_state()
        self.compiled = True

    def _build_state(self) -> None:
        if self._state is not None:  # compiled again: keep the trained values, as Keras does
            self.adapter.assign(self._state["params"], self._state["rest"])
        self.adapter.set_policy(self.policy)
        params, rest = self.adapter.variables()
        params = self.policy.cast_to_param(params)
        metrics_graphdef, metrics_state = nnx.split([self.loss_tracker, *self.metrics])
        self.steps = Steps(
            adapter=self.adapter,
            metrics_graphdef=metrics_graphdef,
            loss=self.loss,
            tx=self.optimizer,
        )
        state = {
            "params": params,
            "rest": rest,
            "opt": self.optimizer.init(params),
            "metrics": metrics_state,
        }
        self._state = self.strategy.place_train_state(state)
        self._compiled_fns.clear()

    # ---- state access ---------------------------------------------------------------------
    @property
    def _state(self) -> dict | None:
        """The training state `{params, rest, opt, metrics}` (see `step.py`), on the devices.

        The loop's compiled calls take and return the state's leaves (`_state_leaves`): a
        flat list crosses jit's C++ dispatch without a Python callback per variable, which
        the NNX `State` tree needs (~14 per step for a small MLP, issue 9), and its small
        leaves travel packed into one vector per bit width (`packing`). The tree is rebuilt
        from the leaves only when something reads it.
        """
        if self._tree is None and self._leaves is not None:
            packing = self._packing
            self._tree = jax.tree.unflatten(packing.treedef, packing.leaves(self._leaves))
        return self._tree

    @_state.setter
    def _state(self, value: dict | None) -> None:
        self._tree = value
        self._leaves = None
        self._last_logs = None  # logs belong to the metric sums they were computed from

    def _state_leaves(self) -> tuple[list, Packing]:
        """`(packed leaves, packing)` of the training state, as the compiled calls take it."""
        if self._leaves is None:
            leaves, treedef = jax.tree.flatten(self._tree)
            metrics = treedef.children()[0].num_leaves  # "metrics" sorts first
            # Small arrays join the packed vectors unless the strategy lays the state out.
            replicated = self.strategy.state_sharding == "replicated"
            packing = Packing.of(treedef, leaves, metrics, arrays=replicated)
            if packing != self._packing:  # else keep the one the compiled calls know
                self._packing = packing
            self._leaves = self._packing.pack(leaves)
        return self._leaves, self._packing

    def _set_state_leaves(self, leaves: list, last_logs: Any = None) -> None:
        """The state (packed leaves) after a compiled call, with the logs of its metric sums."""
        self._leaves = leaves
        self._tree = None
        self._last_logs = last_logs

    def _check_compiled(self, what: str) -> None:
        if not self.compiled:
            raise RuntimeError(
                f"call model.compile(optimizer=..., loss=...) before model.{what}(); the "
                "loss and optimizer define the compiled step"
            )

    @property
    def module(self) -> Any:
        """The wrapped NNX module (or Keras model), holding the latest trained values."""
        if self._state is not None:
            self.adapter.assign(self._state["params"], self._state["rest"])
        return self.adapter.model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def get_weights(self) -> list[np.ndarray]:
        """Every model variable as a host NumPy array (a snapshot, as Keras returns), in the
        framework's own order."""
        if self._state is None:
            return self.adapter.get_weights(*self.adapter.variables())
        return self.adapter.get_weights(self._state["params"], self._state["rest"])

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Restores variables from `get_weights()`'s list (same order and shapes)."""
        self.module  # noqa: B018 -- the user's object first holds the current values
        params, rest = self.adapter.set_weights(weights)
        if self._state is not None:
            params = self.policy.cast_to_param(params)
            self._state = {
                **self._state,
                **self.strategy.place_train_state({"params": params, "rest": rest}),
            }

    @property
    def learning_rate(self) -> float:
        """The optimizer's current learning rate (settable between steps)."""
        self._check_compiled("learning_rate")
        return optimizers_lib.learning_rate(self._state["opt"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._check_compiled("learning_rate")
        opt = optimizers_lib.set_learning_rate(self._state["opt"], value)
        self._state = {**self._state, **self.strategy.place_train_state({"opt": opt})}

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
            return checkpointer.restore(self, step)
        finally:
            checkpointer.close()

    # ---- the loops ------------------------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
        """Trains; see `phalanx._src.train.loops.loop.fit` for every argument (Keras's names)."""
        from phalanx._src.train.loops import loop

        self._check_compiled("fit")
        with peer_failures():
            history = loop.fit(self, x, y, **kwargs)
        # The user's own object (a Keras model's get_weights/save/evaluate) sees the result.
        self.adapter.assign(self._state["params"], self._state["rest"])
        return history

    def evaluate(self, x: Any = None, y: Any = None, **kwargs: Any) -> dict[str, float]:
        """Loss and metrics over a dataset, each example counted once; see `loop.evaluate`."""
        from phalanx._src.train.loops import loop

        self._check_compiled("evaluate")
        with peer_failures():
            return loop.evaluate(self, x, y, **kwargs)

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """Predictions for every example, in order, as NumPy; see `loop.predict`."""
        from phalanx._src.train.loops import loop

        self._check_compiled("predict")
        with peer_failures():
            return loop.predict(self, x, **kwargs)

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
        shape, without the batch axis), or else the first batch `fit` / `evaluate` saw. See
        `phalanx._src.train.summary`.

        Example:
          >>> model.summary(input_shape=(784,))
        """
        from phalanx._src.train import summary

        summary.print_summary(self, print_fn, x=x, input_shape=input_shape, **kwargs)

    # ---- hooks for the loop and the checkpoint callbacks ----------------------------------
    def _execution_k(self, steps_hint: int | None = None) -> int:
        """Steps per compiled call, for a phase of about `steps_hint` steps when known."""
        k = self.steps_per_execution
        if k == "auto":
            # One call per ~50 steps amortises dispatch (1.4-1.8x for a small MLP, measured);
            # fewer when the phase is shorter, so no call is mostly filler steps. On XLA:CPU
            # a convnet falls back to single-step calls (see execution.py).
            return max(1, min(50, steps_hint or 50))
        return k

    def _on_train_steps(self, steps: int, feed: Any) -> None:
        """Called after each execution with the epoch's step count; checkpoint callbacks
        that save every N steps hook in here (see `ModelCheckpoint`)."""
        for hook in self._step_hooks:
            hook(steps, feed)
