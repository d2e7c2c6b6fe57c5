"""phalanx's own variables: set by `phalanx launch`, or by hand for any other launcher.

All three of PHALANX_COORDINATOR_ADDRESS, PHALANX_NUM_PROCESSES and PHALANX_PROCESS_ID must be
set together; a partial set is an error, because guessing the rest would start processes that
wait for peers that never come.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx._src.cluster.cluster_env import ClusterEnv
from phalanx._src.cluster.env_values import read_int, read_str

COORDINATOR_ADDRESS = "PHALANX_COORDINATOR_ADDRESS"
NUM_PROCESSES = "PHALANX_NUM_PROCESSES"
PROCESS_ID = "PHALANX_PROCESS_ID"
ALL_VARIABLES = (COORDINATOR_ADDRESS, NUM_PROCESSES, PROCESS_ID)


class PhalanxEnv(ClusterEnv):
    """Processes started by `phalanx launch` or configured through PHALANX_* variables."""

    name = "phalanx"

    @classmethod
    def is_present(cls, environ: Mapping[str, str]) -> bool:
        found = [v for v in ALL_VARIABLES if read_str(environ, v) is not None]
        if found and len(found) < len(ALL_VARIABLES):
            missing = [v for v in ALL_VARIABLES if v not in found]
            raise ValueError(
                f"incomplete multi-process settings: {', '.join(found)} set but "
                f"{', '.join(missing)} not; set all of {', '.join(ALL_VARIABLES)} "
                "(e.g. PHALANX_COORDINATOR_ADDRESS=10.0.0.1:1234 PHALANX_NUM_PROCESSES=2 "
                "PHALANX_PROCESS_ID=0) or none of them"
            )
        return bool(found)

    @classmethod
    def coordinator_address(cls, environ: Mapping[str, str]) -> str | None:
        return read_str(environ, COORDINATOR_ADDRESS)

    @classmethod
    def process_count(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, NUM_PROCESSES, minimum=1)

    @classmethod
    def process_id(cls, environ: Mapping[str, str]) -> int | None:
        return read_int(environ, PROCESS_ID, minimum=0)
