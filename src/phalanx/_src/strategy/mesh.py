"""The strategy's device mesh: `data` alone, or `data x model` for model parallelism.

`Strategy(model_parallel=M)` lays `N` devices out as `N/M` data-parallel replicas of `M`
devices each. A replica's `M` devices (its model group) are consecutive devices of one
process, so the collectives inside a layer (the model axis: every matmul of a split layer)
stay on one host's fast links, and only the gradient all-reduce (the data axis) crosses
hosts, as Megatron and MaxText lay out tensor parallelism. On one process of GPUs or TPUs the
order comes from `jax.experimental.mesh_utils.create_device_mesh`, which follows the physical
topology (ICI rings, NVLink islands).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

MODEL_AXIS = "model"


def check_model_parallel(model_parallel: Any, devices: Sequence[Any]) -> int:
    """`model_parallel`, validated against the devices.

    Raises:
      ValueError: unless `model_parallel` is a positive int that divides the device count
        and every process's share of the devices (a model group never spans processes).

    Example:
      >>> check_model_parallel(2, jax.devices())   # 8 devices
      2
    """
    if isinstance(model_parallel, bool) or not isinstance(model_parallel, int | np.integer):
        raise ValueError(
            f"model_parallel must be a positive int (devices per model group), got "
            f"{model_parallel!r}; e.g. Strategy(model_parallel=2)"
        )
    m = int(model_parallel)
    if m < 1:
        raise ValueError(f"model_parallel must be at least 1, got {m}")
    n = len(devices)
    if n % m:
        raise ValueError(
            f"model_parallel={m} must divide the device count, {n}: the devices form "
            f"{n}/{m} data-parallel replicas of {m} devices each. Use one of "
            f"{[d for d in range(1, n + 1) if n % d == 0]}"
        )
    per_process: dict[int, int] = {}
    for device in devices:
        per_process[device.process_index] = per_process.get(device.process_index, 0) + 1
    uneven = {p: c for p, c in per_process.items() if c % m}
    if uneven:
        raise ValueError(
            f"model_parallel={m} must divide each process's devices, so that a model group "
            f"never spans processes; devices per process: {per_process}. Use a "
            f"model_parallel that divides {min(per_process.values())}"
        )
    return m


def device_grid(devices: Sequence[Any], model_parallel: int) -> np.ndarray:
    """The devices as a `(N / M, M)` grid: row r is replica r's model group.

    Example:
      >>> device_grid(jax.devices(), 2).shape      # 8 devices
      (4, 2)
    """
    n, m = len(devices), model_parallel
    whole = m > 1 and jax.process_count() == 1 and list(devices) == jax.devices()
    if whole and devices[0].platform in ("gpu", "tpu"):
        from jax.experimental import mesh_utils

        return mesh_utils.create_device_mesh((n // m, m), devices=list(devices))
    # Consecutive devices of one process form a group (`check_model_parallel` made each
    # process's count a multiple of M), processes in the order given.
    return np.array(devices, dtype=object).reshape(n // m, m)


def build_mesh(devices: Sequence[Any], axis_name: str, model_parallel: int) -> Mesh:
    """A 1-D `data` mesh, or with `model_parallel > 1` a 2-D `(data, model)` one; Auto axes
    (XLA places the collectives; stack-facts section 1).

    Example:
      >>> build_mesh(jax.devices(), "data", 2).shape
      {'data': 4, 'model': 2}
    """
    if model_parallel == 1:
        return Mesh(np.array(devices), (axis_name,), axis_types=(AxisType.Auto,))
    grid = device_grid(devices, model_parallel)
    return Mesh(grid, (axis_name, MODEL_AXIS), axis_types=(AxisType.Auto, AxisType.Auto))
