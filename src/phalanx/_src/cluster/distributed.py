"""When and how to start multi-process JAX: settings and the pure decision.

`plan_distributed` turns the arguments of `resolve()`, the PHALANX_* variables and any
detected cluster environment into `DistributedSettings`, or None for a single process.
The start-up and heartbeat timeouts are phalanx's own (see `watchdog`): a missing peer is
reported after 60 s and a dead one after 20 s by default, well above a busy host's jitter
(heartbeats come from a background thread, about once a second). JAX gets the same timeouts
plus `JAX_BACKSTOP_SECONDS`, so phalanx always speaks first. `phalanx launch` and the tests
set smaller values through the variables below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from phalanx._src.cluster.detection import detect_cluster
from phalanx._src.cluster.env_values import check_int, read_int
from phalanx._src.cluster.phalanx_env import ALL_VARIABLES
from phalanx._src.cluster.watchdog import JAX_BACKSTOP_SECONDS

INIT_TIMEOUT_ENV = "PHALANX_INIT_TIMEOUT"
HEARTBEAT_TIMEOUT_ENV = "PHALANX_HEARTBEAT_TIMEOUT"
SHUTDOWN_TIMEOUT_ENV = "PHALANX_SHUTDOWN_TIMEOUT"

# Start-up: long enough for a scheduler to start every process; a dead peer: survivors exit
# within 30 s (the heartbeat thread never waits for compilation or a step). Shutdown keeps
# JAX's default.
DEFAULT_INIT_TIMEOUT = 60
DEFAULT_HEARTBEAT_TIMEOUT = 20
DEFAULT_SHUTDOWN_TIMEOUT = 300

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """Validated arguments for `jax.distributed.initialize`.

    None for the address, count or id means "let JAX find it" (Kubernetes, TPU metadata).

    Attributes:
      coordinator_address: "host:port" of process 0.
      num_processes: processes in the job.
      process_id: this process's index in [0, num_processes).
      source: where the values came from ("arguments", a cluster environment's name, or "jax"
        for JAX's own auto-detection).
      initialization_timeout: seconds to wait for every process to join before phalanx
        names the missing ones and exits.
      heartbeat_timeout_seconds: seconds without a heartbeat before a peer counts as dead and
        every survivor prints which one and exits (status 75).
      shutdown_timeout_seconds: seconds the exit barrier waits for the other processes.
    """

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    source: str
    initialization_timeout: int = DEFAULT_INIT_TIMEOUT
    heartbeat_timeout_seconds: int = DEFAULT_HEARTBEAT_TIMEOUT
    shutdown_timeout_seconds: int = DEFAULT_SHUTDOWN_TIMEOUT

    def __post_init__(self) -> None:
        address = self.coordinator_address
        if address is not None and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
            raise ValueError(
                f"coordinator_address={address!r} is not 'host:port'; "
                "use e.g. coordinator_address='10.0.0.1:1234'"
            )
        if self.num_processes is not None:
            check_int(self.num_processes, "num_processes", minimum=1)
        if self.process_id is not None:
            check_int(self.process_id, "process_id", minimum=0)
            if self.num_processes is not None and self.process_id >= self.num_processes:
                raise ValueError(
                    f"process_id={self.process_id} is out of range for "
                    f"num_processes={self.num_processes}; use 0..{self.num_processes - 1}"
                )
        check_int(self.initialization_timeout, "initialization_timeout", minimum=1)
        check_int(self.heartbeat_timeout_seconds, "heartbeat_timeout_seconds", minimum=1)
        check_int(self.shutdown_timeout_seconds, "shutdown_timeout_seconds", minimum=1)

    def initialize_kwargs(self) -> dict[str, object]:
        """Return keyword arguments for `jax.distributed.initialize`.

        JAX's start-up and heartbeat timeouts come `JAX_BACKSTOP_SECONDS` after phalanx's own,
        so its abort only ever follows phalanx's explanation.
        """
        kwargs: dict[str, object] = {
            "coordinator_address": self.coordinator_address,
            "num_processes": self.num_processes,
            "process_id": self.process_id,
            "initialization_timeout": self.initialization_timeout + JAX_BACKSTOP_SECONDS,
            "heartbeat_timeout_seconds": self.heartbeat_timeout_seconds + JAX_BACKSTOP_SECONDS,
            "shutdown_timeout_seconds": self.shutdown_timeout_seconds,
        }
        address = self.coordinator_address
        if address is not None and address.rsplit(":", 1)[0] in _LOOPBACK_HOSTS:
            # A job on one machine needs no coordinator listening on every interface.
            kwargs["coordinator_bind_address"] = address
        return kwargs


def plan_distributed(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    distributed: bool | None = None,
    initialization_timeout: int | None = None,
    heartbeat_timeout_seconds: int | None = None,
    shutdown_timeout_seconds: int | None = None,
    environ: Mapping[str, str],
) -> DistributedSettings | None:
    """Decide whether this process joins a multi-process job, and with which settings.

    Arguments win over the environment; a detected cluster environment fills what they leave
    unset. A job of exactly one process needs no coordination and gives None.

    Args:
      coordinator_address: "host:port" of process 0, or None.
      num_processes: processes in the job, or None.
      process_id: this process's index, or None.
      distributed: None decides from the arguments and environment; True always initializes
        (JAX then auto-detects, e.g. from a GCE TPU VM's metadata server); False never does.
      initialization_timeout: seconds; default PHALANX_INIT_TIMEOUT, else 60.
      heartbeat_timeout_seconds: seconds; default PHALANX_HEARTBEAT_TIMEOUT, else 20.
      shutdown_timeout_seconds: seconds; default PHALANX_SHUTDOWN_TIMEOUT, else 300.
      environ: the environment to read (usually `os.environ`).

    Returns:
      `DistributedSettings`, or None for a single process.

    Raises:
      ValueError: settings are incomplete or malformed (the message names the missing ones).

    Example:
      >>> plan_distributed(coordinator_address="127.0.0.1:1234", num_processes=2,
      ...                  process_id=0, environ={}).source
      'arguments'
    """
    if distributed is False:
        return None
    cluster = detect_cluster(environ)
    explicit = (coordinator_address, num_processes, process_id)
    if cluster is None and all(v is None for v in explicit) and not distributed:
        return None
    if cluster is not None:
        coordinator_address = coordinator_address or cluster.coordinator_address
        num_processes = cluster.process_count if num_processes is None else num_processes
        process_id = cluster.process_id if process_id is None else process_id
        source = "arguments" if any(v is not None for v in explicit) else cluster.name
    else:
        source = "arguments" if any(v is not None for v in explicit) else "jax"
        missing = [
            n
            for n, v in zip(
                ("coordinator_address", "num_processes", "process_id"), explicit, strict=True
            )
            if v is None
        ]
        if missing and source == "arguments":
            raise ValueError(
                f"multi-process settings are incomplete: {', '.join(missing)} not given; pass "
                "coordinator_address='host:port', num_processes=N and process_id=i together "
                f"(or set {', '.join(ALL_VARIABLES)}), or pass none of them for one process"
            )
    if num_processes == 1 and not distributed:
        return None
    timeouts = (
        (initialization_timeout, INIT_TIMEOUT_ENV, DEFAULT_INIT_TIMEOUT),
        (heartbeat_timeout_seconds, HEARTBEAT_TIMEOUT_ENV, DEFAULT_HEARTBEAT_TIMEOUT),
        (shutdown_timeout_seconds, SHUTDOWN_TIMEOUT_ENV, DEFAULT_SHUTDOWN_TIMEOUT),
    )
    init, heartbeat, shutdown = (
        value if value is not None else (read_int(environ, env, minimum=1) or default)
        for value, env, default in timeouts
    )
    return DistributedSettings(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        source=source,
        initialization_timeout=init,
        heartbeat_timeout_seconds=heartbeat,
        shutdown_timeout_seconds=shutdown,
    )
