"""`as_batches`: one entry point that turns whatever the user passes into NumPy batches.

fit and experimental_distribute_dataset accept arrays, phalanx Datasets, Grain datasets
and loaders, tf.data datasets, PyTorch DataLoaders and plain iterables of batches. This
module recognizes each (TensorFlow and PyTorch by duck typing, never importing them) and
returns an iterable whose iterators yield pytrees of NumPy arrays, checked on arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from phalanx._src.data import validation
from phalanx._src.data.dataset import Dataset
from phalanx._src.strategy import device_batch

_KINDS = (
    "NumPy arrays (x, a tuple (x, y) or a dict) with batch_size, a phalanx.data.Dataset, a "
    "Grain MapDataset/IterDataset/DataLoader, a tf.data.Dataset, a torch DataLoader, or an "
    "iterable of NumPy batches"
)


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (
        hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype")
    )


def _is_array_tree(data: Any, top: bool = True) -> bool:
    if _is_array(data):
        return True
    # A top-level list is an iterable of batches; inside a tuple or dict it is an array.
    if isinstance(data, list):
        return not top
    if isinstance(data, dict) and data:
        return all(_is_array_tree(v, top=False) for v in data.values())
    if isinstance(data, tuple) and data:
        return all(_is_array_tree(v, top=False) for v in data)
    return False


def _module(obj: Any) -> str:
    return type(obj).__module__ or ""


def _torch_batch(batch: Any) -> Any:
    # torch's default collate turns an (x, y) example into a [x, y] list; give back the tuple.
    return tuple(batch) if isinstance(batch, list) else batch


class Batches:
    """An iterable of NumPy batches from a foreign source, checked as they arrive.

    Each `iter()` starts a pass over the source. Its iterators have `get_state`/`set_state`
    when the source's iterators do (Grain's), and say so with `checkpointable`.

    Attributes:
      source: the object this was built from.
      batch_size: None (foreign sources decide their own batch sizes).
      drop_remainder: False.
      cardinality: batches per pass when the source has a length, else None.
    """

    batch_size = None
    drop_remainder = False

    def __init__(
        self,
        source: Any,
        open_: Callable[[], Iterator[Any]],
        convert: Callable[[Any], Any] | None = None,
    ):
        self.source = source
        self._open = open_
        self._convert = convert
        try:
            self.cardinality: int | None = len(source)
        except TypeError:
            self.cardinality = None

    def __iter__(self) -> BatchIterator:
        return BatchIterator(self._open(), type(self.source).__name__, self._convert)

    def __repr__(self) -> str:
        return f"Batches({type(self.source).__name__}, cardinality={self.cardinality})"


class BatchIterator:
    """One pass over a foreign source: converts leaves to NumPy and checks every batch."""

    def __init__(
        self, inner: Iterator[Any], name: str, convert: Callable[[Any], Any] | None = None
    ):
        self._inner = inner
        self._name = name
        self._convert = convert
        self._count = 0
        self.checkpointable = callable(getattr(inner, "get_state", None)) and callable(
            getattr(inner, "set_state", None)
        )

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except StopIteration:
            if self._count == 0:
                raise ValueError(
                    f"the {self._name} yielded no batches. Pass a non-empty source; a one-shot "
                    "iterator (a generator) is empty after its first pass, so for several "
                    "epochs pass a re-iterable (a list, a Dataset) or a repeating source."
                ) from None
            raise
        if self._convert is not None:
            batch = self._convert(batch)
        batch = validation.check_batch(batch, f"batch {self._count} of the {self._name}")
        self._count += 1
        return batch

    def get_state(self) -> Any:
        """The source iterator's state (Grain iterators have one)."""
        if not self.checkpointable:
            raise TypeError(
                f"iterators of {self._name} have no get_state(); use a phalanx.data.Dataset or "
                "a Grain dataset to checkpoint the input position."
            )
        return self._inner.get_state()

    def set_state(self, state: Any) -> None:
        """Restores the source iterator's state."""
        if not self.checkpointable:
            raise TypeError(f"iterators of {self._name} have no set_state().")
        self._inner.set_state(state)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()


def _grain_kind(data: Any) -> bool:
    if not _module(data).startswith("grain"):
        return False
    import grain  # Only when the object already comes from Grain.

    return isinstance(data, grain.MapDataset | grain.IterDataset | grain.DataLoader)


def as_batches(
    data: Any,
    batch_size: int | None = None,
    *,
    drop_remainder: bool = False,
    shuffle: bool = False,
    seed: int | None = None,
) -> Dataset | Batches:
    """Returns an iterable of NumPy-batch pytrees for any supported input.

    Arrays become `Dataset.from_tensor_slices(data)[.shuffle()].batch(batch_size)`, an
    unbatched Dataset is batched, a batched Dataset is returned as is; every other source
    must already yield batches and is wrapped in `Batches`, which converts tensors to NumPy
    and checks each batch.

    Args:
      data: NumPy arrays (x, a tuple (x, y[, sample_weight]) or a dict), a
        `phalanx.data.Dataset`, a Grain MapDataset/IterDataset/DataLoader, a tf.data
        dataset, a torch DataLoader, or any iterable of batches. A list is read as an
        iterable of batches; pass several arrays as a tuple.
      batch_size: rows per batch for arrays and unbatched Datasets (32 for arrays when
        None); must be None for sources that batch themselves.
      drop_remainder: for arrays: drop a short last batch.
      shuffle: for arrays: reshuffle the rows every epoch.
      seed: for arrays: the shuffle seed.

    Returns:
      A `Dataset` (checkpointable iterators, `batch_size`, `cardinality`) or a `Batches`.

    Raises:
      ValueError, TypeError: bad arrays or batch size (see `Dataset.from_tensor_slices`),
        a batch_size for a source that batches itself, or an unsupported type; arrays or
        foreign batches holding strings or Python objects, which cannot go to the devices
        (`device_batch.check_device_batch`; a phalanx Dataset's batches are checked where
        they reach the devices).

    Example:
      >>> batches = as_batches((x_train, y_train), batch_size=1024, shuffle=True, seed=0)
      >>> batches = as_batches(grain_loader)  # its own batches, checked on arrival
    """
    if isinstance(data, Dataset):
        data._check_device_ready("the dataset's arrays")
        if data.batch_size is None:
            if batch_size is None:
                raise ValueError(
                    "this Dataset yields single examples; call .batch(n) on it or pass "
                    "batch_size=n."
                )
            return _some_batches(data.batch(batch_size, drop_remainder))
        _no_batch_size(batch_size, "a batched Dataset", f"batch({data.batch_size})")
        return _some_batches(data)
    if _is_array_tree(data):
        batch_size = 32 if batch_size is None else batch_size
        validation.check_batch_size(batch_size)
        dataset = Dataset._from_arrays(data, root="x")
        # These batches go to the devices (fit, evaluate, predict): refuse strings now,
        # before anything is traced, rather than at the first step.
        device_batch.check_device_batch(data, "the input arrays", root="x")
        if shuffle:
            dataset = dataset.shuffle(len(dataset), seed=seed)
        return dataset.batch(batch_size, drop_remainder)
    if isinstance(data, str | bytes) or not (
        isinstance(data, Iterable) or callable(getattr(data, "as_numpy_iterator", None))
    ):
        raise TypeError(f"cannot read batches from a {type(data).__name__}; pass {_KINDS}.")
    if _grain_kind(data):
        _no_batch_size(batch_size, "a Grain dataset", ".batch(n)")
        return Batches(data, lambda: iter(data))
    if callable(getattr(data, "as_numpy_iterator", None)):  # tf.data.Dataset
        _no_batch_size(batch_size, "a tf.data dataset", ".batch(n)")
        return Batches(data, data.as_numpy_iterator)
    if _module(data).startswith("torch"):
        _no_batch_size(batch_size, "a torch DataLoader", "DataLoader(..., batch_size=n)")
        return Batches(data, lambda: iter(data), _torch_batch)
    _no_batch_size(batch_size, "an iterable of batches", "batches of n rows")
    return Batches(data, lambda: iter(data))


def _some_batches(dataset: Dataset) -> Dataset:
    """`dataset`, unless it is known to yield no batch: a pipeline may be empty (tf.data's
    rule), a model's input may not."""
    if dataset.cardinality == 0:
        raise ValueError(
            f"the dataset yields no batches ({dataset!r}): e.g. batch({dataset.batch_size}, "
            "drop_remainder=True) of fewer elements, take(0), or a split with no rows. Use a "
            "smaller batch_size or drop_remainder=False, or check the data."
        )
    return dataset


def _no_batch_size(batch_size: int | None, kind: str, fix: str) -> None:
    if batch_size is not None:
        raise ValueError(
            f"batch_size={batch_size} was given for {kind}, which makes its own batches; "
            f"leave batch_size=None and batch the source itself ({fix})."
        )
