"""The model's FLOP rate and MFU (model FLOPs utilisation) in fit's epoch logs.

The FLOPs of one training step come from XLA's cost analysis (`HloCostAnalysis`) of the
train call fit already compiled: forward, backward and optimizer update, counted once per
step whatever `steps_per_execution` is (XLA's analysis of a loop counts its body once, so
a K-step `lax.scan` call gives one step's count). It is taken right after fit's first
training call (`count`): `lower(...).compile()` finds the call's trace, lowering and
executable in JAX's caches, so the count costs about a millisecond and no memory, with no
second trace (a new trace that closed over device-resident data embedded the dataset in
the program as a constant: ~3.9 s and ~900 MB for 188 MB, issue 23). Analysing the
lowered program instead takes 40-200 ms and is not implemented on PJRT plugin backends.

The compiled program is one device's: its share of the batch, and whatever every device
runs whole (the optimizer update of a replicated state). The count is that times the
devices, what they run together; against the whole step analysed once, it adds the
replicated update's FLOPs once per extra device (2 % for the 784-128-10 MLP at 1,024
rows on 8 devices; nothing on one device).

`mfu` divides the rate by the peak of the strategy's devices for the policy's compute dtype,
from `PEAK_TFLOPS`; it is absent where the device's peak is not in the table (CPUs).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

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


def known(engine: Engine) -> bool:
    """Whether the model's step FLOPs were counted (or found uncountable) since `build`."""
    return _CACHE_KEY in engine.cache


def count(engine: Engine, call: Any, args: tuple) -> None:
    """Counts the FLOPs of one training step from `call`, a train call that just ran on
    `args` (cached on the engine until the next `build`).

    `call(*args)` already traced, lowered and compiled the call; `lower(*args).compile()`
    finds all three in JAX's caches (args donated since then still carry their shapes).
    """
    try:
        cost = call.lower(*args).compile().cost_analysis()
    except Exception:  # an estimate must never break training; some backends have none
        cost = None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    flops = float(cost.get("flops", 0.0)) if cost else 0.0
    devices = len(engine.strategy.devices)  # the program is one device's share
    engine.cache[_CACHE_KEY] = max(flops, 0.0) * devices  # 0.0 remembers "no estimate"


def epoch_logs(engine: Engine, steps: int, seconds: float) -> dict[str, float]:
    """`{model_tflops_per_second, mfu}` for an epoch of `steps` steps in `seconds`.

    `mfu` is present only where the devices' peak is known (see `PEAK_TFLOPS`); nothing is
    returned when the FLOPs cannot be estimated or no step ran.
    """
    flops = engine.cache.get(_CACHE_KEY)
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
