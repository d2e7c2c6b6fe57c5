"""The stack of entered strategy scopes: one small object, like jax's distributed state."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx._src.strategy.base import StrategyLike


class StrategyStack:
    """Strategies whose `scope()` is open, innermost last."""

    def __init__(self) -> None:
        self._stack: list[StrategyLike] = []

    def push(self, strategy: StrategyLike) -> None:
        self._stack.append(strategy)

    def pop(self, strategy: StrategyLike) -> None:
        if not self._stack or self._stack[-1] is not strategy:
            raise RuntimeError(
                "strategy scopes must close in the reverse order they were opened; "
                f"closing {strategy!r} but the innermost open scope is "
                f"{self._stack[-1] if self._stack else None!r}"
            )
        self._stack.pop()

    def current(self) -> StrategyLike | None:
        return self._stack[-1] if self._stack else None

    def snapshot(self) -> tuple[StrategyLike, ...]:
        return tuple(self._stack)

    def restore(self, saved: tuple[StrategyLike, ...]) -> None:
        self._stack[:] = saved


STACK = StrategyStack()
_DEFAULT: list[Callable[[], StrategyLike]] = []  # strategy.py's `get_strategy`


def provide_default(get: Callable[[], StrategyLike]) -> None:
    """Registers how to get the current-or-default strategy (strategy.py does, at import)."""
    _DEFAULT[:] = [get]


def default_strategy() -> StrategyLike:
    """`phalanx.get_strategy()`, for modules that cannot import strategy.py."""
    if not _DEFAULT:  # pragma: no cover - strategy.py is imported with phalanx
        raise RuntimeError("phalanx._src.strategy.strategy was not imported")
    return _DEFAULT[0]()
