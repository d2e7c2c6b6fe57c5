"""Kubernetes Indexed Jobs and JobSets, bootstrapped by JAX through the Kubernetes API.

Kubernetes puts only this pod's index in the environment; the process count and the
coordinator's hostname live in the Job object, which `jax.distributed.initialize` reads with
the `kubernetes` package (`pip install "jax[k8s]"`). Without that package JAX cannot bootstrap,
so the environment counts as present only when the package is installed; otherwise set the
PHALANX_* variables in the pod spec.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from phalanx._src.cluster.cluster_env import ClusterEnv
from phalanx._src.cluster.env_values import read_int, read_str

SERVICE_HOST = "KUBERNETES_SERVICE_HOST"
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"


def kubernetes_package_installed() -> bool:
    """Return True when the `kubernetes` client is importable (checked without importing)."""
    return importlib.util.find_spec("kubernetes") is not None


class K8sCluster(ClusterEnv):
    """A pod of an Indexed Job (JobSets create those too)."""

    name = "k8s"

    @classmethod
    def is_present(cls, environ: Mapping[str, str]) -> bool:
        in_indexed_job = all(
            read_str(environ, v) is not None for v in (SERVICE_HOST, COMPLETION_INDEX)
        )
        return in_indexed_job and kubernetes_package_installed()

    @classmethod
    def coordinator_address(cls, environ: Mapping[str, str]) -> str | None:
        return None

    @classmethod
    def process_count(cls, environ: Mapping[str, str]) -> int | None:
        return None

    @classmethod
    def process_id(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, COMPLETION_INDEX)
