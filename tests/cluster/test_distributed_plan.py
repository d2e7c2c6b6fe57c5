"""When resolve() starts multi-process JAX, and with which settings."""

from __future__ import annotations

import pytest

from phalanx._src.cluster.distributed import DistributedSettings, plan_distributed
from phalanx._src.cluster.watchdog import JAX_BACKSTOP_SECONDS

LAUNCHED = {
    "PHALANX_COORDINATOR_ADDRESS": "127.0.0.1:4321",
    "PHALANX_NUM_PROCESSES": "2",
    "PHALANX_PROCESS_ID": "1",
}
SLURM = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
}


def test_single_process_by_default():
    assert plan_distributed(environ={}) is None


def test_arguments_give_settings_with_production_timeouts():
    s = plan_distributed(
        coordinator_address="10.0.0.1:99", num_processes=4, process_id=3, environ={}
    )
    assert s == DistributedSettings("10.0.0.1:99", 4, 3, "arguments", 60, 20, 300)
    # JAX's own timeouts come later than phalanx's watchdog, so phalanx explains first.
    assert s.initialize_kwargs() == {
        "coordinator_address": "10.0.0.1:99",
        "num_processes": 4,
        "process_id": 3,
        "initialization_timeout": 60 + JAX_BACKSTOP_SECONDS,
        "heartbeat_timeout_seconds": 20 + JAX_BACKSTOP_SECONDS,
        "shutdown_timeout_seconds": 300,
    }


def test_launched_process_reads_phalanx_variables_and_binds_loopback_only():
    env = {
        **LAUNCHED,
        "PHALANX_HEARTBEAT_TIMEOUT": "10",
        "PHALANX_INIT_TIMEOUT": "60",
        "PHALANX_SHUTDOWN_TIMEOUT": "30",
    }
    s = plan_distributed(environ=env)
    assert s == DistributedSettings("127.0.0.1:4321", 2, 1, "phalanx", 60, 10, 30)
    assert s.initialize_kwargs()["coordinator_bind_address"] == "127.0.0.1:4321"


def test_timeout_arguments_beat_variables():
    s = plan_distributed(
        environ={**LAUNCHED, "PHALANX_HEARTBEAT_TIMEOUT": "10"}, heartbeat_timeout_seconds=5
    )
    assert s.heartbeat_timeout_seconds == 5


def test_cluster_environment_fills_what_arguments_leave_out():
    s = plan_distributed(coordinator_address="head:5000", environ=SLURM)
    assert (s.coordinator_address, s.num_processes, s.process_id, s.source) == (
        "head:5000",
        2,
        1,
        "arguments",
    )
    assert plan_distributed(environ=SLURM).source == "slurm"


def test_one_process_needs_no_coordination():
    assert plan_distributed(environ={**SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    assert (
        plan_distributed(coordinator_address="h:1", num_processes=1, process_id=0, environ={})
        is None
    )


def test_distributed_flag_forces_either_way():
    assert plan_distributed(environ=LAUNCHED, distributed=False) is None
    auto = plan_distributed(environ={}, distributed=True)
    assert (auto.coordinator_address, auto.num_processes, auto.process_id, auto.source) == (
        None,
        None,
        None,
        "jax",
    )


def test_incomplete_arguments_name_what_is_missing():
    with pytest.raises(ValueError, match="num_processes, process_id not given"):
        plan_distributed(coordinator_address="h:1", environ={})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"coordinator_address": "no-port"}, ValueError, "is not 'host:port'"),
        ({"coordinator_address": "h:port"}, ValueError, "is not 'host:port'"),
        (
            {"process_id": 2},
            ValueError,
            "process_id=2 is out of range for num_processes=2; use 0..1",
        ),
        ({"num_processes": True}, TypeError, "num_processes must be an int"),
        ({"process_id": -1}, ValueError, "process_id must be >= 0"),
        ({"heartbeat_timeout_seconds": 0}, ValueError, "heartbeat_timeout_seconds must be >= 1"),
    ],
)
def test_settings_are_validated(kwargs, error, match):
    args = {
        "coordinator_address": "h:1",
        "num_processes": 2,
        "process_id": 0,
        "source": "test",
        **kwargs,
    }
    with pytest.raises(error, match=match):
        DistributedSettings(**args)


def test_non_loopback_coordinator_binds_all_interfaces():
    kwargs = DistributedSettings("10.0.0.1:1", 2, 0, "test").initialize_kwargs()
    assert "coordinator_bind_address" not in kwargs  # JAX's default: every interface


def test_bad_timeout_variable_is_named():
    with pytest.raises(ValueError, match="PHALANX_SHUTDOWN_TIMEOUT='soon' is not an integer"):
        plan_distributed(environ={**LAUNCHED, "PHALANX_SHUTDOWN_TIMEOUT": "soon"})
