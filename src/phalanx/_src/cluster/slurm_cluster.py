"""SLURM: tasks started by `srun` (or `sbatch` + `srun`) with more than one task.

The coordinator is the first node of the job step, on a port derived from the job id, exactly
as `jax.distributed.initialize` derives it, so phalanx and JAX agree without talking.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx._src.cluster.cluster_env import JAX_COORDINATOR_PORT, ClusterEnv, port_from_job_id
from phalanx._src.cluster.env_values import read_int, read_str

JOB_ID = "SLURM_JOB_ID"
NODE_LIST = "SLURM_STEP_NODELIST"
PROCESS_COUNT = "SLURM_NTASKS"
PROCESS_ID = "SLURM_PROCID"
LOCAL_PROCESS_ID = "SLURM_LOCALID"
REQUIRED = (JOB_ID, NODE_LIST, PROCESS_COUNT, PROCESS_ID, LOCAL_PROCESS_ID)


def first_host(node_list: str) -> str:
    """Return the first hostname of a SLURM node list.

    Example:
      >>> first_host("node[001-004,009],gpu7")
      'node001'
    """
    cut = next((i for i, ch in enumerate(node_list) if ch in ",["), len(node_list))
    if cut == len(node_list) or node_list[cut] == ",":
        return node_list[:cut]
    prefix, ranges = node_list[:cut], node_list[cut + 1 :]
    end = next((i for i, ch in enumerate(ranges) if ch in ",-]"), len(ranges))
    return prefix + ranges[:end]


class SlurmCluster(ClusterEnv):
    """A SLURM job step; every variable below is set by `srun` for each task."""

    name = "slurm"

    @classmethod
    def is_present(cls, environ: Mapping[str, str]) -> bool:
        return all(read_str(environ, v) is not None for v in REQUIRED)

    @classmethod
    def coordinator_address(cls, environ: Mapping[str, str]) -> str | None:
        port = read_str(environ, JAX_COORDINATOR_PORT) or str(
            port_from_job_id(read_int(environ, JOB_ID) or 0)
        )
        return f"{first_host(environ[NODE_LIST].strip())}:{port}"

    @classmethod
    def process_count(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, PROCESS_COUNT, minimum=1)

    @classmethod
    def process_id(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, PROCESS_ID)
