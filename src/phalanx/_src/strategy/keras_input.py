"""phalanx datasets as input of plain Keras 3: `keras_model.fit(phalanx_dataset)`.

tf.keras reads a `tf.data.Dataset` directly; Keras 3 reads what
`keras.src.trainers.data_adapters.get_data_adapter` accepts, and the first thing it accepts
is an instance of its `DataAdapter` class, returned as is ("a custom data adapter"). So a
`phalanx.data.Dataset` (and a distributed dataset, through the dataset it distributes) is a
`KerasInput`: once Keras is imported, `KerasInput`'s base becomes a class derived from
Keras's `DataAdapter` that answers the adapter's questions (`num_batches` from the
cardinality, `batch_size`, a new NumPy iterator per epoch). Keras itself is untouched, and
phalanx never imports it: the base is swapped the first time a dataset is made after
`import keras` (`install`), so a program that imports keras and then builds its datasets,
as every Keras program does, passes them to `fit`, `evaluate` and `predict` as it would
pass a tf.data dataset to tf.keras.

Example:
  >>> ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(32)
  >>> keras_model.evaluate(ds)   # plain Keras 3, JAX backend: every batch once
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

_INSTALLED = False


class _Unset:
    """`KerasInput`'s base until Keras is imported (then a Keras `DataAdapter`)."""


class KerasInput(_Unset):
    """A dataset plain Keras 3 takes as `x`; see the module doc.

    Subclasses implement `_keras_batches()`, the phalanx dataset whose batches Keras reads.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        install()
        return object.__new__(cls)

    def _keras_batches(self) -> Any:
        return self

    def _keras_checked(self) -> Any:
        dataset = self._keras_batches()
        if dataset is None:
            raise ValueError(
                f"Keras was given {self!r}, which holds no phalanx.data.Dataset to read (it "
                "was distributed from a function or another iterable). Pass the "
                "phalanx.data.Dataset itself, batched, e.g. keras_model.evaluate(dataset)"
            )
        if dataset.batch_size is None:
            raise ValueError(
                f"Keras was given {self!r}, whose elements are not batches: Keras's fit, "
                "evaluate and predict read one batch per step. Batch the dataset first, "
                "e.g. dataset.batch(32), as with tf.data"
            )
        return dataset

    # Keras's DataAdapter protocol (keras/src/trainers/data_adapters/data_adapter.py).
    def get_numpy_iterator(self) -> Iterator[Any]:
        """A new epoch of the dataset's batches (NumPy pytrees), as Keras iterates them."""
        return iter(self._keras_checked())

    def get_jax_iterator(self) -> Iterator[Any]:
        """The same batches: NumPy arrays are what Keras's JAX trainer prefers."""
        return self.get_numpy_iterator()

    def get_tf_dataset(self) -> Any:
        raise NotImplementedError(_backend_error("tensorflow"))

    def get_torch_dataloader(self) -> Any:
        raise NotImplementedError(_backend_error("torch"))

    @property
    def batch_size(self) -> int | None:
        """Rows per batch (a `Dataset`'s own property answers for it)."""
        return self._keras_checked().batch_size

    @property
    def num_batches(self) -> int | None:
        """Batches per epoch, or None when infinite or unknown (Keras then needs `steps`)."""
        cardinality = self._keras_checked().cardinality
        if cardinality < 0 or math.isinf(cardinality):
            return None
        return int(cardinality)

    @property
    def has_partial_batch(self) -> bool | None:
        return None  # as Keras's tf.data adapter: the last batch's size is read when it comes

    @property
    def partial_batch_size(self) -> int | None:
        return None

    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass


def _backend_error(backend: str) -> str:
    return (
        f"a phalanx dataset feeds plain Keras on the JAX backend; Keras's {backend!r} backend "
        "asked for its own dataset type. Set KERAS_BACKEND=jax before keras is first imported"
    )


def install() -> None:
    """Makes `KerasInput` a Keras `DataAdapter` if Keras is imported (once; cheap after)."""
    global _INSTALLED
    if _INSTALLED or "keras" not in sys.modules:
        return
    try:
        from keras.src.trainers.data_adapters.data_adapter import DataAdapter
    except ImportError:  # Keras 2 / tf.keras: no adapter protocol to join
        return

    class KerasDataAdapter(DataAdapter):
        """Keras's adapter base under phalanx's `KerasInput` (its methods answer)."""

    # `__bases__` of a class whose base is a plain class may be reassigned (same layout);
    # the classes of phalanx's datasets stay the same objects, so pickling is unchanged.
    KerasInput.__bases__ = (KerasDataAdapter,)
    _INSTALLED = True
