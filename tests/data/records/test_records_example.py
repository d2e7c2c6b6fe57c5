"""examples/record_files.py runs: TFRecord shards written, sharded over 2 hosts, read from
ArrayRecord, and trained on with fit over 8 fake devices."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "record_files.py"
pytestmark = pytest.mark.slow


def test_record_files_example(child_env, tmp_path):
    env = {**child_env, "PHALANX_CPU_DEVICES": "8"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--epochs", "2", "--folder", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "Number of accelerators: 8" in out
    assert "Wrote 1438 examples to 8 TFRecord shards" in out
    assert len(list(tmp_path.glob("train-*-of-00008"))) == 8
    # Global batches of 16 x 8 replicas: each host reads 4 shards (720 or 718 examples)
    # in batches of 64, the last short one dropped: 11 x 64.
    assert "Host 0 of 2 reads 4 shards: 704 examples" in out
    assert "Host 1 of 2 reads 4 shards: 704 examples" in out
    assert "ArrayRecord: 1438 examples" in out
    losses = [
        float(line.split("loss: ")[1].split()[0])
        for line in out.splitlines()
        if line.startswith("Epoch ") and "loss: " in line
    ]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert "Training finished." in out
