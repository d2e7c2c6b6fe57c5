"""Open MPI: processes started by `mpirun` / `mpiexec` (ORTE, Open MPI 4 and earlier).

The coordinator is the launcher's host from the ORTE URI, on a port derived from the job id as
`jax.distributed.initialize` derives it. Open MPI 5 (PRRTE) no longer sets the URI; there,
set the PHALANX_* variables or use `cluster_detection_method="mpi4py"` through JAX.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from phalanx._src.cluster.cluster_env import JAX_COORDINATOR_PORT, ClusterEnv, port_from_job_id
from phalanx._src.cluster.env_values import read_int, read_str

ORTE_URI = "OMPI_MCA_orte_hnp_uri"
PROCESS_COUNT = "OMPI_COMM_WORLD_SIZE"
PROCESS_ID = "OMPI_COMM_WORLD_RANK"
LOCAL_PROCESS_ID = "OMPI_COMM_WORLD_LOCAL_RANK"

# "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911" or "...;tcp6://[fe80::1,...]:43370"
_LAUNCHER_IP = re.compile(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]")


class OmpiCluster(ClusterEnv):
    """An Open MPI job; `mpirun` sets these variables for every rank."""

    name = "ompi"

    @classmethod
    def is_present(cls, environ: Mapping[str, str]) -> bool:
        return read_str(environ, ORTE_URI) is not None

    @classmethod
    def coordinator_address(cls, environ: Mapping[str, str]) -> str | None:
        uri = environ[ORTE_URI]
        match = _LAUNCHER_IP.search(uri)
        if match is None:
            raise ValueError(
                f"cannot find the launcher's IP address in {ORTE_URI}={uri!r}; "
                "set PHALANX_COORDINATOR_ADDRESS=host:port instead"
            )
        host = next(group for group in match.groups() if group is not None)
        # ORTE job ids are multiples of 2**12; dividing spreads jobs over the port range.
        port = read_str(environ, JAX_COORDINATOR_PORT) or str(
            port_from_job_id(int(uri.split(".", 1)[0]) // 2**12)
        )
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # bracket IPv6

    @classmethod
    def process_count(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, PROCESS_COUNT, minimum=1)

    @classmethod
    def process_id(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, PROCESS_ID)
