"""`Model.optimizer`: the compiled optimizer under the names TF and Keras code reads.

Keras callbacks and TF tutorials read and set `model.optimizer.learning_rate` (a `PrintLR`
callback prints `model.optimizer.learning_rate.numpy()`; a schedule assigns it between
epochs) and read `optimizer.iterations`. In phalanx the optimizer is an optax
transformation and its state lives in the model's engine, so `Model.optimizer` returns this
small view: its `learning_rate` reads and writes the rate stored in the optimizer state
(`optimizers.learning_rate` / `set_learning_rate`), and `iterations` is the number of batches
trained, as Keras counts them (every batch, also under gradient accumulation).

For an `nnx.Optimizer` in a custom loop, which cannot carry these names, the same values are
`phalanx.optimizers.learning_rate(optimizer)`,
`phalanx.optimizers.set_learning_rate(optimizer, value)` and `int(optimizer.step[...])`.

Example:
  >>> model.optimizer.learning_rate.numpy()
  0.001
  >>> model.optimizer.learning_rate = 1e-4         # or .learning_rate.assign(1e-4)
  >>> int(model.optimizer.iterations)
  120
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx._src.train.api import optimizers as optimizers_lib


class LearningRate(float):
    """The learning rate read from an optimizer: a float with `numpy()` and `assign()` as a
    Keras variable has (assigning sets the rate the next steps use)."""

    _write: Callable[[float], None]

    def __new__(cls, value: float, write: Callable[[float], None]) -> LearningRate:
        self = super().__new__(cls, value)
        self._write = write
        return self

    def numpy(self) -> np.float32:
        """The value as a NumPy float32 (the stored dtype), as Keras's `Variable.numpy()`."""
        return np.float32(self)

    def assign(self, value: float) -> None:
        """Sets the optimizer's learning rate (between steps), as `Variable.assign`."""
        self._write(value)


class Iterations(int):
    """The optimizer's step count: an int with `numpy()`, as a Keras variable has."""

    def numpy(self) -> np.int64:
        return np.int64(self)


class OptimizerView:
    """The optimizer of a compiled model, with Keras's `learning_rate` and `iterations`.

    Args:
      read_state: returns the optimizer state (fetched at each access).
      write_state: stores an updated optimizer state.
      iterations: returns the number of batches trained.
      transformation: the optax transformation, for `repr` and `inner`.

    Example:
      >>> view = OptimizerView(lambda: state, store, lambda: 0, tx)
      >>> view.learning_rate = 0.5
    """

    def __init__(
        self,
        read_state: Callable[[], Any],
        write_state: Callable[[Any], None],
        iterations: Callable[[], int],
        transformation: Any = None,
    ) -> None:
        self._read = read_state
        self._write = write_state
        self._iterations = iterations
        self.inner = transformation

    @property
    def learning_rate(self) -> LearningRate:
        """The current learning rate (settable between steps; not for a schedule)."""
        return LearningRate(optimizers_lib.learning_rate(self._read()), self._set)

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._set(value)

    def _set(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise TypeError(
                f"optimizer.learning_rate takes a number, got {value!r} of type "
                f"{type(value).__name__}; e.g. model.optimizer.learning_rate = 1e-4 (a schedule "
                "goes to compile: optimizer=phalanx.optimizers.get('adam', learning_rate=schedule))"
            )
        self._write(optimizers_lib.set_learning_rate(self._read(), float(value)))

    @property
    def iterations(self) -> Iterations:
        """Batches trained so far (Keras's `optimizer.iterations`)."""
        return Iterations(self._iterations())

    def __repr__(self) -> str:
        return f"OptimizerView({self.inner!r})" if self.inner is not None else "OptimizerView()"
