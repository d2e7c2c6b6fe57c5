"""`phalanx train`, the main job, end to end in a fresh process on 8 fake CPU devices."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(args, env_extra=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PHALANX_CPU_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "phalanx._src.cli.main", "train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_train_reaches_keras_accuracy_on_8_devices(mnist_path, tmp_path):
    done = _run(
        [
            "--epochs",
            "5",
            "--cpu-devices",
            "8",
            "--json",
            "--logdir",
            str(tmp_path),
            "--data-dir",
            str(mnist_path.parent),
        ]
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert lines[-2].startswith("test accuracy ")
    assert report["replicas"] == 8 and report["global_batch"] == 1024
    assert report["test_accuracy"] >= 0.97
    assert report["examples_per_second"] > 0
    assert "cpu x8" in done.stdout  # the topology line
    run_dir = tmp_path / os.path.basename(report["run_dir"])
    assert any((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()] == ["5"]


def test_train_without_data_is_one_clear_error(tmp_path):
    done = _run(
        ["--epochs", "1", "--data-dir", str(tmp_path)],
        env_extra={
            "PHALANX_DATA_DIR": str(tmp_path),
            "XDG_CACHE_HOME": str(tmp_path),
            "PHALANX_MNIST_URL": (tmp_path / "absent.npz").as_uri(),
        },
        timeout=120,
    )
    assert done.returncode != 0
    assert "mnist.npz" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_options_fail_before_any_work(tmp_path):
    done = _run(["--steps-per-execution", "0", "--data-dir", str(tmp_path)], timeout=60)
    assert done.returncode != 0
    assert "--steps-per-execution must be a positive int" in done.stderr
