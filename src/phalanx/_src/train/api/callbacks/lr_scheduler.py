"""`LearningRateScheduler`: set the learning rate at the start of every epoch."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable

from phalanx._src.train.api.callbacks.base import Callback


class LearningRateScheduler(Callback):
    """Sets `model.learning_rate = schedule(epoch, lr)` before each epoch (Keras's rule).

    The model must expose a `learning_rate` property that reads the optimizer's current
    rate as a float and sets it for the following steps (phalanx's Model implements it with
    `phalanx.optimizers.learning_rate` / `set_learning_rate`; it raises TypeError when the
    optimizer was built with a schedule, as Keras does). The rate in effect is added to the
    epoch's logs as 'learning_rate', so History and CSVLogger record it.

    Args:
      schedule: `schedule(epoch, lr) -> new lr` (epoch 0-based, lr the current rate); a
        one-argument `schedule(epoch)` is accepted too, as in Keras.
      verbose: 1 prints each change.

    Raises:
      ValueError: the schedule returned something that is not a real number.

    Example:
      >>> def schedule(epoch, lr):
      ...     return lr if epoch < 10 else lr * 0.9
      >>> model.fit(x, y, epochs=20, callbacks=[LearningRateScheduler(schedule)])
    """

    def __init__(self, schedule: Callable[..., float], verbose: int = 0) -> None:
        super().__init__()
        if not callable(schedule):
            raise TypeError(f"schedule must be a function (epoch, lr) -> lr, got {schedule!r}")
        self.schedule = schedule
        self.verbose = verbose

    def _current(self) -> float:
        if not hasattr(self.model, "learning_rate"):
            raise ValueError(
                "LearningRateScheduler needs a model with a `learning_rate` property (get and "
                f"set); {type(self.model).__name__} has none"
            )
        return float(self.model.learning_rate)

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        current = self._current()
        new = (
            self.schedule(epoch) if _takes_one_arg(self.schedule) else self.schedule(epoch, current)
        )
        if not isinstance(new, numbers.Real) or isinstance(new, bool):
            raise ValueError(
                f"the schedule must return a float learning rate, got {new!r} of type "
                f"{type(new).__name__} for epoch {epoch}"
            )
        self.model.learning_rate = float(new)
        if self.verbose > 0:
            print(
                f"Epoch {epoch + 1}: LearningRateScheduler setting learning rate to {float(new)}."
            )

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = self._current()


def _takes_one_arg(fn: Callable[..., float]) -> bool:
    """True for Keras's old `schedule(epoch)` form."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: assume (epoch, lr)
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    return len(positional) == 1 and not variadic
