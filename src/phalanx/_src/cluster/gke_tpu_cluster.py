"""Cloud TPU slices on GKE (JobSet or Job): one process per TPU VM host, several slices.

GKE sets the slice's worker hostnames and this worker's id; multislice jobs add the MEGASCALE_*
variables. The coordinator is the megascale coordinator (or the slice's first worker) on port
8482, as in `jax.distributed`. TPU VMs created directly on GCE keep these answers in the
metadata server instead; phalanx does not query the network, so there pass `distributed=True`
to `resolve()` and JAX asks the metadata server itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx._src.cluster.cluster_env import JAX_COORDINATOR_PORT, ClusterEnv
from phalanx._src.cluster.env_values import read_int, read_str

PROCESS_ADDRESSES = "TPU_PROCESS_ADDRESSES"
WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
WORKER_ID = "TPU_WORKER_ID"
MEGASCALE_COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"
MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"
COORDINATOR_PORT = 8482


def _workers(environ: Mapping[str, str]) -> list[str]:
    # TPU_PROCESS_ADDRESSES is the newer name; JAX reads it first too.
    names = read_str(environ, PROCESS_ADDRESSES) or read_str(environ, WORKER_HOSTNAMES) or ""
    return [name.strip() for name in names.split(",") if name.strip()]


class GkeTpuCluster(ClusterEnv):
    """A TPU slice (or several) scheduled by GKE."""

    name = "gke-tpu"

    @classmethod
    def is_present(cls, environ: Mapping[str, str]) -> bool:
        return bool(_workers(environ)) and read_str(environ, WORKER_ID) is not None

    @classmethod
    def coordinator_address(cls, environ: Mapping[str, str]) -> str | None:
        host = read_str(environ, MEGASCALE_COORDINATOR_ADDRESS) or _workers(environ)[0]
        port = read_str(environ, JAX_COORDINATOR_PORT) or str(COORDINATOR_PORT)
        return f"{host.split(':')[0]}:{port}"

    @classmethod
    def process_count(cls, environ: Mapping[str, str]) -> int | None:
        return len(_workers(environ)) * (read_int(environ, MEGASCALE_NUM_SLICES, minimum=1) or 1)

    @classmethod
    def process_id(cls, environ: Mapping[str, str]) -> int | None:
        in_slice = read_int(environ, WORKER_ID) or 0
        slice_id = read_int(environ, MEGASCALE_SLICE_ID) or 0
        return in_slice + slice_id * len(_workers(environ))
