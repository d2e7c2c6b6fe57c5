"""Stand-ins for devices and for JAX's runtime, so resolution is tested without hardware."""

from __future__ import annotations

import dataclasses
from typing import Any

from phalanx._src.cluster import (
    cpu_devices,
    distributed,
    gke_tpu_cluster,
    k8s_cluster,
    ompi_cluster,
    phalanx_env,
    platforms,
    slurm_cluster,
)
from phalanx._src.cluster.cluster_env import JAX_COORDINATOR_PORT


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    platform: str
    device_kind: str
    process_index: int = 0
    stats: Any = None

    def memory_stats(self) -> Any:
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def devices(platform: str, kind: str, per_process: int, processes: int = 1, stats: Any = None):
    return [
        FakeDevice(platform, kind, p, stats) for p in range(processes) for _ in range(per_process)
    ]


class FakeRuntime:
    """Records every action; `machine` maps platform -> global devices."""

    def __init__(
        self,
        machine: dict[str, list[FakeDevice]],
        *,
        backends_started: bool = False,
        process_index: int = 0,
        process_count: int = 1,
        restriction: str | None = None,
    ):
        self.machine = machine
        self.calls: list[tuple] = []
        self.started = backends_started
        self.initialized = False
        self.index, self.count = process_index, process_count
        self.restriction = restriction
        self.default = next(p for p in platforms.PLATFORMS if machine.get(p))

    def backends_initialized(self) -> bool:
        return self.started

    def set_cpu_device_count(self, count: int) -> None:
        self.calls.append(("set_cpu_device_count", count))

    def restrict_to(self, platform: str) -> None:
        self.calls.append(("restrict_to", platform))
        self.restriction = platform

    def platform_restriction(self) -> str | None:
        return self.restriction

    def distributed_initialized(self) -> bool:
        return self.initialized

    def initialize_distributed(self, settings) -> None:
        assert not self.started, "jax.distributed must be initialized before the backend starts"
        self.calls.append(("initialize_distributed", settings))
        self.initialized = True
        self.count = settings.num_processes or self.count
        self.index = settings.process_id or 0

    def devices(self, platform: str):
        self.started = True
        self.calls.append(("devices", platform))
        if self.restriction and platform not in self.restriction.split(","):
            return []
        return self.machine.get(platform, [])

    def local_devices(self, platform: str):
        return [d for d in self.devices(platform) if d.process_index == self.index]

    def default_platform(self) -> str:
        self.started = True
        return self.default

    def make_default(self, platform: str) -> None:
        self.calls.append(("make_default", platform))
        self.default = platform

    def process_index(self) -> int:
        return self.index

    def process_count(self) -> int:
        return self.count

    def actions(self) -> list[str]:
        """The names of the calls that change something (probes left out)."""
        return [c[0] for c in self.calls if c[0] != "devices"]


# Every variable any detection or setting reads; tests start from an environment without them.
KNOWN_VARIABLES = (
    *phalanx_env.ALL_VARIABLES,
    *slurm_cluster.REQUIRED,
    ompi_cluster.ORTE_URI,
    ompi_cluster.PROCESS_COUNT,
    ompi_cluster.PROCESS_ID,
    ompi_cluster.LOCAL_PROCESS_ID,
    gke_tpu_cluster.PROCESS_ADDRESSES,
    gke_tpu_cluster.WORKER_HOSTNAMES,
    gke_tpu_cluster.WORKER_ID,
    gke_tpu_cluster.MEGASCALE_COORDINATOR_ADDRESS,
    gke_tpu_cluster.MEGASCALE_NUM_SLICES,
    gke_tpu_cluster.MEGASCALE_SLICE_ID,
    k8s_cluster.SERVICE_HOST,
    k8s_cluster.COMPLETION_INDEX,
    JAX_COORDINATOR_PORT,
    platforms.PLATFORM_ENV,
    cpu_devices.CPU_DEVICES_ENV,
    distributed.INIT_TIMEOUT_ENV,
    distributed.HEARTBEAT_TIMEOUT_ENV,
    distributed.SHUTDOWN_TIMEOUT_ENV,
)
