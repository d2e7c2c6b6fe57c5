"""tf.data's `Options`, `AutoShardPolicy` and `TensorSpec`, as phalanx honours them.

What each option does here:

- `autotune.enabled` (True): False makes AUTOTUNE use the most workers without measuring.
- `threading.private_threadpool_size` (0: the CPU count): the most workers AUTOTUNE tries.
- `deterministic` / `experimental_deterministic`: accepted; phalanx pipelines are always
  deterministic (elements come back in order, whatever computes them).
- `experimental_max_open_files` (64; phalanx's own): the most record files a pipeline keeps
  open at once, in the main process and in each worker process (the least recently read
  are closed and reopened when needed: see `records/open_files.py`).
- `experimental_distribute.auto_shard_policy`: for a pipeline over TFRecord files
  (`TFRecordDataset`), as tf.data: AUTO gives each process its files when there are at
  least as many files as processes, else its records; FILE and DATA force one; OFF reads
  every record on every process (see `records/record_files.py`). Any other pipeline is never
  sharded by files or elements: every process builds the same pipeline and keeps only its
  own rows of each global batch (`Dataset.process_split`, which fit and
  `experimental_distribute_dataset` apply), so the global batches are those of one
  process, whatever the process count. That is what DATA gives in tf.data, without each
  process decoding the other processes' rows; OFF does not make every process train on
  the same rows. To shard by hand, use `shard()` inside
  `distribute_datasets_from_function`'s input function.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

import jax
import numpy as np

from phalanx._src.strategy.device_batch import host_array


class AutoShardPolicy(enum.IntEnum):
    """tf.data.experimental.AutoShardPolicy; see the module docstring for what each does."""

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


class _Group:
    """A group of options that refuses names tf.data does not have (as tf.data does)."""

    _fields: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        for name, default in self._fields.items():
            object.__setattr__(self, name, default)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._fields:
            raise AttributeError(
                f"{type(self).__name__} has no option {name!r}; the options are "
                f"{sorted(self._fields)}"
            )
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(self) == vars(other)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({body})"


class DistributeOptions(_Group):
    """`options.experimental_distribute`: `auto_shard_policy`, `num_devices`."""

    _fields: ClassVar[dict[str, Any]] = {
        "auto_shard_policy": AutoShardPolicy.AUTO,
        "num_devices": None,
    }

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "auto_shard_policy":
            try:
                value = AutoShardPolicy(value)
            except ValueError:
                raise ValueError(
                    f"auto_shard_policy must be an AutoShardPolicy (OFF, AUTO, FILE, DATA, "
                    f"HINT), got {value!r}"
                ) from None
        super().__setattr__(name, value)


class AutotuneOptions(_Group):
    """`options.autotune`: `enabled`, `cpu_budget`, `ram_budget`."""

    _fields: ClassVar[dict[str, Any]] = {"enabled": True, "cpu_budget": None, "ram_budget": None}


class ThreadingOptions(_Group):
    """`options.threading`: `private_threadpool_size`, `max_intra_op_parallelism`."""

    _fields: ClassVar[dict[str, Any]] = {
        "private_threadpool_size": 0,
        "max_intra_op_parallelism": None,
    }


class OptimizationOptions(_Group):
    """`options.experimental_optimization`: accepted, none changes a phalanx pipeline."""

    _fields: ClassVar[dict[str, Any]] = {
        "apply_default_optimizations": None,
        "map_and_batch_fusion": None,
        "map_parallelization": None,
        "parallel_batch": None,
        "noop_elimination": None,
    }


class Options(_Group):
    """tf.data.Options: set attributes, then `dataset.with_options(options)`.

    Example:
      >>> options = Options()
      >>> options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
      >>> dataset = dataset.with_options(options)
    """

    _fields: ClassVar[dict[str, Any]] = {
        "deterministic": None,
        "experimental_deterministic": None,
        "experimental_slack": False,
        "experimental_external_state_policy": None,
        "experimental_symbolic_checkpoint": None,
        "experimental_max_open_files": 64,
    }

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "experimental_distribute", DistributeOptions())
        object.__setattr__(self, "autotune", AutotuneOptions())
        object.__setattr__(self, "threading", ThreadingOptions())
        object.__setattr__(self, "experimental_optimization", OptimizationOptions())

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "experimental_max_open_files" and (
            isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1
        ):
            raise ValueError(
                f"experimental_max_open_files must be an int >= 1 (files open at once), got "
                f"{value!r}; e.g. options.experimental_max_open_files = 256"
            )
        super().__setattr__(name, value)

    def merge(self, other: Options) -> Options:
        """These options with every option `other` set (not at its default) taking over."""
        merged = Options()
        for source in (self, other):
            for name, value in vars(source).items():
                if isinstance(value, _Group):
                    group = getattr(merged, name)
                    for key, v in vars(value).items():
                        if v != value._fields[key]:
                            setattr(group, key, v)
                elif value != self._fields[name]:
                    setattr(merged, name, value)
        return merged


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of one leaf of an element, as tf.TensorSpec (None: any size).

    Example:
      >>> TensorSpec(shape=(None, 4), dtype=np.float32)
    """

    shape: tuple[int | None, ...] | None  # None: any rank
    dtype: Any = np.float32
    name: str | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            try:
                shape = tuple(None if d is None or d == -1 else int(d) for d in self.shape)
            except TypeError:
                raise TypeError(
                    f"shape must be a tuple of ints (None for any size), or None for any rank; "
                    f"got {self.shape!r}"
                ) from None
            object.__setattr__(self, "shape", shape)
        dtype = np.dtype(self.dtype)
        # Strings live in object arrays on the host (`device_batch.host_array`), so `str`,
        # `bytes` and NumPy's `U`/`S` all name the one string dtype, as tf.string does.
        object.__setattr__(self, "dtype", np.dtype(object) if dtype.kind in "US" else dtype)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether an array (or another TensorSpec) has this rank, these sizes and dtype."""
        shape, dtype = (value.shape, value.dtype) if hasattr(value, "shape") else ((), None)
        if dtype is None or np.dtype(dtype) != self.dtype:
            return False
        if self.shape is None or shape is None:
            return True
        if len(shape) != len(self.shape):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self.shape, shape, strict=True))


def spec_of(value: Any, batched_unknown: bool = False) -> TensorSpec:
    """The TensorSpec of an array; with `batched_unknown`, its first dimension is None.

    A string leaf (a Python str or bytes, or a batch of them) has dtype object, as the
    host pipeline holds it (`device_batch.host_array`).
    """
    array = host_array(value)
    shape = tuple(array.shape)
    if batched_unknown and shape:
        shape = (None, *shape[1:])
    return TensorSpec(shape, array.dtype)


def check_signature(signature: Any, element: Any) -> Any:
    """`element` converted to `signature`'s dtypes, or a ValueError naming the mismatch."""
    specs, treedef = jax.tree.flatten(signature, is_leaf=lambda s: isinstance(s, TensorSpec))
    try:
        leaves = treedef.flatten_up_to(element)
    except (ValueError, TypeError):
        raise ValueError(
            f"the generator yielded {element!r}, whose structure does not match "
            f"output_signature {signature!r}"
        ) from None
    out = []
    for spec, leaf in zip(specs, leaves, strict=True):
        array = host_array(leaf)
        if np.can_cast(array.dtype, spec.dtype, "same_kind"):
            array = array.astype(spec.dtype, copy=False)
        if not spec.is_compatible_with(array):
            raise ValueError(
                f"the generator yielded an array of shape {array.shape} and dtype "
                f"{array.dtype} where output_signature says {spec}"
            )
        out.append(array)
    return treedef.unflatten(out)
