"""`phalanx train`, the main job, end to end in a fresh process on 8 fake CPU devices."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(child_env, args, env_extra=None, timeout=240):
    env = {**child_env, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "phalanx._src.cli.main", "train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_train_reaches_keras_accuracy_on_8_devices(child_env, mnist_path, tmp_path):
    done = _run(
        child_env,
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
        ],
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


# Makes every socket connection fail in the child process, as on a machine without network.
NO_NETWORK = """
import socket

def _no_network(*args, **kwargs):
    raise OSError("network blocked by the test")

socket.socket.connect = socket.socket.connect_ex = _no_network
socket.create_connection = socket.getaddrinfo = _no_network
"""


def test_offline_without_mnist_trains_on_the_embedded_digits(child_env, tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_NETWORK)
    done = _run(
        child_env,
        ["--json", "--logdir", str(tmp_path / "runs")],
        env_extra={
            "PYTHONPATH": str(tmp_path / "site"),
            "PHALANX_DATA_DIR": str(tmp_path / "nothing"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PHALANX_MNIST_URL": "https://storage.googleapis.com/never-reached/mnist.npz",
        },
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "network blocked by the test" not in done.stdout  # one plain line, not the error
    assert "training on the 1,797 8x8 UCI digits" in done.stdout.splitlines()[0]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["data"] == "digits" and report["test_accuracy"] >= 0.9
    assert report["model_tflops_per_second"] > 0
    # Peak memory: the host's high-water mark; XLA:CPU devices report none.
    assert report["peak_host_mib"] > 50 and report["peak_device_mib"] is None
    assert "peak host memory" in done.stdout and "peak device memory n/a" in done.stdout
    curves = report["curves"]
    assert curves.endswith("curves.png") and f"training curves: {curves}" in done.stdout
    with open(curves, "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.exists(os.path.join(report["run_dir"], "history.csv"))


def test_asking_for_mnist_without_it_is_one_clear_error(child_env, tmp_path):
    done = _run(
        child_env,
        ["--data", "mnist", "--data-dir", str(tmp_path)],
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


def test_bad_options_fail_before_any_work(child_env, tmp_path):
    done = _run(child_env, ["--steps-per-execution", "0", "--data-dir", str(tmp_path)], timeout=60)
    assert done.returncode != 0
    assert "--steps-per-execution must be a positive int" in done.stderr


def test_find_batch_size_leaves_at_least_20_steps_an_epoch(child_env, tmp_path):
    done = _run(
        child_env,
        [
            *("--data", "digits", "--find-batch-size", "--epochs", "1", "--cpu-devices", "2"),
            *("--json", "--logdir", str(tmp_path)),
        ],
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finder = next(line for line in done.stdout.splitlines() if "batch size finder" in line)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # Memory would allow the whole training set (1,438 images) in one batch: one step an
    # epoch. The cap keeps 20: 1438 // 20 = 71 -> 70 global, 35 per replica, 21 steps.
    assert finder.startswith("batch size finder: 35 per replica (70 global)"), finder
    assert "an epoch of 1,438 examples has at least 20 steps" in finder
    assert "linear-scaling learning rate" in finder
    assert report["global_batch"] == 70 and report["replicas"] == 2
    assert report["test_accuracy"] >= 0.5  # 0.25 with the one-batch epoch
