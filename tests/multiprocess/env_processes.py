"""Start N processes the way a scheduler does: only the PHALANX_* variables, no launcher.

Every wait is bounded: a process still running at the deadline is SIGKILLed (SIGTERM would
be taken by JAX's preemption notifier) and the test fails with every log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx._src.launch import pick_port

SCRIPT = Path(__file__).with_name("pods_script.py")


def start(
    args: Sequence[str],
    *,
    num_processes: int,
    log_dir: Path,
    cpu_devices: int = 2,
    env: Mapping[str, str] | None = None,
    only: Sequence[int] | None = None,
) -> tuple[list[subprocess.Popen], list[Path], str]:
    """Start `pods_script.py ARGS` as processes `only` (default all) of `num_processes`.

    Returns:
      (the processes, their log files, the coordinator address).
    """
    address = f"127.0.0.1:{pick_port()}"
    procs, logs = [], []
    for i in only if only is not None else range(num_processes):
        penv = {
            **os.environ,
            "PHALANX_COORDINATOR_ADDRESS": address,
            "PHALANX_NUM_PROCESSES": str(num_processes),
            "PHALANX_PROCESS_ID": str(i),
            "PHALANX_CPU_DEVICES": str(cpu_devices),
            "JAX_PLATFORMS": "cpu",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        log = log_dir / f"env-process-{i}.log"
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(SCRIPT), *args],
                    env=penv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        logs.append(log)
    return procs, logs, address


def wait(procs: Sequence[subprocess.Popen], logs: Sequence[Path], timeout: float) -> list[float]:
    """Wait for every process; return each one's exit time (time.time()).

    Raises:
      AssertionError: a process was still running after `timeout` s (it is SIGKILLed; the
        message holds every log's tail).
    """
    deadline = time.monotonic() + timeout
    ended: dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.time()
        time.sleep(0.05)
    hung = [i for i in range(len(procs)) if i not in ended]
    for i in hung:
        procs[i].kill()
        procs[i].wait()
    if hung:
        raise AssertionError(f"processes {hung} hung past {timeout} s\n{tails(logs)}")
    return [ended[i] for i in range(len(procs))]


def tails(logs: Sequence[Path], lines: int = 25) -> str:
    """Every log's last lines, for failure messages."""
    parts = []
    for log in logs:
        text = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"----- {log.name} -----\n" + "\n".join(text))
    return "\n".join(parts)
