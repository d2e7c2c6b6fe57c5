"""resolve(): order of actions, idempotence, fallback line, errors; fake and real JAX."""

from __future__ import annotations

import logging
import os

import jax
import pytest
from cluster_fakes import FakeRuntime, devices

import phalanx.cluster
from phalanx._src.cluster.resolve import Resolver
from phalanx._src.cluster.runtime import JaxRuntime

LAUNCHED = {
    "PHALANX_COORDINATOR_ADDRESS": "127.0.0.1:4321",
    "PHALANX_NUM_PROCESSES": "2",
    "PHALANX_PROCESS_ID": "1",
}
TPU_HOST = {
    "tpu": devices("tpu", "TPU v4", 4, stats={"bytes_limit": 32 * 2**30}),
    "cpu": devices("cpu", "cpu", 1),
}
CPU_ONLY = {"cpu": devices("cpu", "cpu", 8)}


def _fallback_lines(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "phalanx.cluster" and r.levelno == logging.WARNING
    ]


def test_tpu_host_resolves_to_tpu_silently(caplog):
    rt = FakeRuntime(TPU_HOST)
    topo = Resolver(rt, environ={}).resolve()
    assert (topo.platform, topo.device_kind, topo.global_device_count) == ("tpu", "TPU v4", 4)
    assert topo.memory_per_device_bytes == 32 * 2**30
    assert topo.cluster_env is None and topo.process_count == 1
    assert _fallback_lines(caplog) == []
    assert rt.actions() == []  # nothing to change on a plain single-host run


def test_missing_tpu_falls_back_with_one_line_once(caplog):
    resolver = Resolver(FakeRuntime(CPU_ONLY), environ={"PHALANX_PLATFORM": "tpu"})
    first = resolver.resolve()
    second = resolver.resolve()
    assert first == second
    assert first.platform == "cpu" and first.global_device_count == 8
    assert first.platform_choice.requested == "tpu"
    assert _fallback_lines(caplog) == [
        "TPU not found (PHALANX_PLATFORM=tpu asked for it). Using CPU; available: cpu."
    ]


def test_forced_cpu_on_a_tpu_host_restricts_jax_before_it_starts():
    rt = FakeRuntime(TPU_HOST)
    topo = Resolver(rt, environ={}).resolve("cpu")
    assert topo.platform == "cpu" and topo.platform_choice.fallback is None
    assert rt.calls[0] == ("restrict_to", "cpu")  # before the first device probe


def test_forced_platform_other_than_jax_default_becomes_the_default():
    rt = FakeRuntime(TPU_HOST, backends_started=True)  # too late to restrict JAX
    topo = Resolver(rt, environ={}).resolve("cpu")
    assert topo.platform == "cpu"
    assert ("make_default", "cpu") in rt.calls


def test_launched_process_sets_devices_then_joins_then_probes():
    rt = FakeRuntime({"cpu": devices("cpu", "cpu", 2, processes=2)})
    env = {**LAUNCHED, "PHALANX_CPU_DEVICES": "2", "PHALANX_HEARTBEAT_TIMEOUT": "10"}
    resolver = Resolver(rt, environ=env)
    topo = resolver.resolve()
    names = [c[0] for c in rt.calls]
    assert names[:2] == ["set_cpu_device_count", "initialize_distributed"]
    assert rt.calls[0] == ("set_cpu_device_count", 2)
    settings = rt.calls[1][1]
    assert (settings.coordinator_address, settings.num_processes, settings.process_id) == (
        "127.0.0.1:4321",
        2,
        1,
    )
    assert settings.heartbeat_timeout_seconds == 10
    assert (topo.process_index, topo.process_count, topo.cluster_env) == (1, 2, "phalanx")
    assert (topo.local_device_count, topo.global_device_count) == (2, 4)
    # Idempotent: the second call joins nothing.
    assert resolver.resolve() == topo
    assert [c[0] for c in rt.calls].count("initialize_distributed") == 1


def test_arguments_beat_variables():
    rt = FakeRuntime({"cpu": devices("cpu", "cpu", 1, processes=3)})
    Resolver(rt, environ=LAUNCHED).resolve(
        coordinator_address="10.1.1.1:5", num_processes=3, process_id=2
    )
    settings = rt.calls[0][1]
    assert (settings.coordinator_address, settings.num_processes, settings.process_id) == (
        "10.1.1.1:5",
        3,
        2,
    )
    assert settings.source == "arguments"


def test_joining_after_jax_started_is_a_clear_error():
    rt = FakeRuntime(CPU_ONLY, backends_started=True)
    with pytest.raises(
        RuntimeError, match=r"JAX's backend already started.*before any JAX operation"
    ):
        Resolver(rt, environ=LAUNCHED).resolve()


def test_already_joined_with_another_process_count_is_an_error():
    rt = FakeRuntime(CPU_ONLY, backends_started=True, process_count=4)
    rt.initialized = True  # e.g. the user called jax.distributed.initialize themselves
    with pytest.raises(
        RuntimeError, match=r"already initialized with 4 processes.*num_processes=2"
    ):
        Resolver(rt, environ=LAUNCHED).resolve()
    topo = Resolver(rt, environ={}).resolve()
    assert topo.cluster_env == "jax" and topo.process_count == 4


def test_bad_settings_fail_before_anything_changes():
    rt = FakeRuntime(CPU_ONLY)
    bad = [
        ({"PHALANX_PLATFORM": "npu", "PHALANX_CPU_DEVICES": "2"}, "PHALANX_PLATFORM='npu'"),
        ({"PHALANX_CPU_DEVICES": "0"}, "PHALANX_CPU_DEVICES=0 is below 1"),
        (
            {"PHALANX_CPU_DEVICES": "2", "PHALANX_PROCESS_ID": "1"},
            "incomplete multi-process settings",
        ),
    ]
    for env, match in bad:
        with pytest.raises(ValueError, match=match):
            Resolver(rt, environ=env).resolve()
    assert rt.calls == []  # the valid CPU device count was not applied either


# ---- real JAX in this process (fake CPU devices from tests/conftest.py)


def test_real_resolve_on_this_machine(clean_env):
    topo = phalanx.cluster.resolve()
    assert topo.platform == "cpu" and topo.device_kind == "cpu"
    assert topo.global_device_count == topo.local_device_count == jax.device_count()
    assert (topo.process_index, topo.process_count, topo.cluster_env) == (0, 1, None)
    assert topo.memory_per_device_bytes is None  # XLA:CPU reports no memory stats
    assert phalanx.cluster.resolve() == topo
    assert not jax.distributed.is_initialized()


def test_real_resolve_falls_back_from_tpu_in_one_line(clean_env, caplog):
    clean_env.setenv("PHALANX_PLATFORM", "tpu")
    topo = Resolver(JaxRuntime()).resolve()
    assert topo.platform == "cpu"
    lines = _fallback_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith(
        "TPU not found (PHALANX_PLATFORM=tpu asked for it"
    )


def test_real_cpu_device_count_after_start_must_match(clean_env):
    jax.devices()  # make sure the backend has started
    have = jax.local_device_count()
    assert (
        Resolver(JaxRuntime(), environ={"PHALANX_CPU_DEVICES": str(have)})
        .resolve()
        .local_device_count
        == have
    )
    with pytest.raises(
        RuntimeError,
        match=f"asked for {have + 1} CPU devices per process, but JAX already started with {have}",
    ):
        Resolver(JaxRuntime(), environ={}).resolve(cpu_devices=have + 1)


def test_real_environment_is_read_at_call_time(clean_env):
    clean_env.setenv("PHALANX_PLATFORM", "bogus")
    with pytest.raises(ValueError, match="PHALANX_PLATFORM='bogus'"):
        phalanx.cluster.resolve()
    assert "PHALANX_PLATFORM" in os.environ
