"""`phalanx launch`: run a program as N cooperating JAX processes on this machine."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx._src.launch import LaunchResult

HELP = "run a command as N local JAX processes (e.g. phalanx launch -n 2 -- python train.py)"
TIMEOUT_STATUS = 124  # what `timeout(1)` returns, so shell scripts can tell a timeout apart


def configure(parser: argparse.ArgumentParser) -> None:
    """Add launch's arguments to its subparser."""
    parser.add_argument("-n", "--num-processes", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="CPU devices per process; also restricts JAX to the CPU (default: leave as is)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--log-dir", default=None, help="folder for process-<i>.log files")
    parser.add_argument(
        "--no-fail-fast",
        dest="fail_fast",
        action="store_false",
        help="keep JAX's long timeouts instead of second-scale ones",
    )
    parser.add_argument("--quiet", action="store_true", help="do not echo the processes' output")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")


def exit_status(result: LaunchResult) -> int:
    """Return the shell status for a launch: 0, 124 on timeout, else the first failure's."""
    if result.ok:
        return 0
    if result.timed_out:
        return TIMEOUT_STATUS
    code = next(p.returncode for p in result.processes if p.returncode != 0 and not p.killed)
    return code if code > 0 else 128 + (-code if -code in signal.valid_signals() else 1)


def run(args: argparse.Namespace) -> int:
    """Launch, echo output live, print the report on failure, return the exit status."""
    from phalanx._src.launch import launch

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print(
            "phalanx launch: error: no command; use e.g. phalanx launch -n 2 -- python train.py",
            file=sys.stderr,
        )
        return 2
    try:
        result = launch(
            command,
            num_processes=args.num_processes,
            cpu_devices=args.cpu_devices,
            timeout=args.timeout,
            log_dir=args.log_dir,
            fail_fast=args.fail_fast,
            check=False,
            stream=None if args.quiet else sys.stdout,
        )
    except (ValueError, TypeError, OSError) as error:
        print(f"phalanx launch: error: {error}", file=sys.stderr)
        return 2
    if not result.ok:
        print(result.report(), file=sys.stderr)
    return exit_status(result)
