"""`phalanx doctor`: the report, in process and as a real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax

from phalanx._src.cli.main import main


def test_doctor_json_reports_the_resolved_cpu_topology(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    topo = report["topology"]
    assert topo["platform"] == "cpu" and topo["device_kind"] == "cpu"
    assert topo["global_device_count"] == topo["local_device_count"] == jax.device_count()
    assert (topo["process_index"], topo["process_count"]) == (0, 1)
    assert report["mode"] == "single-process" and report["cluster_env"] is None
    assert report["default_strategy_replicas"] == jax.device_count()
    assert report["platform"]["platform"] == "cpu" and report["platform"]["requested"] is None
    assert report["fallback"].startswith("No TPU or GPU found")
    versions = report["versions"]
    assert versions["jax"] == jax.__version__
    assert {"python", "phalanx", "jaxlib", "flax", "optax", "numpy"} <= set(versions)
    assert all(isinstance(v, str) for v in versions.values())


def test_doctor_text_says_what_it_would_do(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    n = jax.device_count()
    assert out.startswith("phalanx doctor\n")
    assert f"a default Strategy would have {n} replica" in out
    assert "single process" in out
    assert "fallback       No TPU or GPU found" in out
    assert f"jax {jax.__version__}" in out


def test_doctor_rejects_an_unknown_platform(capsys):
    assert main(["doctor", "--platform", "npu"]) == 2
    err = capsys.readouterr().err
    assert (
        "platform='npu' is not a platform phalanx knows" in err
        and "'tpu', 'gpu', 'cpu', 'auto'" in err
    )


def test_doctor_command_falls_back_from_tpu_and_honours_cpu_devices():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHALANX_", "SLURM_", "OMPI_"))}
    env.update(PHALANX_PLATFORM="tpu", PHALANX_CPU_DEVICES="3")  # inherits XLA_FLAGS' 8 devices
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx._src.cli.main", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["topology"]["platform"] == "cpu"
    assert report["topology"]["global_device_count"] == 3  # PHALANX_CPU_DEVICES beats XLA_FLAGS
    assert (
        report["platform"]["requested"] == "tpu"
        and report["platform"]["source"] == "PHALANX_PLATFORM"
    )
    assert report["fallback"].startswith("TPU not found (PHALANX_PLATFORM=tpu asked for it")
    fallback_lines = [line for line in proc.stderr.splitlines() if "not found" in line]
    assert fallback_lines == [report["fallback"]]
