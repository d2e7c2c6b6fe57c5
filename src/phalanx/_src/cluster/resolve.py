"""`resolve()`: find the hardware, join the multi-process job, describe the topology.

The JAX counterpart of TensorFlow's `TPUClusterResolver` + `initialize_tpu_system` +
"TPU not found, using the default strategy": one call, idempotent, that never fails merely
because there is no accelerator.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from phalanx._src.cluster.cpu_devices import cpu_device_count
from phalanx._src.cluster.distributed import DistributedSettings, plan_distributed
from phalanx._src.cluster.platforms import PLATFORMS, choose_platform, requested_platform
from phalanx._src.cluster.runtime import JaxRuntime
from phalanx._src.cluster.topology import Topology, topology_from_devices

logger = logging.getLogger("phalanx.cluster")


class Resolver:
    """Holds what resolution did in this process; `resolve()` uses the module's instance.

    Tests build private instances with a fake runtime and a dict environment.

    Args:
      runtime: the object that acts on JAX (see `JaxRuntime`).
      environ: the environment to read, or None for `os.environ` at call time.
    """

    def __init__(self, runtime: Any = None, environ: Mapping[str, str] | None = None) -> None:
        self.runtime = JaxRuntime() if runtime is None else runtime
        self.environ = environ
        self.settings: DistributedSettings | None = None
        self._announced: set[str] = set()

    def resolve(
        self,
        platform: str | None = None,
        *,
        coordinator_address: str | None = None,
        num_processes: int | None = None,
        process_id: int | None = None,
        cpu_devices: int | None = None,
        distributed: bool | None = None,
        initialization_timeout: int | None = None,
        heartbeat_timeout_seconds: int | None = None,
        shutdown_timeout_seconds: int | None = None,
    ) -> Topology:
        """See `phalanx.cluster.resolve`."""
        environ = os.environ if self.environ is None else self.environ
        rt = self.runtime
        # Decide everything first, so bad input fails before anything changes.
        requested, source = requested_platform(platform, environ)
        cpus = cpu_device_count(cpu_devices, environ)
        settings = plan_distributed(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            distributed=distributed,
            initialization_timeout=initialization_timeout,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
            shutdown_timeout_seconds=shutdown_timeout_seconds,
            environ=environ,
        )
        # Then act, in the order JAX needs: all of these precede backend start-up.
        if cpus is not None:
            rt.set_cpu_device_count(cpus)
        if requested == "cpu" and not rt.backends_initialized():
            rt.restrict_to("cpu")
        if settings is not None:
            self._join(settings)
        available = tuple(p for p in PLATFORMS if rt.devices(p))
        choice = choose_platform(
            requested, available, source=source, jax_platforms=rt.platform_restriction()
        )
        if rt.default_platform() != choice.platform:
            rt.make_default(choice.platform)
        if choice.fallback is not None and choice.fallback not in self._announced:
            self._announced.add(choice.fallback)
            logger.warning(choice.fallback)
        cluster_env = None
        if rt.distributed_initialized():
            cluster_env = self.settings.source if self.settings is not None else "jax"
        return topology_from_devices(
            choice.platform,
            rt.devices(choice.platform),
            rt.local_devices(choice.platform),
            process_index=rt.process_index(),
            process_count=rt.process_count(),
            cluster_env=cluster_env,
            platform_choice=choice,
        )

    def _join(self, settings: DistributedSettings) -> None:
        rt = self.runtime
        if rt.distributed_initialized():
            count = rt.process_count()
            if settings.num_processes is not None and settings.num_processes != count:
                raise RuntimeError(
                    f"jax.distributed is already initialized with {count} processes, but "
                    f"{settings.source} asks for num_processes={settings.num_processes}; "
                    "resolve() joins a job once per process, so pass the same settings or none"
                )
            return
        if rt.backends_initialized():
            raise RuntimeError(
                f"cannot join a {settings.num_processes or 'multi'}-process job (settings from "
                f"{settings.source}): JAX's backend already started in this process; call "
                "phalanx.cluster.resolve() before any JAX operation such as jax.devices() or "
                "jnp.zeros(), or pass distributed=False to stay single-process"
            )
        logger.info(
            "joining %s-process job as process %s via %s (settings from %s)",
            settings.num_processes or "?",
            settings.process_id if settings.process_id is not None else "?",
            settings.coordinator_address or "auto-detected coordinator",
            settings.source,
        )
        rt.initialize_distributed(settings)
        self.settings = settings


RESOLVER = Resolver()


def resolve(
    platform: str | None = None,
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    cpu_devices: int | None = None,
    distributed: bool | None = None,
    initialization_timeout: int | None = None,
    heartbeat_timeout_seconds: int | None = None,
    shutdown_timeout_seconds: int | None = None,
) -> Topology:
    """Resolve the hardware: pick the platform, join a multi-process job, describe it.

    Picks TPU > GPU > CPU, or the platform forced by `platform` or PHALANX_PLATFORM. A forced
    or preferred platform that is missing falls back to the best available one and says so
    in one warning line ("TPU not found ... Using CPU"); no accelerator is never an error.

    Joins a multi-process job through `jax.distributed.initialize` when given a coordinator
    address, process count and process id (arguments, or PHALANX_COORDINATOR_ADDRESS,
    PHALANX_NUM_PROCESSES, PHALANX_PROCESS_ID as set by `phalanx launch`), or when
    environment variables show a cluster JAX can bootstrap from (SLURM with several tasks,
    Open MPI, TPU slices on GKE, Kubernetes Indexed Jobs). Detection reads variables only.

    Idempotent: calling it again returns the same topology without re-initializing. Every
    process of a multi-process job must call it (it waits for all of them to join), before
    any other JAX operation.

    Args:
      platform: "tpu", "gpu", "cpu" or "auto"; None reads PHALANX_PLATFORM (default auto).
      coordinator_address: "host:port" of process 0 for a multi-process job.
      num_processes: number of processes in the job.
      process_id: this process's index in [0, num_processes).
      cpu_devices: CPU devices per process (default PHALANX_CPU_DEVICES, else JAX's 1).
      distributed: None decides from arguments and environment; True always initializes
        `jax.distributed` (JAX auto-detects, e.g. on GCE TPU VMs); False never does.
      initialization_timeout: seconds to wait for all processes to join; then every waiting
        process prints one `phalanx:` line naming the missing process ids, the coordinator
        address and the usual causes, and exits with status 75 (default
        PHALANX_INIT_TIMEOUT, else 60).
      heartbeat_timeout_seconds: seconds before a silent peer counts as dead; every survivor
        then prints `phalanx: process N of M stopped responding X s ago; ...` and exits
        with status 75, process 0 included: it hosts JAX's coordination service in a helper
        process that outlives it (default PHALANX_HEARTBEAT_TIMEOUT, else 20; tests use ~10).
      shutdown_timeout_seconds: seconds the exit barrier waits for peers (default
        PHALANX_SHUTDOWN_TIMEOUT, else 300).

    Returns:
      The `Topology` of this process's view of the job.

    Raises:
      ValueError: an argument or PHALANX_* variable is malformed or incomplete; the message
        names it and the legal values.
      RuntimeError: the CPU device count or a multi-process job was requested after JAX's
        backend had already started.

    Example:
      >>> import phalanx.cluster
      >>> topo = phalanx.cluster.resolve()          # "No TPU or GPU found. Using CPU."
      >>> topo.platform, topo.global_device_count
      ('cpu', 1)
      >>> phalanx.cluster.resolve("cpu", cpu_devices=8)  # before any other JAX call
    """
    return RESOLVER.resolve(
        platform,
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        cpu_devices=cpu_devices,
        distributed=distributed,
        initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        shutdown_timeout_seconds=shutdown_timeout_seconds,
    )
