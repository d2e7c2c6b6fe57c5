"""Cluster environments detected from environment variables (monkeypatch.setenv)."""

from __future__ import annotations

import os

import pytest

from phalanx._src.cluster import k8s_cluster
from phalanx._src.cluster.cluster_env import ClusterInfo, port_from_job_id
from phalanx._src.cluster.detection import DETECTION_ORDER, detect_cluster
from phalanx._src.cluster.gke_tpu_cluster import GkeTpuCluster
from phalanx._src.cluster.k8s_cluster import K8sCluster
from phalanx._src.cluster.ompi_cluster import OmpiCluster
from phalanx._src.cluster.phalanx_env import PhalanxEnv
from phalanx._src.cluster.slurm_cluster import SlurmCluster, first_host


def _set(monkeypatch, **variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def _slurm(monkeypatch, ntasks="4", procid="2"):
    _set(
        monkeypatch,
        SLURM_JOB_ID="123456",
        SLURM_STEP_NODELIST="gpu[017-020],login1",
        SLURM_NTASKS=ntasks,
        SLURM_PROCID=procid,
        SLURM_LOCALID="0",
    )


def test_nothing_detected_outside_a_cluster(clean_env):
    assert detect_cluster(os.environ) is None


def test_detection_order_is_explicit():
    expected = (PhalanxEnv, OmpiCluster, SlurmCluster, GkeTpuCluster, K8sCluster)
    assert expected == DETECTION_ORDER
    assert len({env.name for env in DETECTION_ORDER}) == len(DETECTION_ORDER)


def test_phalanx_variables(clean_env):
    _set(
        clean_env,
        PHALANX_COORDINATOR_ADDRESS="10.0.0.1:1234",
        PHALANX_NUM_PROCESSES="4",
        PHALANX_PROCESS_ID="3",
    )
    assert detect_cluster(os.environ) == ClusterInfo("phalanx", "10.0.0.1:1234", 4, 3)


def test_partial_phalanx_variables_name_the_missing_ones(clean_env):
    _set(clean_env, PHALANX_NUM_PROCESSES="2")
    with pytest.raises(ValueError) as caught:
        detect_cluster(os.environ)
    message = str(caught.value)
    assert (
        "PHALANX_NUM_PROCESSES set but PHALANX_COORDINATOR_ADDRESS, PHALANX_PROCESS_ID not"
        in message
    )


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        ("PHALANX_NUM_PROCESSES", "two", "PHALANX_NUM_PROCESSES='two' is not an integer"),
        ("PHALANX_NUM_PROCESSES", "0", "PHALANX_NUM_PROCESSES=0 is below 1"),
        ("PHALANX_PROCESS_ID", "-1", "PHALANX_PROCESS_ID=-1 is below 0"),
    ],
)
def test_malformed_values_name_the_variable(clean_env, variable, value, match):
    _set(
        clean_env,
        PHALANX_COORDINATOR_ADDRESS="h:1",
        PHALANX_NUM_PROCESSES="2",
        PHALANX_PROCESS_ID="0",
    )
    clean_env.setenv(variable, value)
    with pytest.raises(ValueError, match=match):
        detect_cluster(os.environ)


def test_slurm(clean_env):
    _slurm(clean_env)
    expected_port = 123456 % 4096 + 61440
    assert detect_cluster(os.environ) == ClusterInfo("slurm", f"gpu017:{expected_port}", 4, 2)


def test_slurm_needs_every_variable(clean_env):
    _slurm(clean_env)
    clean_env.delenv("SLURM_LOCALID")
    assert detect_cluster(os.environ) is None


def test_slurm_single_task_is_detected_as_one_process(clean_env):
    _slurm(clean_env, ntasks="1", procid="0")
    info = detect_cluster(os.environ)
    assert info.name == "slurm" and info.process_count == 1 and not info.multi_process


def test_jax_coordinator_port_overrides_the_derived_port(clean_env):
    _slurm(clean_env)
    clean_env.setenv("JAX_COORDINATOR_PORT", "7777")
    assert detect_cluster(os.environ).coordinator_address == "gpu017:7777"


@pytest.mark.parametrize(
    ("node_list", "host"),
    [
        ("node001", "node001"),
        ("node001,host2", "node001"),
        ("node[001-0015],host2", "node001"),
        ("node[001,007-015],host2", "node001"),
        ("node[7]", "node7"),
    ],
)
def test_slurm_first_host_golden(node_list, host):
    assert first_host(node_list) == host


def test_port_from_job_id_stays_in_the_top_4096_ports():
    assert port_from_job_id(0) == 61440
    assert port_from_job_id(4095) == 65535
    assert port_from_job_id(4096) == 61440


def test_open_mpi(clean_env):
    _set(
        clean_env,
        OMPI_MCA_orte_hnp_uri="1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
        OMPI_COMM_WORLD_SIZE="8",
        OMPI_COMM_WORLD_RANK="5",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
    )
    port = (1531576320 // 4096) % 4096 + 61440
    assert detect_cluster(os.environ) == ClusterInfo("ompi", f"10.96.0.1:{port}", 8, 5)


def test_open_mpi_ipv6_and_malformed_uri(clean_env):
    _set(
        clean_env,
        OMPI_MCA_orte_hnp_uri="4096.0;tcp6://[fe80::1,2620:10d::2]:43370",
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK="0",
    )
    assert detect_cluster(os.environ).coordinator_address == "[fe80::1]:61441"
    clean_env.setenv("OMPI_MCA_orte_hnp_uri", "4096.0;garbage")
    with pytest.raises(ValueError, match="PHALANX_COORDINATOR_ADDRESS"):
        detect_cluster(os.environ)


def test_mpirun_inside_a_slurm_allocation_is_mpi(clean_env):
    _slurm(clean_env)
    _set(
        clean_env,
        OMPI_MCA_orte_hnp_uri="0.0;tcp://10.0.0.9:1",
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK="1",
    )
    assert detect_cluster(os.environ).name == "ompi"


def test_phalanx_variables_beat_the_scheduler(clean_env):
    _slurm(clean_env)
    _set(
        clean_env,
        PHALANX_COORDINATOR_ADDRESS="127.0.0.1:9",
        PHALANX_NUM_PROCESSES="2",
        PHALANX_PROCESS_ID="1",
    )
    assert detect_cluster(os.environ) == ClusterInfo("phalanx", "127.0.0.1:9", 2, 1)


def test_gke_tpu_single_slice(clean_env):
    _set(clean_env, TPU_WORKER_HOSTNAMES="w-0.svc,w-1.svc,w-2.svc,w-3.svc", TPU_WORKER_ID="2")
    assert detect_cluster(os.environ) == ClusterInfo("gke-tpu", "w-0.svc:8482", 4, 2)


def test_gke_tpu_multislice(clean_env):
    _set(
        clean_env,
        TPU_PROCESS_ADDRESSES="a:8476,b:8476",
        TPU_WORKER_HOSTNAMES="ignored-when-process-addresses-set",
        TPU_WORKER_ID="1",
        MEGASCALE_COORDINATOR_ADDRESS="coord.svc:8080",
        MEGASCALE_NUM_SLICES="3",
        MEGASCALE_SLICE_ID="2",
    )
    assert detect_cluster(os.environ) == ClusterInfo("gke-tpu", "coord.svc:8482", 6, 5)


def test_kubernetes_indexed_job_needs_the_kubernetes_package(clean_env):
    _set(clean_env, KUBERNETES_SERVICE_HOST="10.0.0.1", JOB_COMPLETION_INDEX="3")
    clean_env.setattr(k8s_cluster, "kubernetes_package_installed", lambda: False)
    assert detect_cluster(os.environ) is None
    clean_env.setattr(k8s_cluster, "kubernetes_package_installed", lambda: True)
    info = detect_cluster(os.environ)
    # JAX reads the count and coordinator from the Job object; only the index is local.
    assert info == ClusterInfo("k8s", None, None, 3)
    assert info.multi_process


def test_tpu_on_gke_is_not_mistaken_for_a_plain_kubernetes_job(clean_env):
    _set(
        clean_env,
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        JOB_COMPLETION_INDEX="1",
        TPU_WORKER_HOSTNAMES="a,b",
        TPU_WORKER_ID="1",
    )
    clean_env.setattr(k8s_cluster, "kubernetes_package_installed", lambda: True)
    assert detect_cluster(os.environ).name == "gke-tpu"


def test_detection_accepts_any_mapping():
    env = {
        "PHALANX_COORDINATOR_ADDRESS": "h:1",
        "PHALANX_NUM_PROCESSES": "2",
        "PHALANX_PROCESS_ID": "0",
    }
    assert detect_cluster(env) == ClusterInfo("phalanx", "h:1", 2, 0)
