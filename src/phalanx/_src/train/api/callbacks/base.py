"""`Callback`: Keras's hooks, plus what the loop needs to keep unused hooks free.

The training loop calls hooks with `logs`, a dict of Python floats (metric name -> value;
validation metrics prefixed 'val_'). It never syncs with the device just to call a hook that
nobody overrides: `CallbackList` asks each callback which hooks it uses
(`uses_batch_hooks`) and how often it needs fresh per-batch logs (`batch_logs_interval`).

The model contract (what built-in callbacks read or write on `self.model`):

* `stop_training: bool` - set True to end `fit` after the current epoch (EarlyStopping,
  TerminateOnNaN); the loop checks it after every batch hook and epoch.
* `learning_rate: float` property, readable and settable between steps
  (LearningRateScheduler); backed by `phalanx.optimizers.learning_rate` /
  `set_learning_rate` on the optimizer state.
* `get_weights()` -> a host-side snapshot of every model variable (e.g. a list of NumPy
  arrays) that stays valid after later steps, even with donated buffers;
  `set_weights(weights)` restores such a snapshot (EarlyStopping(restore_best_weights=True)).
* `history` - History stores itself there after each epoch, as Keras does.
* `metrics` (optional) - metric objects with `name` and `direction` ('up'/'down'), used by
  EarlyStopping(mode='auto') for metrics it cannot classify by name.
"""

from __future__ import annotations

from typing import Any

MODES = ("train", "test", "predict")

# Every hook, in Keras's order. The per-batch ones are what the loop avoids when unused.
HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_test_begin",
    "on_test_end",
    "on_predict_begin",
    "on_predict_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_batch_begin",
    "on_batch_end",
)


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


class Callback:
    """Base class for callbacks: override the hooks you need; the others cost nothing.

    Hooks receive `logs`, a dict of Python floats (or None). In batch hooks the logs are the
    values the loop fetched most recently: fresh at least every `batch_logs_interval(mode)`
    batches, possibly empty in between (the loop does not sync with the device every step
    unless some callback asks for it).

    `on_train_batch_begin/end` call `on_batch_begin/end` by default, as in Keras, so
    overriding either name works.

    Attributes:
      async_safe: Keras's flag (default False). True says the callback's batch-end hooks
        only read their arguments: the loop may then call them after it has dispatched the
        next execution, so the devices never wait for the host between steps. fit defers
        the batch-end hooks only when every callback that has one is async-safe; a
        `model.stop_training` set there then stops fit one execution later.
      model: the model being trained, set by the loop through `set_model` (see the module
        docstring for the attributes built-in callbacks use).
      params: dict set by `set_params`: 'epochs', 'steps' (per epoch, or None if unknown)
        and 'verbose'.

    Example:
      >>> class PrintLoss(Callback):
      ...     def on_epoch_end(self, epoch, logs=None):
      ...         print(epoch, logs["loss"])
    """

    async_safe = False

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self._model: Any = None

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def set_model(self, model: Any) -> None:
        self._model = model

    @property
    def model(self) -> Any:
        return self._model

    # -- which hooks this callback uses ----------------------------------------------------

    def implements(self, hook: str) -> bool:
        """True when this callback's class overrides `hook` (or, for train batch hooks, the
        `on_batch_*` alias they call)."""
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; hooks are {HOOKS}")
        if _overrides(type(self), hook):
            return True
        alias = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}
        return hook in alias and _overrides(type(self), alias[hook])

    def uses_batch_hooks(self, mode: str) -> bool:
        """Whether the loop must call this callback's per-batch hooks in `mode`."""
        _check_mode(mode)
        return self.implements(f"on_{mode}_batch_begin") or self.implements(f"on_{mode}_batch_end")

    def batch_logs_interval(self, mode: str) -> int | None:
        """How often (in batches) this callback needs freshly fetched logs in `mode`.

        None: it needs no per-batch values (it may still count batches). The default, for a
        callback that overrides a batch-end hook, is 1 (Keras's semantics: fresh logs every
        batch); built-in callbacks ask for less so the device is not synced every step.
        """
        return 1 if self.implements(f"on_{_check_mode(mode)}_batch_end") else None

    # -- Keras's hooks ------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        """Called once at the start of `fit`."""

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        """Called once at the end of `fit` (also after an early stop)."""

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        """Called at the start of every epoch (0-based)."""

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        """Called at the end of every epoch with the epoch's metrics (and 'val_' ones)."""

    def on_test_begin(self, logs: dict[str, float] | None = None) -> None:
        """Called at the start of `evaluate` (and of validation inside `fit`)."""

    def on_test_end(self, logs: dict[str, float] | None = None) -> None:
        """Called at the end of `evaluate` (and of validation inside `fit`)."""

    def on_predict_begin(self, logs: dict[str, float] | None = None) -> None:
        """Called at the start of `predict`."""

    def on_predict_end(self, logs: dict[str, float] | None = None) -> None:
        """Called at the end of `predict`."""

    def on_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Alias of `on_train_batch_begin` (Keras's older name)."""

    def on_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Alias of `on_train_batch_end` (Keras's older name)."""

    def on_train_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Called before training batch `batch` (0-based within the epoch)."""
        self.on_batch_begin(batch, logs=logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Called after training batch `batch` with the latest fetched logs."""
        self.on_batch_end(batch, logs=logs)

    def on_test_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Called before evaluation batch `batch`."""

    def on_test_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Called after evaluation batch `batch`."""

    def on_predict_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Called before prediction batch `batch`."""

    def on_predict_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """Called after prediction batch `batch`."""


def _overrides(cls: type, hook: str) -> bool:
    return getattr(cls, hook) is not getattr(Callback, hook)
