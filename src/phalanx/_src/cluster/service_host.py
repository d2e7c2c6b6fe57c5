"""JAX's coordination service runs in a helper process, so process 0's death can be reported.

JAX hosts its coordination service (key-value store, heartbeats, barriers) inside process 0.
When process 0 dies, every other process loses the connection and JAX's error-polling thread
aborts it within ~0.1 s (SIGABRT, a C++ stack trace), before any Python can run. A Python
`missed_heartbeat_callback` for the client cannot help either: jaxlib 0.10 fails to hand the
error status to Python (`std::bad_cast`) and terminates.

So process 0 starts the service in a small helper process instead (`hosted_outside`). When
process 0 dies, the service lives on, process 0's heartbeat counter stops, and every
survivor's `PeerWatchdog` names process 0 and exits. The helper ends:

* at once when process 0 shuts JAX's distributed system down (the job's normal end);
* `linger` s after process 0 dies (its end of the helper's stdin closes): JAX's heartbeat
  timeout plus `LINGER_MARGIN_SECONDS`, long enough for the survivors' watchdogs to speak
  and for JAX's own timeout to remain the backstop;
* with process 0's process group when a launcher or scheduler SIGKILLs it.

It ignores SIGTERM and SIGINT: a scheduler's SIGTERM is a preemption notice that the
processes agree on through this very service, and Ctrl-C is process 0's to handle.

This file is also the helper's program (`python -P service_host.py ARGUMENTS_JSON`); run as
a script it imports only the standard library and jaxlib, so it starts in a fraction of a
second.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

READY = b"ready\n"
STOP = b"stop\n"
START_TIMEOUT_SECONDS = 60  # binding the port takes ~0.3 s; a loaded host can take longer
STOP_TIMEOUT_SECONDS = 10
LINGER_MARGIN_SECONDS = 5
JAX_DEFAULT_HEARTBEAT_SECONDS = 100  # jax.distributed.initialize's default


class ServiceHost:
    """Process 0's handle on the helper process; stands in for JAX's service object.

    Args:
      process: the running helper (stdin a pipe).
    """

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def shutdown(self) -> None:
        """Stop the service and wait for the helper to exit (JAX calls this at shutdown)."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # the helper is already gone
                stdin.write(STOP)
                stdin.flush()
            with contextlib.suppress(BrokenPipeError):
                stdin.close()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_service_host(address: str, num_nodes: int, **options: Any) -> ServiceHost:
    """Start the coordination service in a helper process; return once it listens.

    Takes the arguments of jaxlib's `get_distributed_runtime_service`, which it replaces.

    Args:
      address: "host:port" to bind.
      num_nodes: processes in the job.
      **options: the service's keyword options (heartbeat_timeout, shutdown_timeout, ...).

    Returns:
      A `ServiceHost` whose `shutdown()` stops the helper.

    Raises:
      RuntimeError: the helper exited or did not listen within `START_TIMEOUT_SECONDS`
        (its error, e.g. an address that is not this host's, is on this process's stderr).

    Example:
      >>> host = start_service_host("127.0.0.1:1234", 2, heartbeat_timeout=30)
      >>> host.shutdown()
    """
    arguments = json.dumps({"address": address, "num_nodes": num_nodes, "options": options})
    process = subprocess.Popen(
        # -P: the script's folder holds phalanx modules that must not shadow anything.
        [sys.executable, "-P", __file__, arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # the service's own log lines go to process 0's stderr
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_SECONDS)
    line = process.stdout.readline() if ready else b""
    process.stdout.close()
    if line != READY:
        ServiceHost(process).shutdown()
        raise RuntimeError(
            f"phalanx could not start JAX's coordination service on {address} for "
            f"{num_nodes} processes (helper exit status {process.returncode}; its log is on "
            "stderr); process 0 must run on the coordinator's host: check that the address "
            "is one of this host's, e.g. PHALANX_COORDINATOR_ADDRESS=<this host's IP>:<port>"
        )
    return ServiceHost(process)


@contextlib.contextmanager
def hosted_outside() -> Iterator[None]:
    """Within the block, `jax.distributed.initialize` hosts its service in a helper process.

    JAX creates the service only in process 0, through jaxlib's
    `get_distributed_runtime_service`; this swaps in `start_service_host` and restores the
    original in `finally`. JAX's `shutdown()` later calls `ServiceHost.shutdown()`.

    Example:
      >>> with hosted_outside():
      ...     jax.distributed.initialize("127.0.0.1:1234", num_processes=2, process_id=0)
    """
    from jax._src.lib import _jax  # the module jax.distributed looks the factory up in

    original = _jax.get_distributed_runtime_service
    _jax.get_distributed_runtime_service = start_service_host
    try:
        yield
    finally:
        _jax.get_distributed_runtime_service = original


def _serve(arguments: str, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The helper: run the service until process 0 says stop, or `linger` s after it died."""
    from jaxlib import _jax  # jaxlib alone starts in ~0.3 s; `import jax` takes seconds

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    spec = json.loads(arguments)
    options = spec["options"]
    _check_bindable(spec["address"])
    service = _jax.get_distributed_runtime_service(spec["address"], spec["num_nodes"], **options)
    stdout.write(READY)
    stdout.flush()
    stdout.close()
    stopped = stdin.readline() == STOP  # blocks for the life of the job
    if not stopped:
        # Process 0 died: keep the service up while the survivors notice and report it.
        heartbeat = options.get("heartbeat_timeout") or JAX_DEFAULT_HEARTBEAT_SECONDS
        threading.Event().wait(heartbeat + LINGER_MARGIN_SECONDS)
    service.shutdown()


def _check_bindable(address: str) -> None:
    """Exit with a clear message if `address` is not this host's (jaxlib would segfault)."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    try:
        found = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as error:
        sys.exit(f"phalanx: cannot listen on {address} ({host}: {error.strerror})")
    errors = []
    for family, kind, proto, _, sockaddr in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as gRPC binds
            try:
                probe.bind(sockaddr)
                return
            except OSError as error:
                errors.append(f"{sockaddr[0]}: {error.strerror}")
    sys.exit(f"phalanx: cannot listen on {address} ({'; '.join(errors)})")


if __name__ == "__main__":
    _serve(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)
