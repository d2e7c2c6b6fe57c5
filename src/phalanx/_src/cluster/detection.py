"""Which cluster environment this process runs in, read from environment variables only."""

from __future__ import annotations

from collections.abc import Mapping

from phalanx._src.cluster.cluster_env import ClusterEnv, ClusterInfo
from phalanx._src.cluster.gke_tpu_cluster import GkeTpuCluster
from phalanx._src.cluster.k8s_cluster import K8sCluster
from phalanx._src.cluster.ompi_cluster import OmpiCluster
from phalanx._src.cluster.phalanx_env import PhalanxEnv
from phalanx._src.cluster.slurm_cluster import SlurmCluster

# First match wins. phalanx's own variables come first: they are explicit (set by
# `phalanx launch` or by the user) and must beat whatever scheduler started the job. The rest
# follow jax.distributed's order: `mpirun` inside a SLURM allocation sees both, and the MPI
# ranks are the processes; Kubernetes last, because TPU pods on GKE are Kubernetes pods too.
DETECTION_ORDER: tuple[type[ClusterEnv], ...] = (
    PhalanxEnv,
    OmpiCluster,
    SlurmCluster,
    GkeTpuCluster,
    K8sCluster,
)


def detect_cluster(environ: Mapping[str, str]) -> ClusterInfo | None:
    """Return what the first present cluster environment says, or None outside any cluster.

    Reads environment variables only; never touches the network.

    Args:
      environ: the environment to inspect (usually `os.environ`).

    Returns:
      A `ClusterInfo`, or None when no known environment is present.

    Raises:
      ValueError: a present environment holds a malformed value (the message names it).

    Example:
      >>> detect_cluster({"PHALANX_COORDINATOR_ADDRESS": "127.0.0.1:1234",
      ...                 "PHALANX_NUM_PROCESSES": "2", "PHALANX_PROCESS_ID": "1"}).process_id
      1
    """
    for env in DETECTION_ORDER:
        if env.is_present(environ):
            return env.describe(environ)
    return None
