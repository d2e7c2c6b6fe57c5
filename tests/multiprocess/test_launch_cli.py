"""`phalanx launch -n N [--cpu-devices D] -- PROGRAM ...` through the CLI's main()."""

from __future__ import annotations

import json
import sys

import pytest

from phalanx._src.cli.main import main

PY = sys.executable


def test_launch_echoes_output_and_exits_0(tmp_path, capsys):
    code = (
        "import os; e = os.environ\n"
        "print('I am', e['PHALANX_PROCESS_ID'], 'of', e['PHALANX_NUM_PROCESSES'])"
    )
    status = main(
        ["launch", "-n", "2", "--timeout", "30", "--log-dir", str(tmp_path), "--", PY, "-c", code]
    )
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert "[0] I am 0 of 2" in out and "[1] I am 1 of 2" in out


def test_launch_returns_the_failing_process_status_and_reports_logs(tmp_path, capsys):
    code = (
        "import os, sys, time\n"
        "sys.exit(5) if os.environ['PHALANX_PROCESS_ID'] == '0' else time.sleep(60)"
    )
    status = main(
        ["launch", "-n", "2", "--quiet", "--log-dir", str(tmp_path), "--", PY, "-c", code]
    )
    captured = capsys.readouterr()
    assert status == 5
    assert captured.out == ""
    assert (
        "process 0: exit 5" in captured.err
        and "process 1: SIGKILLed by the launcher" in captured.err
    )


def test_launch_timeout_exits_124(tmp_path, capsys):
    status = main(
        [
            "launch",
            "-n",
            "1",
            "--timeout",
            "0.5",
            "--log-dir",
            str(tmp_path),
            "--",
            PY,
            "-c",
            "import time; time.sleep(30)",
        ]
    )
    assert status == 124
    assert "timed out after" in capsys.readouterr().err


def test_launch_without_a_command_is_a_usage_error(capsys):
    assert main(["launch", "-n", "2", "--"]) == 2
    assert "no command" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_launch_runs_doctor_as_a_two_process_job(tmp_path):
    argv = ["launch", "-n", "2", "--cpu-devices", "2", "--timeout", "60", "--quiet"]
    doctor = [PY, "-m", "phalanx._src.cli.main", "doctor", "--json"]
    assert main([*argv, "--log-dir", str(tmp_path), "--", *doctor]) == 0
    for i in range(2):
        log = (tmp_path / f"process-{i}.log").read_text()
        report = json.loads(log[log.index("{") : log.rindex("}") + 1])
        topo = report["topology"]
        assert (topo["process_index"], topo["process_count"]) == (i, 2)
        assert (topo["local_device_count"], topo["global_device_count"]) == (2, 4)
        assert report["mode"] == "multi-process" and report["cluster_env"] == "phalanx"
        assert report["default_strategy_replicas"] == 4
