"""Mistakes in starting a job: `phalanx launch`'s flags, `phalanx.cluster.launch`'s
arguments, and the settings `phalanx.cluster.resolve()` reads (arguments and PHALANX_*
variables). All are refused before a process starts or JAX is touched."""

from __future__ import annotations

import sys

import pytest
from mistakes import Case, CliCase, assert_documented, expect, expect_cli, ids

import phalanx
from phalanx._src.cluster import (
    cpu_devices,
    distributed,
    gke_tpu_cluster,
    k8s_cluster,
    ompi_cluster,
    phalanx_env,
    platforms,
    slurm_cluster,
)
from phalanx._src.cluster.cluster_env import JAX_COORDINATOR_PORT

# Every variable the cluster detection reads: cleared, so that a test machine that itself runs
# under SLURM (or a launcher) cannot change what these cases see.
CLUSTER_VARIABLES = (
    *phalanx_env.ALL_VARIABLES,
    *slurm_cluster.REQUIRED,
    ompi_cluster.ORTE_URI,
    ompi_cluster.PROCESS_COUNT,
    ompi_cluster.PROCESS_ID,
    ompi_cluster.LOCAL_PROCESS_ID,
    gke_tpu_cluster.PROCESS_ADDRESSES,
    gke_tpu_cluster.WORKER_HOSTNAMES,
    gke_tpu_cluster.WORKER_ID,
    gke_tpu_cluster.MEGASCALE_COORDINATOR_ADDRESS,
    gke_tpu_cluster.MEGASCALE_NUM_SLICES,
    gke_tpu_cluster.MEGASCALE_SLICE_ID,
    k8s_cluster.SERVICE_HOST,
    k8s_cluster.COMPLETION_INDEX,
    JAX_COORDINATOR_PORT,
    platforms.PLATFORM_ENV,
    cpu_devices.CPU_DEVICES_ENV,
    distributed.INIT_TIMEOUT_ENV,
    distributed.HEARTBEAT_TIMEOUT_ENV,
    distributed.SHUTDOWN_TIMEOUT_ENV,
)
PROGRAM = (sys.executable, "-c", "pass")


def launch(s, command=PROGRAM, **kwargs):
    return phalanx.cluster.launch(list(command), log_dir=s.tmp / "logs", **kwargs)


def resolve_under(**env):
    """`phalanx.cluster.resolve()` with these variables set (restored afterwards)."""

    def call(s):
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            return phalanx.cluster.resolve()

    return call


def launch_cli(*args: str) -> tuple[str, ...]:
    return ("launch", "--log-dir", "{tmp}/logs", *args)


CLI_CASES = [
    CliCase(
        "`phalanx launch` without a command",
        ("launch",),
        2,
        ("no command", "phalanx launch -n 2 -- python train.py"),
    ),
    CliCase(
        "`phalanx launch -n 2 --` with nothing after `--`",
        launch_cli("-n", "2", "--"),
        2,
        ("no command",),
    ),
    CliCase(
        "`phalanx launch -n 0 -- python train.py`",
        launch_cli("-n", "0", "--", *PROGRAM),
        2,
        ("num_processes must be >= 1; got num_processes=0",),
    ),
    CliCase(
        "`phalanx launch -n two -- python train.py`",
        launch_cli("-n", "two", "--", *PROGRAM),
        2,
        ("invalid int value: 'two'",),
    ),
    CliCase(
        "`phalanx launch --cpu-devices 0 -- python train.py`",
        launch_cli("--cpu-devices", "0", "--", *PROGRAM),
        2,
        ("cpu_devices must be >= 1; got cpu_devices=0",),
    ),
    CliCase(
        "`phalanx launch --timeout 0 -- python train.py`",
        launch_cli("--timeout", "0", "--", *PROGRAM),
        2,
        ("timeout must be > 0 seconds or None; got timeout=0.0",),
    ),
    CliCase(
        "`phalanx launch --timeout 5m -- python train.py`",
        launch_cli("--timeout", "5m", "--", *PROGRAM),
        2,
        ("invalid float value: '5m'",),
    ),
    CliCase(
        "`phalanx launch -- trian.py`: a program that does not exist",
        launch_cli("--", "./trian.py"),
        2,
        ("phalanx launch: error:", "No such file or directory", "./trian.py"),
    ),
    CliCase(
        "`phalanx launch --log-dir` naming a file",
        ("launch", "--log-dir", "{tmp}/a-file", "--", *PROGRAM),
        2,
        ("phalanx launch: error:", "File exists", "a-file"),
    ),
]

CASES = [
    Case("`cluster.launch([])`", ValueError, ("command is empty",), lambda s: launch(s, ())),
    Case(
        "`cluster.launch(cmd, num_processes='2')`",
        TypeError,
        ("num_processes must be an int >= 1; got '2' (str)",),
        lambda s: launch(s, num_processes="2"),
    ),
    Case(
        "`cluster.launch(cmd, timeout=-5)`",
        ValueError,
        ("timeout must be > 0 seconds or None; got timeout=-5",),
        lambda s: launch(s, timeout=-5),
    ),
    Case(
        "`cluster.launch(cmd, cpu_devices=0)`",
        ValueError,
        ("cpu_devices must be >= 1; got cpu_devices=0",),
        lambda s: launch(s, cpu_devices=0),
    ),
    Case(
        "`cluster.resolve('quantum')`",
        ValueError,
        ("'quantum' is not a platform phalanx knows", "'cpu'"),
        lambda s: phalanx.cluster.resolve("quantum"),
    ),
    Case(
        "`PHALANX_PLATFORM=tpus`",
        ValueError,
        ("PHALANX_PLATFORM='tpus' is not a platform",),
        resolve_under(PHALANX_PLATFORM="tpus"),
    ),
    Case(
        "`cluster.resolve(cpu_devices=0)`",
        ValueError,
        ("cpu_devices must be >= 1; got cpu_devices=0",),
        lambda s: phalanx.cluster.resolve(cpu_devices=0),
    ),
    Case(
        "`PHALANX_CPU_DEVICES=0`",
        ValueError,
        ("PHALANX_CPU_DEVICES=0 is below 1",),
        resolve_under(PHALANX_CPU_DEVICES="0"),
    ),
    Case(
        "`cluster.resolve(num_processes=2)` alone",
        ValueError,
        ("coordinator_address, process_id not given",),
        lambda s: phalanx.cluster.resolve(num_processes=2),
    ),
    Case(
        "a coordinator address without a port",
        ValueError,
        ("coordinator_address='10.0.0.1' is not 'host:port'",),
        lambda s: phalanx.cluster.resolve(
            coordinator_address="10.0.0.1", num_processes=2, process_id=0
        ),
    ),
    Case(
        "`process_id=2` of 2 processes",
        ValueError,
        ("process_id=2 is out of range for num_processes=2", "0..1"),
        lambda s: phalanx.cluster.resolve(
            coordinator_address="10.0.0.1:1234", num_processes=2, process_id=2
        ),
    ),
    Case(
        "`PHALANX_NUM_PROCESSES=two`",
        ValueError,
        ("PHALANX_NUM_PROCESSES='two' is not an integer",),
        resolve_under(
            PHALANX_COORDINATOR_ADDRESS="10.0.0.1:1234",
            PHALANX_NUM_PROCESSES="two",
            PHALANX_PROCESS_ID="0",
        ),
    ),
    Case(
        "only `PHALANX_NUM_PROCESSES` set",
        ValueError,
        (
            "incomplete multi-process settings: PHALANX_NUM_PROCESSES set",
            "PHALANX_COORDINATOR_ADDRESS",
        ),
        resolve_under(PHALANX_NUM_PROCESSES="2"),
    ),
]


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("case", CLI_CASES, ids=ids(CLI_CASES))
def test_the_launch_mistake_gets_a_clear_error(case, capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    said = expect_cli(case, capsys, tmp_path)
    assert "Traceback" not in said
    assert not list(tmp_path.glob("logs/process-1.log"))  # no second process was started


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_the_mistake_gets_a_clear_error(case, make_scene):
    expect(case, make_scene(case.checkpoint))


def test_every_case_is_in_the_docs():
    assert_documented([*CLI_CASES, *CASES])
