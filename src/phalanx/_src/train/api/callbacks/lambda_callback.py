"""`LambdaCallback`: a callback made of plain functions, as Keras's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx._src.train.api.callbacks.base import HOOKS, Callback

_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


class LambdaCallback(Callback):
    """Calls the functions it is given at the matching hooks (Keras's arguments).

    Each function takes the hook's arguments: `on_epoch_begin(epoch, logs)`,
    `on_train_batch_end(batch, logs)`, `on_train_begin(logs)`, and so on. Other hooks
    (`on_test_begin`, `on_predict_batch_end`, `on_batch_end`, ...) are passed by name as
    keyword arguments. Only the hooks given are called, so an unused batch hook costs
    nothing.

    Args:
      on_epoch_begin: `fn(epoch, logs)`, or None.
      on_epoch_end: `fn(epoch, logs)`, or None.
      on_train_begin: `fn(logs)`, or None.
      on_train_end: `fn(logs)`, or None.
      on_train_batch_begin: `fn(batch, logs)`, or None.
      on_train_batch_end: `fn(batch, logs)`, or None.
      **kwargs: more hooks, by their Keras names.

    Raises:
      TypeError: an unknown hook name, or a hook that is not callable.

    Example:
      >>> log = LambdaCallback(on_epoch_end=lambda epoch, logs: print(epoch, logs["loss"]))
      >>> model.fit(x, y, epochs=3, callbacks=[log])
    """

    def __init__(
        self,
        on_epoch_begin: Callable[..., Any] | None = None,
        on_epoch_end: Callable[..., Any] | None = None,
        on_train_begin: Callable[..., Any] | None = None,
        on_train_end: Callable[..., Any] | None = None,
        on_train_batch_begin: Callable[..., Any] | None = None,
        on_train_batch_end: Callable[..., Any] | None = None,
        **kwargs: Callable[..., Any],
    ) -> None:
        super().__init__()
        unknown = sorted(set(kwargs) - set(HOOKS))
        if unknown:
            raise TypeError(f"LambdaCallback got unknown hooks {unknown}; hooks are {list(HOOKS)}")
        given = {
            "on_epoch_begin": on_epoch_begin,
            "on_epoch_end": on_epoch_end,
            "on_train_begin": on_train_begin,
            "on_train_end": on_train_end,
            "on_train_batch_begin": on_train_batch_begin,
            "on_train_batch_end": on_train_batch_end,
            **kwargs,
        }
        self._given = {hook: fn for hook, fn in given.items() if fn is not None}
        for hook, fn in self._given.items():
            if not callable(fn):
                raise TypeError(f"LambdaCallback({hook}=...) needs a function, got {fn!r}")
            setattr(self, hook, fn)

    def implements(self, hook: str) -> bool:
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; hooks are {HOOKS}")
        return hook in self._given or _ALIASES.get(hook) in self._given
