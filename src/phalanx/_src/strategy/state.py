"""The stack of entered strategy scopes: one small object, like jax's distributed state."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx._src.strategy.strategy import Strategy


class StrategyStack:
    """Strategies whose `scope()` is open, innermost last."""

    def __init__(self) -> None:
        self._stack: list[Strategy] = []

    def push(self, strategy: Strategy) -> None:
        self._stack.append(strategy)

    def pop(self, strategy: Strategy) -> None:
        if not self._stack or self._stack[-1] is not strategy:
            raise RuntimeError(
                "strategy scopes must close in the reverse order they were opened; "
                f"closing {strategy!r} but the innermost open scope is "
                f"{self._stack[-1] if self._stack else None!r}"
            )
        self._stack.pop()

    def current(self) -> Strategy | None:
        return self._stack[-1] if self._stack else None

    def snapshot(self) -> tuple[Strategy, ...]:
        return tuple(self._stack)

    def restore(self, saved: tuple[Strategy, ...]) -> None:
        self._stack[:] = saved


STACK = StrategyStack()
