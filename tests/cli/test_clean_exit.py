"""A program that finished its work exits 0, every time.

The main job aborted while the interpreter exited, after printing its results, in 2 runs of
10 ("terminate called after throwing an instance of ''", status 134): a daemon thread still
held device arrays when Python finalized (see `phalanx._src.shutdown`). A race shows only
over many runs, so each program here runs 20 times, two at a time, each in a fresh process
with a fresh compilation cache.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RUNS = 20
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Makes every socket connection fail in the child process, as on a machine without network.
NO_NETWORK = """
import socket

def _no_network(*args, **kwargs):
    raise OSError("network blocked by the test")

socket.socket.connect = socket.socket.connect_ex = _no_network
socket.create_connection = socket.getaddrinfo = _no_network
"""


def _run_many(commands: list[tuple[list[str], dict[str, str]]]) -> None:
    """Runs every (argv, env), two at a time; fails naming each run that did not exit 0."""

    def run(command: tuple[list[str], dict[str, str]]) -> subprocess.CompletedProcess:
        argv, env = command
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)

    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="runs") as pool:
        done = list(pool.map(run, commands))
    failed = [
        f"run {i}: exit status {d.returncode}\n{d.stdout[-1500:]}\n{d.stderr[-1500:]}"
        for i, d in enumerate(done)
        if d.returncode != 0 or "terminate called" in d.stderr
    ]
    assert failed == [], f"{len(failed)} of {len(done)} runs failed:\n" + "\n".join(failed)


def _fresh_env(child_env: dict[str, str], folder: Path) -> dict[str, str]:
    """A child's environment with its own empty cache (no compilation cache shared)."""
    folder.mkdir(parents=True)
    env = {k: v for k, v in child_env.items() if k != "PHALANX_COMPILATION_CACHE"}
    return {**env, "XDG_CACHE_HOME": str(folder / "cache")}


def test_the_main_job_offline_exits_0_every_time(child_env, tmp_path):
    # Digits (no MNIST, no network): fit with TensorBoard logs, checkpoints and curves.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_NETWORK)
    commands = []
    for i in range(RUNS):
        env = _fresh_env(child_env, tmp_path / f"run{i}")
        env.update(
            PYTHONPATH=str(tmp_path / "site"),
            PHALANX_DATA_DIR=str(tmp_path / "nothing"),
            PHALANX_MNIST_URL="https://storage.googleapis.com/never-reached/mnist.npz",
        )
        logdir = str(tmp_path / f"run{i}" / "runs")
        argv = [sys.executable, "-m", "phalanx._src.cli.main", "train", "--json"]
        commands.append(([*argv, "--logdir", logdir], env))
    _run_many(commands)
    assert len(list(tmp_path.glob("run*/runs/*/tensorboard"))) == RUNS


def test_the_process_worker_example_exits_0_every_time(child_env, tmp_path):
    # image_folder_fit.py augments in 2 worker processes, then fits.
    folder = tmp_path / "png"
    script = [sys.executable, str(EXAMPLES / "image_folder_fit.py"), "--folder", str(folder)]
    first = _fresh_env(child_env, tmp_path / "run0")
    _run_many([([*script, "--epochs", "1", "--workers", "2"], first)])  # writes the PNGs
    commands = [
        ([*script, "--epochs", "1", "--workers", "2"], _fresh_env(child_env, tmp_path / f"run{i}"))
        for i in range(1, RUNS)
    ]
    _run_many(commands)
