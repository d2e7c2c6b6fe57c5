"""What the modules below `strategy.py` know of a strategy: a protocol, not the class.

`Strategy` (strategy.py) is the room's top: it imports `run`, `reduce`, the distribution
modules and the replica context, and none of them imports it back, so imports in
`strategy/` go one way (tests/test_structure.py checks it). They annotate the strategy
they are handed as `StrategyLike`, and the replica context outside any scope reaches the
default strategy through `state.default_strategy()`, which `strategy.py` provides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh, NamedSharding


class StrategyLike(Protocol):
    """The part of `phalanx.Strategy` that `run`, `reduce` and the input modules use."""

    _run_cache: dict[Any, Any]

    @property
    def num_replicas_in_sync(self) -> int: ...

    @property
    def num_local_replicas(self) -> int: ...

    @property
    def model_parallel(self) -> int: ...

    @property
    def devices(self) -> tuple[jax.Device, ...]: ...

    @property
    def mesh(self) -> Mesh: ...

    @property
    def axis_name(self) -> str: ...

    @property
    def data_sharding(self) -> NamedSharding: ...

    @property
    def replicated_sharding(self) -> NamedSharding: ...
