"""`find_batch_size`: the largest per-replica batch whose train step fits in device memory.

The seeds ask for batches that are "the largest that fits". Instead of running steps until
one runs out of memory (slow, and on some runtimes an OOM leaves the device unusable), each
candidate's train step is compiled for the strategy and XLA's memory analysis of the
compiled program says how many bytes one device needs: its arguments (parameters, optimizer
state, the batch shard), outputs not aliased to donated arguments, and temporaries. Only
where a backend gives no analysis is a step actually run. Nothing is ever allocated for the
batch: the candidates are compiled from shapes.

Candidates are multiples of 128 per core on TPUs and GPUs (the seeds' rule: the matrix
units' tile) and of 8 on CPUs; the search doubles until a candidate does not fit, then
bisects between the last that fit and the first that did not.

Memory is not the only limit: a batch as large as the training set gives one step an epoch,
and a few steps learn little (the 1,438 training digits in one batch reach about 0.25 accuracy
after an epoch). Given `dataset_size`, the global batch is capped so that an epoch has at
least `min_steps_per_epoch` (20) steps.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

if TYPE_CHECKING:
    from phalanx._src.train.model import Model

ACCELERATOR_MULTIPLE = 128
CPU_MULTIPLE = 8
MIN_STEPS_PER_EPOCH = 20  # fewer optimizer steps an epoch learn too little per epoch


@dataclasses.dataclass(frozen=True)
class BatchSizeResult:
    """What `find_batch_size` found.

    Attributes:
      per_replica_batch_size: the largest per-replica batch that fits (a multiple of
        `multiple`).
      global_batch_size: that times the number of replicas.
      learning_rate: the linear-scaling learning rate for the global batch
        (`base_learning_rate * global_batch_size / base_batch_size`), or None.
      bytes_per_device: the memory one device needs at that batch (None when measured by
        running a step).
      memory_limit_bytes: the memory budget per device that was used.
      multiple: the rounding unit per replica.
      trials: `(per_replica_batch_size, bytes_per_device or None, fits)` for every candidate,
        in the order tried.
      method: 'memory_analysis' or 'trial' (steps run where no analysis exists).
      capped: True when `max_batch_size` stopped the search (a larger batch may fit).
      dataset_size: the training examples given to the search, or None.
      min_steps_per_epoch: the fewest steps an epoch of `dataset_size` examples may have.
      dataset_capped: True when that limit, not memory, chose the batch.
    """

    per_replica_batch_size: int
    global_batch_size: int
    learning_rate: float | None
    bytes_per_device: int | None
    memory_limit_bytes: int | None
    multiple: int
    trials: tuple[tuple[int, int | None, bool], ...]
    method: str
    capped: bool
    dataset_size: int | None = None
    min_steps_per_epoch: int = MIN_STEPS_PER_EPOCH
    dataset_capped: bool = False

    def summary(self) -> str:
        """One line for logs, e.g. 'batch size finder: 1024 per replica (8192 global) ...'."""
        parts = [
            f"batch size finder: {self.per_replica_batch_size} per replica "
            f"({self.global_batch_size} global)"
        ]
        if self.bytes_per_device is not None and self.memory_limit_bytes:
            parts.append(
                f"needs {self.bytes_per_device / 2**20:.1f} MiB of "
                f"{self.memory_limit_bytes / 2**20:.1f} MiB per device"
            )
        if self.capped:
            parts.append("stopped at max_batch_size")
        if self.dataset_capped:
            parts.append(
                f"capped so that an epoch of {self.dataset_size:,} examples has at least "
                f"{self.min_steps_per_epoch} steps"
            )
        if self.learning_rate is not None:
            parts.append(f"linear-scaling learning rate {self.learning_rate:.3g}")
        return ", ".join(parts)


def device_memory_bytes(device: jax.Device) -> int | None:
    """The memory one device may use: its allocator's limit, or for a CPU device its share
    of the machine's RAM; None when unknown."""
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory stats raise various errors
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu" and hasattr(os, "sysconf"):
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
        return ram // max(1, len(jax.local_devices(backend="cpu")))
    return None


def _example_specs(sample: Any) -> Any:
    """Per-example shape and dtype of every leaf of `sample` (arrays with a leading batch axis)."""
    leaves = jax.tree.leaves(sample)
    if not leaves:
        raise ValueError(f"sample has no arrays, got {type(sample).__name__}; pass (x, y) arrays")
    rows = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
    if None in rows or len(rows) != 1:
        raise ValueError(
            "sample must be arrays with the same number of rows (a leading batch axis), e.g. "
            f"(x_train, y_train); got leading sizes {sorted(map(str, rows))}"
        )
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], np.asarray(a[:1]).dtype), sample
    )


def _batch(model: Model, specs: Any, per_replica: int) -> tuple[Any, Any]:
    """Shapes (no data) of a global batch of `per_replica` rows per replica, and its mask."""
    rows = per_replica * model.strategy.num_replicas_in_sync
    sharding = model.strategy.data_sharding

    def spec(leaf: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((rows, *leaf.shape), leaf.dtype, sharding=sharding)

    batch = jax.tree.map(spec, specs)
    mask = jax.ShapeDtypeStruct((rows,), np.bool_, sharding=sharding)
    return batch, mask


def _is_oom(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


class _Probe:
    """Whether a per-replica batch fits, by memory analysis (or, failing that, a real step)."""

    def __init__(self, model: Model, specs: Any, limit: int | None) -> None:
        self.model = model
        self.specs = specs
        self.limit = limit
        self.method = "memory_analysis"
        self.trials: list[tuple[int, int | None, bool]] = []
        self._step = jax.jit(
            lambda state, batch, mask: model.engine.steps.train(state, batch, mask)
        )

    def bytes_needed(self, per_replica: int) -> int | None:
        batch, mask = _batch(self.model, self.specs, per_replica)
        compiled = self._step.lower(self.model.engine.state, batch, mask).compile()
        stats = compiled.memory_analysis()
        if stats is None:
            return None
        return int(
            stats.argument_size_in_bytes
            + stats.output_size_in_bytes
            - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes
        )

    def _runs(self, per_replica: int) -> bool:
        batch, mask = _batch(self.model, self.specs, per_replica)
        zeros = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype, device=s.sharding), batch)
        ones = jax.numpy.ones(mask.shape, mask.dtype, device=mask.sharding)
        try:
            jax.block_until_ready(self._step(self.model.engine.state, zeros, ones))
        except Exception as error:
            if _is_oom(error):
                return False
            raise
        return True

    def fits(self, per_replica: int) -> bool:
        try:
            needed = self.bytes_needed(per_replica)
        except Exception as error:  # compiling itself can run out of memory
            if not _is_oom(error):
                raise
            self.trials.append((per_replica, None, False))
            return False
        if needed is None or self.limit is None:
            self.method = "trial"
            fits = self._runs(per_replica)
        else:
            fits = needed <= self.limit
        self.trials.append((per_replica, needed, fits))
        return fits


def find_batch_size(
    model: Model,
    sample: Any,
    *,
    memory_limit_bytes: int | None = None,
    headroom: float = 0.9,
    max_batch_size: int = 8192,
    multiple: int | None = None,
    base_learning_rate: float | None = None,
    base_batch_size: int = 128,
    dataset_size: int | None = None,
    min_steps_per_epoch: int = MIN_STEPS_PER_EPOCH,
) -> BatchSizeResult:
    """Finds the largest per-replica batch whose train step fits in one device's memory.

    The model's train step is compiled (not run) for candidate batches, multiples of
    `multiple` per replica: doubling from one multiple until a candidate does not fit, then
    bisecting. XLA's memory analysis of each compiled step decides; a step is run only on
    backends without that analysis. The answer depends only on shapes and the compiler, so it
    is the same on every call.

    With `dataset_size`, the global batch is also capped at `dataset_size //
    min_steps_per_epoch`, rounded down to a multiple of the replica count (and at least one
    example per replica), so that an epoch has at least `min_steps_per_epoch` steps; the cap
    may be below `multiple`, and `dataset_capped` and `summary()` then say so.

    Args:
      model: a compiled `phalanx.Model` (its optimizer, precision and strategy count).
      sample: arrays with a leading batch axis, as `fit` takes them, e.g.
        `(x_train, y_train)`; only their per-example shapes and dtypes are used.
      memory_limit_bytes: the budget per device; default: the device allocator's limit
        (GPU, TPU), or the machine's RAM divided by the local CPU devices.
      headroom: the fraction of the budget a step may use (the runtime and the input
        pipeline need the rest).
      max_batch_size: the largest per-replica batch tried.
      multiple: the rounding unit per replica; default 128 on TPUs and GPUs, 8 on CPUs.
      base_learning_rate: the learning rate known to work at a global batch of
        `base_batch_size`; default: the model's current learning rate, when it has one.
      base_batch_size: the global batch `base_learning_rate` belongs to.
      dataset_size: the number of training examples; None: no cap from the data.
      min_steps_per_epoch: the fewest steps an epoch may have, with `dataset_size`.

    Returns:
      A `BatchSizeResult` (`.per_replica_batch_size`, `.global_batch_size`,
      `.learning_rate`, `.summary()`).

    Raises:
      ValueError: bad arguments, or not even one multiple fits (the message says how much
        memory that needs).

    Example:
      >>> with strategy.scope():
      ...     model = phalanx.Model(MLP(rngs=nnx.Rngs(0)))
      ...     model.compile("adam", "sparse_categorical_crossentropy")
      >>> found = phalanx.tune.find_batch_size(
      ...     model, (x_train, y_train), dataset_size=len(x_train))
      >>> model.fit(x_train, y_train, batch_size=found.global_batch_size)
    """
    if not getattr(model, "compiled", False):
        raise ValueError("find_batch_size needs a compiled model: call model.compile(...) first")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom!r}; e.g. headroom=0.9")
    device = model.strategy.devices[0]
    if multiple is None:
        multiple = CPU_MULTIPLE if device.platform == "cpu" else ACCELERATOR_MULTIPLE
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"multiple must be a positive int, got {multiple!r}")
    if max_batch_size < multiple:
        raise ValueError(
            f"max_batch_size {max_batch_size} is below one multiple ({multiple}); raise it"
        )
    replicas = model.strategy.num_replicas_in_sync
    cap = _per_replica_cap(dataset_size, min_steps_per_epoch, replicas)
    limit = memory_limit_bytes if memory_limit_bytes is not None else device_memory_bytes(device)
    budget = None if limit is None else int(limit * headroom)
    probe = _Probe(model, _example_specs(sample), budget)
    top = max_batch_size // multiple  # candidates are size(n), n in 1..top
    if cap is not None:
        top = min(top, -(-cap // multiple))  # the first multiple at or above the cap

    def size(n: int) -> int:
        return n * multiple if cap is None else min(n * multiple, cap)

    if not probe.fits(size(1)):
        needed = probe.trials[-1][1]
        raise ValueError(
            f"not even {size(1)} examples per replica fit: the step needs "
            f"{'?' if needed is None else needed} bytes per device, the budget is {budget} "
            f"({headroom:.0%} of {limit}); use a smaller model, a 'mixed_bfloat16' policy, or "
            "pass a smaller multiple="
        )
    good, bad = 1, None
    while bad is None and good < top:  # doubling
        n = min(2 * good, top)
        if probe.fits(size(n)):
            good = n
        else:
            bad = n
    while bad is not None and bad - good > 1:  # bisection in units of `multiple`
        middle = (good + bad) // 2
        if probe.fits(size(middle)):
            good = middle
        else:
            bad = middle
    per_replica = size(good)
    global_batch = per_replica * replicas
    dataset_capped = bad is None and per_replica == cap
    if base_learning_rate is None:
        try:
            base_learning_rate = float(model.learning_rate)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            base_learning_rate = None
    rate = None
    if base_learning_rate is not None:
        rate = base_learning_rate * global_batch / base_batch_size
    bytes_at = {b: needed for b, needed, _ in probe.trials}
    return BatchSizeResult(
        per_replica_batch_size=per_replica,
        global_batch_size=global_batch,
        learning_rate=rate,
        bytes_per_device=bytes_at.get(per_replica),
        memory_limit_bytes=budget,
        multiple=multiple,
        trials=tuple(probe.trials),
        method=probe.method,
        capped=bad is None and not dataset_capped,
        dataset_size=dataset_size,
        min_steps_per_epoch=min_steps_per_epoch,
        dataset_capped=dataset_capped,
    )


def _per_replica_cap(dataset_size: int | None, min_steps: int, replicas: int) -> int | None:
    """The largest per-replica batch that leaves `min_steps` steps an epoch, or None.

    Example:
      >>> _per_replica_cap(1438, 20, 2)   # 1438 // 20 = 71 -> 70 global, 35 per replica
      35
    """
    if dataset_size is None:
        return None
    for value, name in ((dataset_size, "dataset_size"), (min_steps, "min_steps_per_epoch")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return max(1, dataset_size // min_steps // replicas)
