"""What the resolved hardware looks like, as one frozen record."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from phalanx._src.cluster.platforms import PlatformChoice


@dataclasses.dataclass(frozen=True)
class Topology:
    """The platform, devices and processes this program runs on.

    A default data-parallel strategy has one replica per device, i.e. `global_device_count`.

    Attributes:
      platform: "tpu", "gpu" or "cpu".
      device_kind: the devices' model as JAX names it, e.g. "TPU v5 lite", "NVIDIA H100", "cpu".
      process_index: this process's index in [0, process_count).
      process_count: processes in the job (hosts, usually).
      local_device_count: devices attached to this process.
      global_device_count: devices over all processes.
      memory_per_device_bytes: memory of one device, or None where JAX does not say (CPU).
      cluster_env: what started the processes ("phalanx", "slurm", "arguments", ...), or None
        for a single process.
      platform_choice: how the platform was picked, or None when built by hand.

    Example:
      >>> topo = phalanx.cluster.resolve()
      >>> print(topo.summary())
      cpu x8 (cpu): process 0 of 1, 8 local / 8 global devices, memory per device unknown
    """

    platform: str
    device_kind: str
    process_index: int
    process_count: int
    local_device_count: int
    global_device_count: int
    memory_per_device_bytes: int | None
    cluster_env: str | None = None
    platform_choice: PlatformChoice | None = None

    @property
    def multi_process(self) -> bool:
        """True when more than one process takes part."""
        return self.process_count > 1

    def summary(self) -> str:
        """Return a one-line description, e.g. for logs."""
        if self.memory_per_device_bytes is None:
            memory = "memory per device unknown"
        else:
            memory = f"{self.memory_per_device_bytes / 2**30:.1f} GiB per device"
        return (
            f"{self.platform} x{self.global_device_count} ({self.device_kind}): "
            f"process {self.process_index} of {self.process_count}, "
            f"{self.local_device_count} local / {self.global_device_count} global devices, {memory}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the topology as JSON-ready values (the platform choice nested)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["platform_choice"] = self.platform_choice.to_dict() if self.platform_choice else None
        out["multi_process"] = self.multi_process
        return out


def memory_bytes(device: Any) -> int | None:
    """Return a device's memory limit from `memory_stats()`, or None where unknown."""
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None; the value is optional
        return None
    if not stats:
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def topology_from_devices(
    platform: str,
    global_devices: Sequence[Any],
    local_devices: Sequence[Any],
    *,
    process_index: int,
    process_count: int,
    cluster_env: str | None = None,
    platform_choice: PlatformChoice | None = None,
) -> Topology:
    """Build a `Topology` from device objects (real `jax.Device`s or test stand-ins).

    Args:
      platform: the chosen platform.
      global_devices: all processes' devices of that platform.
      local_devices: this process's devices of that platform (at least one).
      process_index: this process's index.
      process_count: processes in the job.
      cluster_env: what started the processes, or None.
      platform_choice: how the platform was picked.

    Returns:
      The `Topology`.

    Raises:
      ValueError: `local_devices` is empty.

    Example:
      >>> topology_from_devices("cpu", jax.devices(), jax.local_devices(),
      ...                       process_index=0, process_count=1).global_device_count
      8
    """
    if not local_devices:
        raise ValueError(f"this process has no {platform} devices; cannot describe a topology")
    first = local_devices[0]
    return Topology(
        platform=platform,
        device_kind=str(first.device_kind),
        process_index=process_index,
        process_count=process_count,
        local_device_count=len(local_devices),
        global_device_count=len(global_devices),
        memory_per_device_bytes=memory_bytes(first),
        cluster_env=cluster_env,
        platform_choice=platform_choice,
    )
