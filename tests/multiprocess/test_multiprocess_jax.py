"""Two processes x two CPU devices joined by `phalanx.cluster.resolve()` through the launcher."""

from __future__ import annotations

import os
import re
import signal
import time

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from multiprocess_harness import body_command, run_multiprocess

import phalanx.cluster
from phalanx.cluster import LaunchError

pytestmark = pytest.mark.multiprocess


def _global_mesh() -> jax.sharding.Mesh:
    # Auto axes: the classic behaviour; `jax.make_mesh` defaults to Explicit in jax 0.10.
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))


def _topology_body() -> None:
    topo = phalanx.cluster.resolve()
    expected_index = int(os.environ["PHALANX_PROCESS_ID"])
    assert topo.platform == "cpu"
    assert topo.process_index == expected_index == jax.process_index()
    assert topo.process_count == 2
    assert topo.local_device_count == 2
    assert topo.global_device_count == 4
    assert topo.cluster_env == "phalanx"
    assert topo.multi_process
    assert jax.distributed.is_initialized()
    # Idempotent: a second call neither re-initializes nor changes the answer.
    assert phalanx.cluster.resolve() == topo
    assert {d.process_index for d in jax.local_devices()} == {expected_index}


def test_each_process_sees_the_global_topology():
    result = run_multiprocess(_topology_body)
    assert result.returncodes == (0, 0)
    for i, proc in enumerate(result.processes):
        assert f"process {i} of 2, 2 local / 4 global devices" in proc.output


def _cross_process_sum_body() -> None:
    mesh = _global_mesh()
    pid = jax.process_index()
    # Device d of the global mesh holds the value d + 1; the sum over 4 devices is 10.
    local = np.array([2 * pid + 1, 2 * pid + 2], dtype=np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(x)
    assert float(total) == 10.0

    @jax.jit
    def psum_per_device(a):
        return jax.shard_map(
            lambda shard: jax.lax.psum(shard, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )(a)

    summed = psum_per_device(x)
    assert summed.shape == (1,)
    np.testing.assert_array_equal(np.asarray(summed.addressable_data(0)), [10.0])


def test_cross_process_sum_and_psum():
    run_multiprocess(_cross_process_sum_body)


def _local_batches_body(rows_per_process: int) -> None:
    from jax.experimental import multihost_utils

    mesh = _global_mesh()
    pid = jax.process_index()
    start = pid * rows_per_process
    local = np.arange(start * 3, (start + rows_per_process) * 3, dtype=np.int32).reshape(-1, 3)
    batch = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
    assert batch.shape == (2 * rows_per_process, 3)
    assert not batch.is_fully_addressable
    # This process's shards are exactly its own rows, in order.
    mine = np.concatenate(
        [
            np.asarray(s.data)
            for s in sorted(batch.addressable_shards, key=lambda s: s.index[0].start)
        ]
    )
    np.testing.assert_array_equal(mine, local)
    gathered = multihost_utils.process_allgather(batch, tiled=True)
    np.testing.assert_array_equal(gathered, np.arange(2 * rows_per_process * 3).reshape(-1, 3))


def test_process_local_batches_become_one_global_array():
    run_multiprocess(_local_batches_body, kwargs={"rows_per_process": 4})


def _killed_peer_body() -> None:
    mesh = _global_mesh()
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), np.ones(2, np.float32)
    )
    step = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))
    assert float(step(x)) == 4.0  # both processes are up and talking
    if jax.process_index() == 1:
        print(f"KILLING SELF at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    # Process 0 keeps issuing collectives its dead peer will never join.
    for _ in range(10_000):
        step(x).block_until_ready()
    raise AssertionError("process 0 finished collectives without its peer")


def test_killed_peer_fails_the_launch_fast_with_both_logs():
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        run_multiprocess(_killed_peer_body, timeout=120)
    elapsed = time.monotonic() - started
    ended = time.time()
    result = caught.value.result
    assert elapsed < 60, f"a killed peer took {elapsed:.1f} s to fail the launch"
    assert not result.timed_out
    dead, survivor = result.processes[1], result.processes[0]
    assert dead.returncode == -signal.SIGKILL and not dead.killed
    assert survivor.returncode != 0  # SIGKILLed by the launcher, or aborted by JAX
    killed_at = float(re.search(r"KILLING SELF at ([\d.]+)", dead.output).group(1))
    assert ended - killed_at < 30, f"{ended - killed_at:.1f} s from the kill to the failure"
    since_kill = ended - killed_at
    print(f"killed peer: launch failed {since_kill:.2f} s after the kill, {elapsed:.1f} s in all")
    message = str(caught.value)
    assert "process 0:" in message and "process 1: killed by SIGKILL" in message
    assert "KILLING SELF" in message  # process 1's log tail is in the report
    assert "process 0 of 2" in message  # and so is process 0's


def _failing_body(expected_processes: int) -> None:
    assert jax.process_count() == expected_processes


def test_a_failing_body_fails_the_test_with_pytest_style_detail():
    with pytest.raises(LaunchError) as caught:
        run_multiprocess(_failing_body, kwargs={"expected_processes": 3}, timeout=60)
    assert 1 in caught.value.result.returncodes
    assert "AssertionError: assert 2 == 3" in str(caught.value)


def test_only_module_level_functions_can_be_bodies():
    def nested() -> None:
        pass

    with pytest.raises(ValueError, match="module-level function"):
        body_command(nested)
    with pytest.raises(ValueError, match="module-level function"):
        body_command(lambda: None)
    command = body_command(_failing_body, {"expected_processes": 2})
    assert command[-2:] == ["_failing_body", '{"expected_processes": 2}']
    assert command[2] == __file__
