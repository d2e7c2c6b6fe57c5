"""Run a test body in N cooperating JAX processes, like an ordinary test.

Write the body as a module-level function in a test file of this folder; it runs in every
process after `phalanx.cluster.resolve()` has joined them (so `jax.process_index()`,
`jax.devices()` and global meshes are ready), asserts, and returns. Plain `assert`s get
pytest's detailed messages.

    import jax
    import pytest
    from multiprocess_harness import run_multiprocess

    def _body(devices_per_process):         # runs in each process, after resolve()
        assert jax.process_count() == 2
        assert jax.device_count() == 2 * devices_per_process
        # ... build a global mesh, call collectives (every process must call each one) ...

    @pytest.mark.multiprocess
    def test_something():
        run_multiprocess(_body, cpu_devices=2, kwargs={"devices_per_process": 2})

Any failure (an assertion, an exception, a crash, a hang past `timeout`) fails the test with
every process's return code and log tail. Keep bodies short: each launch costs ~2-4 s of
process start-up on a 2-core machine.
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from phalanx._src.launch import LaunchResult, launch

RUNNER = Path(__file__).with_name("mp_body_runner.py")
DEFAULT_TIMEOUT = 60.0


def body_command(body: Callable[..., Any], kwargs: Mapping[str, Any] | None = None) -> list[str]:
    """Return the command that runs `body(**kwargs)` in a fresh interpreter.

    Raises:
      ValueError: `body` is not a module-level function (a lambda or a nested function
        cannot be found again by name in another process).
    """
    qualname = getattr(body, "__qualname__", "")
    if not inspect.isfunction(body) or "<" in qualname:
        raise ValueError(
            f"run_multiprocess needs a module-level function, got {body!r}; define the body "
            "with `def _body(...)` at the top level of the test file"
        )
    source = inspect.getsourcefile(body)
    if source is None:
        raise ValueError(f"cannot find the source file of {qualname}")
    return [
        sys.executable,
        str(RUNNER),
        str(Path(source).resolve()),
        qualname,
        json.dumps(dict(kwargs or {})),
    ]


def run_multiprocess(
    body: Callable[..., Any],
    *,
    num_processes: int = 2,
    cpu_devices: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    log_dir: str | Path | None = None,
) -> LaunchResult:
    """Run `body(**kwargs)` in `num_processes` processes of `cpu_devices` CPU devices each.

    Every process calls `phalanx.cluster.resolve()` first (all of them must, since it joins
    the job), then the body. A body that raises makes its process exit 1 at once; the
    launcher then SIGKILLs the others.

    Args:
      body: a module-level function; its arguments come from `kwargs`.
      num_processes: processes to start.
      cpu_devices: CPU devices per process.
      timeout: seconds for the whole run, start-up included.
      kwargs: JSON-serialisable keyword arguments for the body.
      env: extra environment variables for the processes.
      check: raise `LaunchError` (with every log) unless all processes exit 0.
      log_dir: where to keep the logs; None uses a temporary folder removed afterwards (the
        result and any error still hold the output).

    Returns:
      The `LaunchResult`; `result.processes[i].output` holds process i's log.

    Raises:
      LaunchError: (with `check=True`) a process failed or the run timed out.
    """
    command = body_command(body, kwargs)
    with tempfile.TemporaryDirectory(prefix="phalanx-mp-") as tmp:
        return launch(
            command,
            num_processes=num_processes,
            cpu_devices=cpu_devices,
            timeout=timeout,
            log_dir=log_dir if log_dir is not None else tmp,
            env=env,
            check=check,
        )
