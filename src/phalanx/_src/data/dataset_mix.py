"""`Dataset`'s mixing and counting sources: choose_from_datasets, sample_from_datasets,
`Dataset.random` and `Dataset.counter` (see `mix_ops`).

Mixed into `Dataset`. The random ones draw from a seed; when none is given one is drawn
from NumPy's global generator (as a shuffle's default seed in `fit`: `seeds`), and recorded
in iterator states, so a restored iterator draws alike. With several processes, process 0's
draw is broadcast to all: every process must then build the dataset, as SPMD programs do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from phalanx._src.data import mix_ops, plan
from phalanx._src.data.seeds import default_seed


def _seed(seed: int | None, op: str) -> int:
    if seed is None:
        return default_seed()
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}; e.g. {op}")
    return int(seed)


def _datasets(datasets: Any, op: str) -> list[Any]:
    datasets = list(datasets) if isinstance(datasets, list | tuple) else None
    if not datasets or not all(isinstance(getattr(d, "_node", None), plan.Node) for d in datasets):
        raise TypeError(f"{op} takes a non-empty list of phalanx.data.Dataset objects")
    return datasets


class DatasetMix:
    """Mixed into `Dataset`; see the module docstring."""

    @staticmethod
    def choose_from_datasets(
        datasets: Sequence[Any], choice_dataset: Any, stop_on_empty_dataset: bool = True
    ) -> Any:
        """Element i is the next element of `datasets[choice_dataset[i]]`, as tf.data's.

        Args:
          datasets: the inputs, with elements of one structure.
          choice_dataset: a dataset of scalar integers in `[0, len(datasets))`.
          stop_on_empty_dataset: stop when a chosen input has ended (default, as tf.data);
            False passes over the later choices of an ended input.

        Raises:
          TypeError: inputs that are not phalanx datasets.
          ValueError (while iterating): a choice out of range.

        Example:
          >>> choice = Dataset.range(2).repeat(3)                 # 0, 1, 0, 1, 0, 1
          >>> Dataset.choose_from_datasets([cats, dogs], choice)  # cat, dog, cat, ...
        """
        inputs = _datasets(datasets, "choose_from_datasets")
        if not isinstance(getattr(choice_dataset, "_node", None), plan.Node):
            raise TypeError(
                f"choose_from_datasets' choice_dataset must be a phalanx.data.Dataset of "
                f"indices, got {type(choice_dataset).__name__}"
            )
        parents = (choice_dataset._node, *(d._node for d in inputs))
        return inputs[0]._then(mix_ops.Choose(parents, bool(stop_on_empty_dataset)))

    @staticmethod
    def sample_from_datasets(
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        seed: int | None = None,
        stop_on_empty_dataset: bool = False,
        rerandomize_each_iteration: bool | None = None,
    ) -> Any:
        """Each element from an input drawn at random with `weights`, as tf.data's.

        The draws are a pure function of the seed and the element's position (and the
        epoch, with `rerandomize_each_iteration`), so a mix is reproducible and an iterator
        restores exactly; the values drawn differ from tf.data's for the same seed.

        Args:
          datasets: the inputs, with elements of one structure.
          weights: one non-negative weight per input (default: equal); normalized.
          seed: the draws' seed; None draws one, the same on every process (every process
            must then build the dataset: process 0's draw is broadcast).
          stop_on_empty_dataset: stop at the first input that ends; by default (as tf.data)
            an ended input is passed over and the others go on.
          rerandomize_each_iteration: draw anew every epoch (default False: the same mix).

        Example:
          >>> Dataset.sample_from_datasets([english, french], weights=[0.8, 0.2], seed=0)
        """
        inputs = _datasets(datasets, "sample_from_datasets")
        if weights is None:
            weights = [1.0] * len(inputs)
        if isinstance(getattr(weights, "_node", None), plan.Node):
            raise TypeError(
                "sample_from_datasets takes weights as a list of numbers; a dataset of "
                "weights (tf.data's time-varying form) is not supported"
            )
        weights = tuple(float(w) for w in weights)
        if len(weights) != len(inputs) or min(weights) < 0 or not math.fsum(weights) > 0:
            raise ValueError(
                f"sample_from_datasets needs one weight >= 0 per dataset ({len(inputs)}), not "
                f"all 0; got {list(weights)}"
            )
        choice = mix_ops.Categorical(
            weights,
            _seed(seed, "sample_from_datasets(datasets, seed=0)"),
            bool(rerandomize_each_iteration),
        )
        parents = (choice, *(d._node for d in inputs))
        return inputs[0]._then(mix_ops.Choose(parents, bool(stop_on_empty_dataset)))

    @classmethod
    def random(cls, seed: int | None = None, rerandomize_each_iteration: bool | None = None) -> Any:
        """Random int64 values in [0, 2**32), forever, as tf.data's `Dataset.random`.

        The same values every epoch unless `rerandomize_each_iteration`; they differ from
        tf.data's for the same seed.

        Example:
          >>> coins = Dataset.random(seed=0).map(lambda v: v % 2)
        """
        seed = _seed(seed, "Dataset.random(seed=0)")
        return cls(mix_ops.Random(seed, bool(rerandomize_each_iteration)))  # type: ignore[call-arg]

    @classmethod
    def counter(cls, start: int = 0, step: int = 1, dtype: Any = np.int64) -> Any:
        """`start`, `start + step`, ... forever, as tf.data's `Dataset.counter`.

        Example:
          >>> Dataset.zip(Dataset.counter(), ds)   # like ds.enumerate()
        """
        for name, value in (("start", start), ("step", step)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"counter's {name} must be an integer, got {value!r}")
        return cls(mix_ops.Counter(int(start), int(step), np.dtype(dtype)))  # type: ignore[call-arg]
