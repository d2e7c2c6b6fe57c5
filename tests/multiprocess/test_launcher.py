"""The launcher on plain Python processes: environment, failure, timeout, reporting."""

from __future__ import annotations

import io
import json
import signal
import sys
import time
from pathlib import Path

import pytest

from phalanx._src.launch import FAIL_FAST_XLA_FLAGS, LaunchError, launch, process_env

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead, merely not yet reaped by its new parent


def test_process_env_golden():
    base = {
        "XLA_FLAGS": (
            "--xla_force_host_platform_device_count=8"
            " --xla_cpu_collective_timeout_seconds=99 --other=1"
        ),
        "PHALANX_HEARTBEAT_TIMEOUT": "7",
        "KEEP": "me",
    }
    env = process_env(
        base, process_id=1, num_processes=3, coordinator_address="127.0.0.1:555", cpu_devices=2
    )
    assert env["PHALANX_COORDINATOR_ADDRESS"] == "127.0.0.1:555"
    assert (env["PHALANX_NUM_PROCESSES"], env["PHALANX_PROCESS_ID"]) == ("3", "1")
    assert (env["PHALANX_CPU_DEVICES"], env["JAX_PLATFORMS"]) == ("2", "cpu")
    assert env["PHALANX_HEARTBEAT_TIMEOUT"] == "7"  # the caller's value wins over fail-fast
    assert env["PHALANX_SHUTDOWN_TIMEOUT"] == "30"
    assert env["KEEP"] == "me"
    flags = env["XLA_FLAGS"].split()
    assert "--xla_force_host_platform_device_count=8" not in flags  # PHALANX_CPU_DEVICES rules
    assert "--xla_cpu_collective_timeout_seconds=99" not in flags
    assert flags == ["--other=1", *FAIL_FAST_XLA_FLAGS]
    assert base["XLA_FLAGS"].startswith("--xla_force")  # the input is not modified


def test_process_env_without_fail_fast_or_cpu_devices_adds_nothing_else():
    env = process_env(
        {}, process_id=0, num_processes=1, coordinator_address="127.0.0.1:1", fail_fast=False
    )
    assert set(env) == {
        "PHALANX_COORDINATOR_ADDRESS",
        "PHALANX_NUM_PROCESSES",
        "PHALANX_PROCESS_ID",
        "PYTHONUNBUFFERED",
    }


def test_every_process_gets_its_id_and_the_same_coordinator(tmp_path):
    code = (
        "import json, os\n"
        "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('PHALANX')}))"
    )
    result = launch([PY, "-c", code], num_processes=3, cpu_devices=2, timeout=30, log_dir=tmp_path)
    assert result.ok and result.returncodes == (0, 0, 0)
    seen = [json.loads(p.output.strip().splitlines()[-1]) for p in result.processes]
    assert [s["PHALANX_PROCESS_ID"] for s in seen] == ["0", "1", "2"]
    assert {s["PHALANX_COORDINATOR_ADDRESS"] for s in seen} == {result.coordinator_address}
    assert result.coordinator_address.startswith("127.0.0.1:")
    assert all(s["PHALANX_NUM_PROCESSES"] == "3" and s["PHALANX_CPU_DEVICES"] == "2" for s in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "process-0.log",
        "process-1.log",
        "process-2.log",
    ]


def test_a_failing_process_kills_the_others_at_once(tmp_path):
    code = (
        "import os, sys, time\n"
        "print('hello from', os.environ['PHALANX_PROCESS_ID'], flush=True)\n"
        "if os.environ['PHALANX_PROCESS_ID'] == '1': sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        launch([PY, "-c", code], num_processes=2, timeout=60, log_dir=tmp_path)
    assert time.monotonic() - started < 10
    result = caught.value.result
    assert result.returncodes == (-signal.SIGKILL, 3)
    assert result.processes[0].killed and not result.processes[1].killed
    assert not result.timed_out and not result.ok
    message = str(caught.value)
    assert message.startswith("phalanx: process 1 of 2 stopped (exit 3); the launcher stopped")
    assert "process(es) [1] failed" in message
    assert "process 0: SIGKILLed by the launcher" in message and "hello from 0" in message
    assert "process 1: exit 3" in message and "hello from 1" in message


def test_timeout_kills_every_process_and_its_children(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    result = launch([PY, "-c", code], num_processes=2, timeout=2, log_dir=tmp_path, check=False)
    assert 2 <= time.monotonic() - started < 10
    assert result.timed_out and not result.ok
    assert result.returncodes == (-signal.SIGKILL, -signal.SIGKILL)
    assert all(p.killed for p in result.processes)
    children = [int(p.output.split("child")[1].split()[0]) for p in result.processes]
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children)
    assert "timed out after" in result.report()


def test_output_is_streamed_with_process_prefixes(tmp_path):
    stream = io.StringIO()
    # A blank line, a non-ASCII character and a last line without a newline all come through.
    code = (
        "import os; print('line a\\n')\n"
        "print('l\u00efne b', os.environ['PHALANX_PROCESS_ID'], end='')"
    )
    env = {"PYTHONIOENCODING": "utf-8"}
    launch([PY, "-c", code], num_processes=2, timeout=30, log_dir=tmp_path, stream=stream, env=env)
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if line.startswith("[0]")] == [
        "[0] line a",
        "[0] ",
        "[0] l\u00efne b 0",
    ]
    assert [line for line in lines if line.startswith("[1]")] == [
        "[1] line a",
        "[1] ",
        "[1] l\u00efne b 1",
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"command": []}, ValueError, "command is empty"),
        ({"num_processes": 0}, ValueError, "num_processes must be >= 1"),
        ({"num_processes": 2.0}, TypeError, "num_processes must be an int"),
        ({"cpu_devices": 0}, ValueError, "cpu_devices must be >= 1"),
        ({"timeout": 0}, ValueError, "timeout must be > 0"),
    ],
)
def test_bad_arguments_fail_before_starting_anything(tmp_path, kwargs, error, match):
    args = {"command": [PY, "-c", "pass"], "log_dir": tmp_path / "logs", **kwargs}
    with pytest.raises(error, match=match):
        launch(args.pop("command"), **args)
    assert not (tmp_path / "logs").exists()


def test_missing_program_raises_the_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        launch(["/nonexistent/program"], num_processes=2, timeout=5, log_dir=tmp_path)
