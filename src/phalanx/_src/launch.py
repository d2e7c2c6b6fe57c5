"""Start N JAX processes on this machine, watch them, and never hang.

`launch(["python", "train.py"], num_processes=2, cpu_devices=2)` picks a free port on
127.0.0.1, starts the processes with PHALANX_COORDINATOR_ADDRESS / NUM_PROCESSES / PROCESS_ID
(read by `phalanx.cluster.resolve()`), writes each one's output to its own log file, and
waits. When one fails or the time runs out it SIGKILLs the others (SIGTERM is swallowed by
XLA's preemption notifier, and a peer blocked in a collective would otherwise wait for the
heartbeat timeout) and reports every process's return code and log tail.

Fail-fast settings (on by default) shrink JAX's timeouts from minutes to seconds, so even a
failure the launcher cannot see (a process stuck in a collective) ends quickly.
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from phalanx._src.cluster.cpu_devices import CPU_DEVICES_ENV
from phalanx._src.cluster.distributed import (
    HEARTBEAT_TIMEOUT_ENV,
    INIT_TIMEOUT_ENV,
    SHUTDOWN_TIMEOUT_ENV,
)
from phalanx._src.cluster.env_values import check_int
from phalanx._src.cluster.phalanx_env import COORDINATOR_ADDRESS, NUM_PROCESSES, PROCESS_ID

LOOPBACK = "127.0.0.1"
POLL_SECONDS = 0.05
TAIL_LINES = 40
# Seconds; small enough that a wedged job dies long before a test times out, large enough for
# first compilations and process skew on a loaded 2-core machine.
FAIL_FAST_ENV = {
    HEARTBEAT_TIMEOUT_ENV: "10",
    INIT_TIMEOUT_ENV: "60",
    SHUTDOWN_TIMEOUT_ENV: "30",
}
FAIL_FAST_XLA_FLAGS = (
    # Gloo (cross-process) collectives raise instead of waiting forever for a dead peer.
    "--xla_cpu_collective_timeout_seconds=30",
    # In-process collectives between a process's own CPU devices.
    "--xla_cpu_collective_call_terminate_timeout_seconds=30",
)
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    """How one launched process ended.

    Attributes:
      process_id: its PHALANX_PROCESS_ID.
      returncode: exit status; negative for a signal (-9: SIGKILL).
      killed: True when the launcher SIGKILLed it because another failed or time ran out.
      log_path: the file holding its stdout and stderr.
      output: the whole log.
    """

    process_id: int
    returncode: int
    killed: bool
    log_path: Path
    output: str

    def tail(self, lines: int = TAIL_LINES) -> str:
        """Return the last `lines` lines of the output."""
        return "\n".join(self.output.splitlines()[-lines:])

    def status(self) -> str:
        """Return e.g. "exit 0", "exit 1", "killed by SIGABRT", "SIGKILLed by the launcher"."""
        if self.killed:
            return "SIGKILLed by the launcher"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit {self.returncode}"


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """How a launch ended: one `ProcessResult` per process, in process-id order.

    Attributes:
      processes: the per-process results.
      elapsed_seconds: wall time from the first start to the last exit.
      timed_out: True when the overall timeout expired.
      coordinator_address: the "127.0.0.1:port" the processes were given.
    """

    processes: tuple[ProcessResult, ...]
    elapsed_seconds: float
    timed_out: bool
    coordinator_address: str

    @property
    def returncodes(self) -> tuple[int, ...]:
        """Every process's return code."""
        return tuple(p.returncode for p in self.processes)

    @property
    def ok(self) -> bool:
        """True when every process exited 0 in time."""
        return not self.timed_out and all(code == 0 for code in self.returncodes)

    def report(self, lines: int = TAIL_LINES) -> str:
        """Return a readable account: outcome, then each process's status and log tail."""
        if self.ok:
            head = f"all {len(self.processes)} processes exited 0"
        elif self.timed_out:
            head = f"timed out after {self.elapsed_seconds:.1f} s"
        else:
            failed = [p.process_id for p in self.processes if p.returncode != 0 and not p.killed]
            head = f"process(es) {failed} failed"
        parts = [
            f"launch of {len(self.processes)} processes: {head} ({self.elapsed_seconds:.1f} s)"
        ]
        if not self.ok and not self.timed_out:
            first = next(p for p in self.processes if p.returncode != 0 and not p.killed)
            parts.insert(
                0,
                f"phalanx: process {first.process_id} of {len(self.processes)} stopped "
                f"({first.status()}); the launcher stopped the others; fix its error below and "
                "restart the job (a fit with phalanx.callbacks.BackupAndRestore resumes from "
                "its last backup)",
            )
        for p in self.processes:
            parts.append(
                f"----- process {p.process_id}: {p.status()}; "
                f"log {p.log_path} (last {lines} lines) -----"
            )
            parts.append(p.tail(lines) or "(no output)")
        return "\n".join(parts)

    def check(self) -> LaunchResult:
        """Return self if every process succeeded; raise `LaunchError` otherwise."""
        if not self.ok:
            raise LaunchError(self)
        return self


class LaunchError(RuntimeError):
    """A launched process failed or the launch timed out; `.result` holds every log."""

    def __init__(self, result: LaunchResult) -> None:
        super().__init__(result.report())
        self.result = result


def pick_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now (portpicker when installed)."""
    try:
        import portpicker
    except ImportError:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            return sock.getsockname()[1]
    return portpicker.pick_unused_port()


def _merge_xla_flags(existing: str, add: Sequence[str], drop: Sequence[str]) -> str:
    names = {flag.split("=", 1)[0] for flag in add} | set(drop)
    kept = [flag for flag in existing.split() if flag.split("=", 1)[0] not in names]
    return " ".join([*kept, *add])


def process_env(
    base: Mapping[str, str],
    *,
    process_id: int,
    num_processes: int,
    coordinator_address: str,
    cpu_devices: int | None = None,
    fail_fast: bool = True,
) -> dict[str, str]:
    """Return the environment of one launched process.

    Args:
      base: the environment to start from (the launcher's, plus any extras).
      process_id: this process's index.
      num_processes: processes in the job.
      coordinator_address: "host:port" of process 0.
      cpu_devices: CPU devices per process; also restricts JAX to the CPU platform and drops
        an inherited --xla_force_host_platform_device_count. None leaves devices alone.
      fail_fast: set small heartbeat/initialization/shutdown and collective timeouts (values
        already present in `base` win for the PHALANX_* ones).

    Returns:
      A new dict; `base` is not modified.

    Example:
      >>> env = process_env({}, process_id=1, num_processes=2,
      ...                   coordinator_address="127.0.0.1:1234", cpu_devices=2)
      >>> env["PHALANX_PROCESS_ID"], env["JAX_PLATFORMS"]
      ('1', 'cpu')
    """
    env = dict(base)
    if fail_fast:
        for name, value in FAIL_FAST_ENV.items():
            env.setdefault(name, value)
    env[COORDINATOR_ADDRESS] = coordinator_address
    env[NUM_PROCESSES] = str(num_processes)
    env[PROCESS_ID] = str(process_id)
    env["PYTHONUNBUFFERED"] = "1"  # logs reach the files as they happen, not at exit
    drop: list[str] = []
    if cpu_devices is not None:
        env[CPU_DEVICES_ENV] = str(cpu_devices)
        env["JAX_PLATFORMS"] = "cpu"
        drop.append(_DEVICE_COUNT_FLAG)
    flags = _merge_xla_flags(
        env.get("XLA_FLAGS", ""), FAIL_FAST_XLA_FLAGS if fail_fast else (), drop
    )
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    return env


class _Tailer:
    """Forwards complete new lines of the log files to a stream, prefixed "[i] "."""

    def __init__(self, paths: Sequence[Path], stream: TextIO | None) -> None:
        self.paths, self.stream = paths, stream
        self.offsets = [0] * len(paths)
        self.partial = [""] * len(paths)
        # Incremental: a multi-byte character split between two reads decodes intact.
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in paths]

    def pump(self, final: bool = False) -> None:
        if self.stream is None:
            return
        for i, path in enumerate(self.paths):
            with open(path, "rb") as f:
                f.seek(self.offsets[i])
                data = f.read()
            self.offsets[i] += len(data)
            text = self.decoders[i].decode(data, final=final)
            lines = (self.partial[i] + text).split("\n")
            rest = lines.pop()  # an unfinished line; "" when the text ends with a newline
            if final and rest:
                lines.append(rest)
                rest = ""
            self.partial[i] = rest
            for line in lines:
                self.stream.write(f"[{i}] {line}\n")
        self.stream.flush()


def _kill_group(proc: subprocess.Popen) -> bool:
    """SIGKILL a process's group; True if the process itself was still running.

    The group goes even when its leader has exited: what it left behind (process 0's
    coordination-service helper, see `cluster.service_host`) ends with the launch.
    """
    running = proc.poll() is None
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: takes its children along
    except ProcessLookupError:  # the leader and everything it started are gone
        return False
    proc.wait()
    return running


def launch(
    command: Sequence[str],
    *,
    num_processes: int = 2,
    cpu_devices: int | None = None,
    timeout: float | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    fail_fast: bool = True,
    check: bool = True,
    stream: TextIO | None = None,
    cwd: str | os.PathLike[str] | None = None,
    port: int | None = None,
) -> LaunchResult:
    """Run `command` as `num_processes` cooperating JAX processes on this machine.

    Each process gets PHALANX_COORDINATOR_ADDRESS=127.0.0.1:<free port>,
    PHALANX_NUM_PROCESSES and its PHALANX_PROCESS_ID; the program calls
    `phalanx.cluster.resolve()` to join. Output goes to `log_dir/process-<i>.log`. The
    launch ends when all processes exit 0, when any fails (the others are SIGKILLed at once),
    or when `timeout` expires (all are SIGKILLed).

    Args:
      command: the program and its arguments, e.g. [sys.executable, "train.py"].
      num_processes: how many processes to start (>= 1).
      cpu_devices: CPU devices per process (PHALANX_CPU_DEVICES, JAX_PLATFORMS=cpu); None
        keeps the platform and device count the processes would get anyway.
      timeout: seconds for the whole launch; None waits indefinitely.
      log_dir: folder for the logs (created); None makes a fresh temporary folder.
      env: extra environment variables for every process, over the launcher's own.
      fail_fast: small JAX timeouts (heartbeat 10 s, collectives 30 s) so hidden hangs end.
      check: raise `LaunchError` unless every process exits 0 in time.
      stream: where to echo the processes' output live, line by line with an "[i] " prefix;
        None keeps it in the log files only.
      cwd: working directory of the processes.
      port: coordinator port; None picks a free one.

    Returns:
      A `LaunchResult` with each process's return code and output.

    Raises:
      LaunchError: (with `check=True`) a process failed or the launch timed out; the message
        holds every process's status and log tail, `.result` the full result.
      ValueError, TypeError: bad arguments.

    Example:
      >>> result = launch([sys.executable, "train.py"], num_processes=2, cpu_devices=2,
      ...                 timeout=120)
      >>> result.returncodes
      (0, 0)
    """
    if not command:
        raise ValueError(
            "command is empty; pass the program to run, e.g. [sys.executable, 'train.py']"
        )
    check_int(num_processes, "num_processes", minimum=1)
    if cpu_devices is not None:
        check_int(cpu_devices, "cpu_devices", minimum=1)
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds or None; got timeout={timeout}")
    logs = (
        Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="phalanx-launch-"))
    )
    logs.mkdir(parents=True, exist_ok=True)
    address = f"{LOOPBACK}:{port or pick_port()}"
    base = {**os.environ, **(env or {})}
    paths = [logs / f"process-{i}.log" for i in range(num_processes)]
    procs: list[subprocess.Popen] = []
    killed = [False] * num_processes
    timed_out = False
    start = time.monotonic()
    try:
        for i, path in enumerate(paths):
            penv = process_env(
                base,
                process_id=i,
                num_processes=num_processes,
                coordinator_address=address,
                cpu_devices=cpu_devices,
                fail_fast=fail_fast,
            )
            with open(path, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        list(command),
                        env=penv,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        tailer = _Tailer(paths, stream)
        while True:
            codes = [p.poll() for p in procs]
            tailer.pump()
            if any(code not in (None, 0) for code in codes) or all(code == 0 for code in codes):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                timed_out = True
                break
            time.sleep(POLL_SECONDS)
    finally:
        for i, proc in enumerate(procs):
            killed[i] = _kill_group(proc)
    elapsed = time.monotonic() - start
    tailer.pump(final=True)
    result = LaunchResult(
        processes=tuple(
            ProcessResult(
                process_id=i,
                returncode=proc.returncode,
                killed=killed[i],
                log_path=paths[i],
                output=paths[i].read_text(errors="replace"),
            )
            for i, proc in enumerate(procs)
        ),
        elapsed_seconds=elapsed,
        timed_out=timed_out,
        coordinator_address=address,
    )
    return result.check() if check else result
