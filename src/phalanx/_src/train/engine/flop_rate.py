"""The model's FLOP rate and MFU (model FLOPs utilisation) in fit's epoch logs.

The FLOPs of one training step come from XLA's cost analysis (`HloCostAnalysis`) of the
train step as it is lowered for the strategy: forward, backward and optimizer update, for
one global batch, counted once per step whatever `steps_per_execution` is (a K-step call
holds K single steps; XLA's analysis of a loop would count its body once, so the single
step is analysed). It is the analysis of the step before XLA's optimisation passes, which
needs no second compilation (a full compile of a large step takes seconds to minutes);
those passes fuse elementwise work but keep the matrix products that dominate the count.

`mfu` divides the rate by the peak of the strategy's devices for the policy's compute dtype,
from `PEAK_TFLOPS`; it is absent where the device's peak is not in the table (CPUs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax

from phalanx._src.data.iterator import take

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine

TFLOPS_KEY = "model_tflops_per_second"
MFU_KEY = "mfu"
_CACHE_KEY = "flops_per_step"

# Dense peak TFLOP/s per device (one TPU chip, one GPU), by `device.device_kind` pattern,
# first match wins. "float32" is the rate float32 matrix products run at under JAX's default
# matmul precision: one bfloat16 pass on TPUs (so the bfloat16 peak) and TensorFloat-32 on
# NVIDIA Ampere and later GPUs (so the TF32 tensor-core peak).
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # TPU v4: 275 bf16 TFLOPS per chip. https://cloud.google.com/tpu/docs/v4
    (r"tpu v4", {"bfloat16": 275.0, "float32": 275.0}),
    # TPU v5e ("TPU v5 lite"): 197 bf16 TFLOPS per chip. https://cloud.google.com/tpu/docs/v5e
    (r"tpu v5 ?(lite|e)", {"bfloat16": 197.0, "float32": 197.0}),
    # TPU v5p ("TPU v5"): 459 bf16 TFLOPS per chip. https://cloud.google.com/tpu/docs/v5p
    (r"tpu v5p?$", {"bfloat16": 459.0, "float32": 459.0}),
    # TPU v6e Trillium ("TPU v6 lite"): 918 bf16 TFLOPS per chip.
    # https://cloud.google.com/tpu/docs/v6e
    (r"tpu v6 ?(lite|e)", {"bfloat16": 918.0, "float32": 918.0}),
    # H100 PCIe: 756 bf16 / 378 TF32 dense (the datasheet's figures are with sparsity, 2x).
    # https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    (r"h100 pcie", {"bfloat16": 756.0, "float32": 378.0}),
    # H100 NVL: 835 bf16 / 418 TF32 dense (same datasheet).
    (r"h100 nvl", {"bfloat16": 835.0, "float32": 418.0}),
    # H100 SXM: 989 bf16 / 495 TF32 dense (same datasheet).
    (r"h100", {"bfloat16": 989.0, "float32": 495.0}),
    # H200 NVL: 835 bf16 / 418 TF32 dense. https://www.nvidia.com/en-us/data-center/h200/
    (r"h200 nvl", {"bfloat16": 835.0, "float32": 418.0}),
    # H200 SXM: 989 bf16 / 495 TF32 dense (same page).
    (r"h200", {"bfloat16": 989.0, "float32": 495.0}),
    # A100 (SXM and PCIe, 40 and 80 GB): 312 bf16 / 156 TF32 dense.
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    (r"a100", {"bfloat16": 312.0, "float32": 156.0}),
)


def peak_tflops(device_kind: str, dtype: Any = "float32") -> float | None:
    """Dense peak TFLOP/s of one device of `device_kind` for `dtype`, or None if unknown.

    Args:
      device_kind: `jax.Device.device_kind`, e.g. 'TPU v5 lite' or 'NVIDIA H100 80GB HBM3'.
      dtype: the compute dtype; float16 counts as bfloat16 (same tensor-core rate).

    Example:
      >>> peak_tflops("TPU v4", "bfloat16"), peak_tflops("cpu")
      (275.0, None)
    """
    # A dtype ('float32', np.dtype) or a scalar type (jnp.bfloat16, whose `.dtype` names it).
    name = getattr(dtype, "name", None) or getattr(getattr(dtype, "dtype", None), "name", dtype)
    name = str(name)
    name = "bfloat16" if name in ("bfloat16", "float16") else "float32"
    kind = device_kind.lower().strip()
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, kind):
            return peaks.get(name)
    return None


def step_flops(engine: Engine, host_batch: Any, source: Any = None) -> float | None:
    """FLOPs of one training step on `host_batch`'s global batch (cached on the engine).

    Args:
      engine: a compiled model's `Engine`.
      host_batch: one process-local host batch as the loop receives it (row numbers when
        `source` is given).
      source: the on-device arrays that row-number batches index into, or None.

    Returns:
      The step's FLOPs over all replicas, or None when XLA gives no estimate.
    """
    cached = engine.cache.get(_CACHE_KEY)
    if cached is not None:
        return cached or None
    from phalanx._src.strategy.distribute import BatchDistributor

    batch, mask = BatchDistributor(engine.strategy, pad_at_end=True).arrays(host_batch)
    train = engine.steps.train

    def step(state: Any, source: Any, batch: Any, mask: Any) -> Any:
        if source is not None:
            batch = jax.tree.map(lambda a: a[batch], source)
        return train(state, batch, mask)

    # The on-device arrays go in as an argument: closed over, they would be embedded in the
    # program as a constant (a 188 MB dataset: ~3.9 s and ~900 MB to convert, issue 23).
    try:
        cost = jax.jit(step).lower(engine.state, source, batch, mask).cost_analysis()
    except Exception:  # an estimate must never break training; some backends have none
        cost = None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    flops = float(cost.get("flops", 0.0)) if cost else 0.0
    engine.cache[_CACHE_KEY] = flops  # 0.0 remembers "no estimate"
    return flops or None


class FirstBatch:
    """Passes an iterator through unchanged, keeping its first item (for `step_flops`)."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator
        self.first: Any = None

    def __iter__(self) -> FirstBatch:
        return self

    def __next__(self) -> Any:
        item = next(self._iterator)
        if self.first is None:
            self.first = item
        return item

    def next_many(self, count: int) -> list[Any]:
        items = take(self._iterator, count)
        if self.first is None and items:
            self.first = items[0]
        return items

    def __getattr__(self, name: str) -> Any:  # get_state, set_state, close, checkpointable
        return getattr(self._iterator, name)


def watch(engine: Engine, iterator: Iterator[Any]) -> Iterator[Any]:
    """`iterator`, wrapped to keep its first batch while the model's FLOPs are unknown."""
    if _CACHE_KEY in engine.cache or isinstance(iterator, FirstBatch):
        return iterator
    return FirstBatch(iterator)


def epoch_logs(
    engine: Engine, iterator: Iterator[Any], steps: int, seconds: float, source: Any = None
) -> dict[str, float]:
    """`{model_tflops_per_second, mfu}` for an epoch of `steps` steps in `seconds`.

    `mfu` is present only where the devices' peak is known (see `PEAK_TFLOPS`); nothing is
    returned when the FLOPs cannot be estimated or no step ran.
    """
    flops = engine.cache.get(_CACHE_KEY)
    if flops is None and isinstance(iterator, FirstBatch) and iterator.first is not None:
        flops = step_flops(engine, iterator.first, source)
    if not flops or steps <= 0 or seconds <= 0:
        return {}
    rate = flops * steps / seconds / 1e12
    logs = {TFLOPS_KEY: rate}
    devices = engine.strategy.devices
    policy = engine.policy
    peak = peak_tflops(devices[0].device_kind, getattr(policy, "compute_dtype", "float32"))
    if peak:
        logs[MFU_KEY] = rate / (peak * len(devices))
    return logs
