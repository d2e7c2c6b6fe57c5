"""The distributed input a custom loop iterates: `DistributedDataset` and its iterator, and
`PerReplicaBatches` (`distribute_datasets_from_function`'s join of per-replica batches).
Each global batch is made by distribute.py's `BatchDistributor`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from phalanx._src.strategy.device_batch import check_device_batch
from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.strategy.keras_input import KerasInput
from phalanx._src.strategy.optional import Optional

if TYPE_CHECKING:
    from phalanx._src.strategy.base import StrategyLike


class DistributedDataset(KerasInput):
    """An iterable of global batches made from a process-local iterable of host batches.

    Returned by `strategy.experimental_distribute_dataset` (alias `strategy.distribute`).
    Iterating yields the dataset's own structure (tuple, dict, ...) of global `jax.Array`s
    sharded along the data axis; a partial last batch is padded to the compiled shape and its
    mask travels with it (`phalanx.get_batch_mask(batch)` reads it). Plain Keras 3 takes it
    as `x` and reads the dataset it distributes (`keras_input.py`).
    """

    def __init__(
        self,
        strategy: StrategyLike,
        make_iterable: Callable[[], Iterable[Any]],
        *,
        global_batch_size: int | None = None,
        drop_remainder: bool = False,
        source: Any = None,
    ) -> None:
        self._strategy = strategy
        self._make_iterable = make_iterable
        self._source = source
        # Validate the declared split now, before anything is iterated or compiled.
        self._distributor = BatchDistributor(
            strategy, global_batch_size=global_batch_size, drop_remainder=drop_remainder
        )

    def __iter__(self) -> Iterator[Any]:
        return DistributedIterator(iter(self._make_iterable()), self._distributor)

    def _keras_batches(self) -> Any:
        return self._source if isinstance(self._source, KerasInput) else None

    @property
    def element_spec(self) -> Any:
        """The global batch's structure of specs, as TF's (its input dataset's `element_spec`).

        It may be passed as `@phalanx.function(input_signature=[...])`, which accepts it and
        compiles once per shape anyway.
        """
        spec = getattr(self._source, "element_spec", None)
        if spec is None:
            raise AttributeError(
                "element_spec: this distributed dataset's input has none; TF's is known for "
                "strategy.experimental_distribute_dataset(phalanx.data.Dataset), and so is "
                "phalanx's (read dataset.element_spec from the dataset itself otherwise)"
            )
        return spec


class PerReplicaBatches:
    """Joins `replicas` consecutive per-replica batches into one process batch, in order.

    tf.distribute's `distribute_datasets_from_function` takes one batch of `dataset_fn`'s
    dataset per local replica each step; joined in replica order, the rows of batch r land
    on local replica r when the batches are full. At the end of the data a step takes the
    batches that are left (fewer, or a short one), which is then a partial process batch
    padded and masked as `experimental_distribute_dataset` pads it. Iterator state
    (`get_state` / `set_state`) is the source iterator's: it advances one batch at a time.
    """

    def __init__(self, source: Iterable[Any], replicas: int) -> None:
        self._source = source
        self._replicas = replicas

    def __iter__(self) -> Iterator[Any]:
        return _JoinedIterator(iter(self._source), self._replicas)


class _JoinedIterator:
    def __init__(self, source: Iterator[Any], replicas: int) -> None:
        self._source = source
        self._replicas = replicas

    def __iter__(self) -> _JoinedIterator:
        return self

    def __next__(self) -> Any:
        batches = []
        for _ in range(self._replicas):
            try:
                batches.append(next(self._source))
            except StopIteration:
                break
        if not batches:
            raise StopIteration
        if len(batches) == 1:
            return batches[0]
        return jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts]), *batches)

    def get_state(self) -> Any:
        return self._source.get_state()  # type: ignore[attr-defined]

    def set_state(self, state: Any) -> None:
        self._source.set_state(state)  # type: ignore[attr-defined]


class DistributedIterator:
    """Iterator over global batches; `get_state`/`set_state` delegate to the source."""

    def __init__(self, source: Iterator[Any], distributor: BatchDistributor) -> None:
        self._source = source
        self._distributor = distributor

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self._source)
        # The device boundary: a host pipeline may carry strings, a global array may not.
        check_device_batch(batch, "a batch of the distributed dataset")
        return self._distributor(batch)

    def get_next(self) -> Any:
        """The next global batch, as TF's `iterator.get_next()` (StopIteration at the end)."""
        return next(self)

    def get_next_as_optional(self) -> Optional:
        """The next global batch in an `Optional`, empty at the end instead of raising.

        Example:
          >>> optional = distributed_iterator.get_next_as_optional()
          >>> if optional.has_value():
          ...     strategy.run(step, args=(optional.get_value(),))
        """
        return Optional.next_of(self)

    def get_state(self) -> Any:
        return self._source.get_state()  # type: ignore[attr-defined]

    def set_state(self, state: Any) -> None:
        self._source.set_state(state)  # type: ignore[attr-defined]
