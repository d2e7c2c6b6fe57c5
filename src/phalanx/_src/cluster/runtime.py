"""Every side effect phalanx has on JAX's runtime, behind one small object.

`resolve()` decides in pure functions and acts only through a `JaxRuntime`; tests hand it a
fake runtime to check what is done, and in which order, without devices or processes. The
order matters: the CPU device count, the platform restriction and `jax.distributed` must all
happen before JAX starts its backends (the first `jax.devices()` or computation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from phalanx._src.cluster.distributed import DistributedSettings
from phalanx._src.cluster.native_terminate import TerminateHook
from phalanx._src.cluster.service_host import hosted_outside
from phalanx._src.cluster.watchdog import PeerWatchdog, StartupTimer


class JaxRuntime:
    """The real runtime: thin calls into `jax`, `jax.config` and `jax.distributed`."""

    def backends_initialized(self) -> bool:
        """Return True once JAX has started its backends (no more device-count changes)."""
        from jax._src import xla_bridge  # no public equivalent in jax 0.10

        return xla_bridge.backends_are_initialized()

    def set_cpu_device_count(self, count: int) -> None:
        """Give this process `count` CPU devices; a no-op if it already has that many.

        Raises:
          RuntimeError: the backend already started with a different number.
        """
        if not self.backends_initialized():
            jax.config.update("jax_num_cpu_devices", count)
            return
        have = len(jax.local_devices(backend="cpu"))
        if have != count:
            raise RuntimeError(
                f"asked for {count} CPU devices per process, but JAX already started with {have}; "
                "call phalanx.cluster.resolve() (or set PHALANX_CPU_DEVICES) before any JAX "
                "operation such as jax.devices() or jnp.zeros()"
            )

    def restrict_to(self, platform: str) -> None:
        """Start only `platform`'s backend (so a forced CPU run leaves accelerators alone)."""
        jax.config.update("jax_platforms", platform)

    def platform_restriction(self) -> str | None:
        """Return JAX's platform list (JAX_PLATFORMS / jax_platforms) when one is set."""
        return jax.config.jax_platforms or None

    def distributed_initialized(self) -> bool:
        """Return True once `jax.distributed.initialize` has run in this process."""
        return jax.distributed.is_initialized()

    def initialize_distributed(self, settings: DistributedSettings) -> None:
        """Join the multi-process job (blocks until all processes have joined), then watch the
        peers for the life of the process (see `watchdog`). Process 0 hosts JAX's
        coordination service in a helper process, so its death is reported rather than
        aborting the others (see `service_host`)."""
        from jax._src import distributed as jax_distributed  # the client: no public handle

        timer = StartupTimer(
            settings.process_id,
            settings.num_processes,
            settings.coordinator_address,
            settings.initialization_timeout,
        )
        with timer, hosted_outside():
            jax.distributed.initialize(**settings.initialize_kwargs())
        state = jax_distributed.global_state  # not jax.process_index(): no backend start yet
        PeerWatchdog(
            state.client,
            state.process_id,
            state.num_processes,
            settings.heartbeat_timeout_seconds,
            native=TerminateHook.install(),
        ).start()

    def devices(self, platform: str) -> Sequence[Any]:
        """Return every process's devices of `platform`, or [] when it is unavailable."""
        try:
            return jax.devices(platform)
        except RuntimeError:  # "Unknown backend" / "failed to initialize": not on this machine
            return []

    def local_devices(self, platform: str) -> Sequence[Any]:
        """Return this process's devices of `platform`."""
        return jax.local_devices(backend=platform)

    def default_platform(self) -> str:
        """Return the platform JAX computes on when nothing is placed explicitly."""
        return jax.default_backend()

    def make_default(self, platform: str) -> None:
        """Place uncommitted computations on `platform`'s first local device."""
        jax.config.update("jax_default_device", self.local_devices(platform)[0])

    def process_index(self) -> int:
        """Return this process's index in the job."""
        return jax.process_index()

    def process_count(self) -> int:
        """Return the number of processes in the job."""
        return jax.process_count()
