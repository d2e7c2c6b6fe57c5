"""The two seed programs, ported, run unchanged on one device and on 8 fake devices."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.slow


def _run(child_env, script, args, devices, data_dir):
    env = {**child_env, "PHALANX_CPU_DEVICES": str(devices), "PHALANX_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("devices", [1, 8])
def test_fit_example(child_env, mnist_path, devices):
    out = _run(
        child_env,
        "mnist_fit.py",
        ["--epochs", "2", "--steps-per-epoch", "8"],
        devices,
        mnist_path.parent,
    )
    assert f"Number of accelerators: {devices}" in out
    assert f"Global batch size: {128 * devices}" in out
    assert "Training finished." in out
    losses = [
        float(line.split("loss: ")[1].split()[0])
        for line in out.splitlines()
        if line.startswith("Epoch ") and "loss: " in line
    ]
    assert len(losses) == 2 and losses[1] < losses[0]


@pytest.mark.parametrize("devices", [1, 8])
def test_custom_training_loop_example(child_env, mnist_path, devices):
    out = _run(
        child_env,
        "custom_training_loop.py",
        ["--epochs", "2", "--steps", "12"],
        devices,
        mnist_path.parent,
    )
    summaries = [
        line for line in out.splitlines() if line.startswith("Epoch ") and "accuracy" in line
    ]
    assert len(summaries) == 2
    losses = [float(s.split("loss ")[1].split(",")[0]) for s in summaries]
    accuracy = float(summaries[-1].split("accuracy ")[1])
    assert losses[1] < losses[0]
    assert 0.5 < accuracy <= 1.0


def test_image_folder_example(child_env, tmp_path):
    # PNG files -> image_dataset_from_directory -> augmentation -> fit (process workers are
    # tested in tests/data/test_workers.py; their start-up would double this test's time).
    out = _run(
        child_env,
        "image_folder_fit.py",
        ["--epochs", "2", "--workers", "0", "--folder", str(tmp_path / "png")],
        1,
        tmp_path,
    )
    assert "Found 1438 files belonging to 10 classes." in out
    assert len(list((tmp_path / "png").glob("*/*.png"))) == 1438
    losses = [
        float(line.split("loss: ")[1].split()[0])
        for line in out.splitlines()
        if line.startswith("Epoch ") and "loss: " in line
    ]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert "Training finished." in out


def test_from_tensorflow_example(child_env, tmp_path):
    # A TF run (a child with KERAS_BACKEND=tensorflow) restored, continued, exported.
    pytest.importorskip("tensorflow", reason="the example's first part is a TensorFlow job")
    pytest.importorskip("onnxruntime", reason="the `export` extra checks the ONNX file")
    out = _run(
        child_env, "from_tensorflow.py", ["--out", str(tmp_path), "--epochs", "2"], 1, tmp_path
    )
    assert "phalanx: restored" in out and "ckpt-3 at step 30" in out
    restored, continued = (float(a) for a in out.split("test accuracy: ")[1].split()[::2][:2])
    assert continued > restored
    assert (tmp_path / "served" / "digits" / "saved_model.pb").exists()
    assert (tmp_path / "served" / "digits.onnx").exists()
