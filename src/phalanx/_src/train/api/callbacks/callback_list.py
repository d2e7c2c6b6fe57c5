"""`CallbackList`: calls each hook only on the callbacks that use it."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from typing import Any

from phalanx._src.train.api.callbacks.base import HOOKS, Callback, _check_mode
from phalanx._src.train.api.callbacks.history import History
from phalanx._src.train.api.callbacks.progbar import ProgbarLogger


def to_python_logs(logs: dict[str, Any] | None) -> dict[str, Any]:
    """`logs` with scalar arrays turned into Python floats (one fetch each, done once)."""
    if not logs:
        return {} if logs is None else logs
    # The loop's logs are floats already (`feed.fetch_logs`): a copy, with no call for each.
    return {k: v if type(v) is float else _to_float(v) for k, v in logs.items()}


def _to_float(value: Any) -> Any:
    if isinstance(value, float | bool):
        return value
    if isinstance(value, numbers.Number) or getattr(value, "shape", None) == ():
        return float(value)
    return value


class CallbackList:
    """The callbacks of one `fit` / `evaluate` / `predict` call, dispatched cheaply.

    For each hook it keeps the list of callbacks that override it, so a hook nobody
    overrides is an empty loop. The training loop should ask, once per phase:

    * `needs_batch_hooks(mode)`: False means skip the per-batch hook calls entirely;
    * `batch_logs_interval(mode)`: None means no callback needs per-batch values, so logs
      are fetched from the device only at epoch end; k means fetch them at least every k
      batches (pass `{}` or the last fetched logs in between);
    * `batch_end_deferred(mode)`: True means every batch-end receiver is `async_safe`, so
      the hooks of an execution may run after the next one is dispatched;
    * `epoch_hooks_deferred()`: the same for the epoch hooks, at the next epoch's first call.

    Logs given to hooks are converted once to Python floats and the same dict is passed to
    every callback (so a callback may add keys for later ones, as LearningRateScheduler adds
    'learning_rate' for History).

    Args:
      callbacks: the user's callbacks.
      add_history: append a `History` if none is given (as Keras's fit does).
      add_progbar: append a `ProgbarLogger` if none is given.
      model: passed to every callback's `set_model`.
      **params: passed to every callback's `set_params` ('epochs', 'steps', 'verbose').

    Example:
      >>> cbs = CallbackList([EarlyStopping()], add_history=True, model=model, epochs=5,
      ...                    steps=100, verbose=1)
      >>> every = cbs.batch_logs_interval("train")   # None: fetch logs at epoch end only
    """

    def __init__(
        self,
        callbacks: Iterable[Callback] | None = None,
        add_history: bool = False,
        add_progbar: bool = False,
        model: Any = None,
        **params: Any,
    ) -> None:
        self.callbacks: list[Callback] = []
        for callback in callbacks or ():
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"callbacks must be phalanx.callbacks.Callback instances, got {callback!r} "
                    f"of type {type(callback).__name__}; subclass Callback and override hooks"
                )
            self.callbacks.append(callback)
        self.history = next((c for c in self.callbacks if isinstance(c, History)), None)
        if self.history is None and add_history:
            self.history = History()
            self.callbacks.append(self.history)
        if add_progbar and not any(isinstance(c, ProgbarLogger) for c in self.callbacks):
            self.callbacks.append(ProgbarLogger())
        self.model = model
        self.params = params
        if model is not None:
            self.set_model(model)
        if params:
            self.set_params(params)
        self._index()

    def _index(self) -> None:
        self._by_hook = {h: [c for c in self.callbacks if c.implements(h)] for h in HOOKS}

    def append(self, callback: Callback) -> None:
        self.callbacks.append(callback)
        if self.model is not None:
            callback.set_model(self.model)
        if self.params:
            callback.set_params(self.params)
        self._index()

    def set_model(self, model: Any) -> None:
        self.model = model
        for callback in self.callbacks:
            callback.set_model(model)

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params
        for callback in self.callbacks:
            callback.set_params(params)

    def __iter__(self):
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    # -- what the loop must provide -------------------------------------------------------------

    def needs_batch_hooks(self, mode: str = "train") -> bool:
        """Whether any callback uses per-batch hooks in `mode` ('train', 'test', 'predict')."""
        return any(c.uses_batch_hooks(mode) for c in self.callbacks)

    def batch_end_deferred(self, mode: str = "train") -> bool:
        """Whether the loop may call the batch-end hooks of `mode` after dispatching the next
        execution: every callback that has one is `async_safe` (Keras's rule), and none has
        a batch-begin hook (so each batch's hooks still run in order)."""
        mode = _check_mode(mode)
        if self.batch_hook(mode, "begin") is not None:
            return False
        receivers = self._by_hook[f"on_{mode}_batch_end"]
        return all(c.async_safe for c in receivers if c.uses_batch_hooks(mode))

    def epoch_hooks_deferred(self) -> bool:
        """Whether fit may run an epoch's `on_epoch_end` and the next one's `on_epoch_begin`
        after dispatching the next epoch's first call: every callback that has either hook
        is `async_safe` (History and the progress bar are)."""
        hooks = ("on_epoch_begin", "on_epoch_end")
        return all(c.async_safe for hook in hooks for c in self._by_hook[hook])

    def batch_logs_interval(self, mode: str = "train") -> int | None:
        """The most frequent per-batch log fetch any callback needs in `mode`, or None."""
        _check_mode(mode)
        wanted = [c.batch_logs_interval(mode) for c in self.callbacks if c.uses_batch_hooks(mode)]
        wanted = [w for w in wanted if w is not None]
        return min(wanted) if wanted else None

    # -- dispatch -------------------------------------------------------------------------------

    def _call(self, hook: str, *args: Any, logs: dict[str, Any] | None) -> None:
        receivers = self._by_hook[hook]
        if not receivers:
            return
        logs = to_python_logs(logs)
        for callback in receivers:
            getattr(callback, hook)(*args, logs=logs)

    def _call_batch(self, mode: str, when: str, batch: int, logs: dict[str, Any] | None) -> None:
        call = self.batch_hook(mode, when)
        if call is not None:
            call(batch, logs)

    def batch_hook(self, mode: str, when: str) -> Callable[[int, Any], None] | None:
        """`call(batch, logs)` running every callback's `on_{mode}_batch_{when}` that the loop
        must call, or None when there is none; the loop looks it up once per phase, not per
        batch. Each call hands the receivers one fresh dict of Python floats."""
        hook = f"on_{mode}_batch_{when}"
        methods = [getattr(c, hook) for c in self._by_hook[hook] if c.uses_batch_hooks(mode)]
        if not methods:
            return None

        def call(batch: int, logs: dict[str, Any] | None) -> None:
            logs = to_python_logs(logs) if logs else {}
            for method in methods:
                method(batch, logs=logs)

        return call

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._call("on_train_begin", logs=logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._call("on_train_end", logs=logs)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._call("on_epoch_begin", epoch, logs=logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._call("on_epoch_end", epoch, logs=logs)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._call("on_test_begin", logs=logs)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._call("on_test_end", logs=logs)

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._call("on_predict_begin", logs=logs)

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._call("on_predict_end", logs=logs)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_batch("train", "begin", batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_batch("train", "end", batch, logs)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_batch("test", "begin", batch, logs)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_batch("test", "end", batch, logs)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_batch("predict", "begin", batch, logs)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_batch("predict", "end", batch, logs)
