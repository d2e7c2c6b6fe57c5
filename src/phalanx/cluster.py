"""Hardware and cluster resolution: which platform, which processes, what topology.

    import phalanx.cluster
    topology = phalanx.cluster.resolve()      # TPU > GPU > CPU; joins multi-process jobs
    print(topology.summary())

`launch` starts several local processes that `resolve()` joins into one job (tests, laptops).
"""

from phalanx._src.cluster.cluster_env import ClusterInfo as ClusterInfo
from phalanx._src.cluster.detection import DETECTION_ORDER as DETECTION_ORDER
from phalanx._src.cluster.detection import detect_cluster as detect_cluster
from phalanx._src.cluster.distributed import DistributedSettings as DistributedSettings
from phalanx._src.cluster.distributed import plan_distributed as plan_distributed
from phalanx._src.cluster.platforms import PLATFORMS as PLATFORMS
from phalanx._src.cluster.platforms import PlatformChoice as PlatformChoice
from phalanx._src.cluster.platforms import choose_platform as choose_platform
from phalanx._src.cluster.resolve import resolve as resolve
from phalanx._src.cluster.topology import Topology as Topology
from phalanx._src.launch import LaunchError as LaunchError
from phalanx._src.launch import LaunchResult as LaunchResult
from phalanx._src.launch import ProcessResult as ProcessResult
from phalanx._src.launch import launch as launch

__all__ = [
    "DETECTION_ORDER",
    "PLATFORMS",
    "ClusterInfo",
    "DistributedSettings",
    "LaunchError",
    "LaunchResult",
    "PlatformChoice",
    "ProcessResult",
    "Topology",
    "choose_platform",
    "detect_cluster",
    "launch",
    "plan_distributed",
    "resolve",
]
