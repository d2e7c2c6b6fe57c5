"""The questions every cluster environment answers, and the record of the answers.

A cluster environment (SLURM, Open MPI, a GKE TPU slice, phalanx's own launcher...) is a class
with four class methods that read only environment variables: is it present, where is the
coordinator, how many processes, which one is this. Nothing here touches the network, so
detection is instant and testable with `monkeypatch.setenv`; when JAX needs the network to fill
in an answer (Kubernetes), the answer here is None and `jax.distributed.initialize` finds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# Set by schedulers to move the coordinator port off the default; jax.distributed honours it too.
JAX_COORDINATOR_PORT = "JAX_COORDINATOR_PORT"


class ClusterEnv:
    """Interface of one cluster environment; subclasses live one per module.

    Subclasses set `name` and override the four class methods. Every method takes the
    environment as a mapping so tests can pass a dict instead of patching `os.environ`.
    """

    name: str = ""

    @classmethod
    def is_present(cls, environ: Mapping[str, str]) -> bool:
        """Return True when this process runs inside this cluster environment."""
        raise NotImplementedError

    @classmethod
    def coordinator_address(cls, environ: Mapping[str, str]) -> str | None:
        """Return "host:port" of process 0's coordinator, or None when JAX must look it up."""
        raise NotImplementedError

    @classmethod
    def process_count(cls, environ: Mapping[str, str]) -> int | None:
        """Return the number of processes in the job, or None when JAX must look it up."""
        raise NotImplementedError

    @classmethod
    def process_id(cls, environ: Mapping[str, str]) -> int | None:
        """Return this process's index in [0, process_count), or None when unknown."""
        raise NotImplementedError

    @classmethod
    def describe(cls, environ: Mapping[str, str]) -> ClusterInfo:
        """Return the answers as one `ClusterInfo` record (call only when present)."""
        return ClusterInfo(
            name=cls.name,
            coordinator_address=cls.coordinator_address(environ),
            process_count=cls.process_count(environ),
            process_id=cls.process_id(environ),
        )


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What a detected cluster environment says about this job.

    Attributes:
      name: the environment's name ("phalanx", "slurm", "ompi", "gke-tpu", "k8s").
      coordinator_address: "host:port" of process 0, or None when JAX resolves it.
      process_count: processes in the job, or None when JAX resolves it.
      process_id: this process's index, or None when JAX resolves it.
    """

    name: str
    coordinator_address: str | None
    process_count: int | None
    process_id: int | None

    @property
    def multi_process(self) -> bool:
        """True unless the environment says the job has exactly one process."""
        return self.process_count != 1


def port_from_job_id(job_id: int) -> int:
    """Map a scheduler's job id onto a port in [61440, 65535], as jax.distributed does.

    Every process of a job derives the same port without talking to the others.

    Example:
      >>> port_from_job_id(4097)
      61441
    """
    return job_id % 2**12 + (65535 - 2**12 + 1)
