"""The coordination service's helper process: listens, stops on request, outlives process 0
only for a bounded time, and ignores SIGTERM (a preemption notice the job agrees on through
it)."""

from __future__ import annotations

import signal
import socket
import time

import pytest
from jax._src.lib import _jax

from phalanx._src.cluster.service_host import (
    LINGER_MARGIN_SECONDS,
    ServiceHost,
    hosted_outside,
    start_service_host,
)
from phalanx._src.launch import pick_port


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return False
    return True


@pytest.fixture
def port():
    return pick_port()


def test_the_helper_listens_and_stops_at_once_on_shutdown(port):
    host = start_service_host(f"127.0.0.1:{port}", 2, heartbeat_timeout=30)
    assert _listening(port)
    started = time.monotonic()
    host.shutdown()
    assert host.process.returncode == 0
    assert time.monotonic() - started < 5
    assert not _listening(port)


def test_the_helper_ignores_sigterm(port):
    host = start_service_host(f"127.0.0.1:{port}", 2, heartbeat_timeout=30)
    try:
        host.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert host.process.poll() is None and _listening(port)
    finally:
        host.shutdown()


def test_when_process_0_dies_the_helper_lingers_for_the_heartbeat_timeout_then_exits(port):
    host = start_service_host(f"127.0.0.1:{port}", 2, heartbeat_timeout=1)
    host.process.stdin.close()  # what process 0's death does to the pipe
    started = time.monotonic()
    time.sleep(LINGER_MARGIN_SECONDS - 2)
    assert host.process.poll() is None and _listening(port)  # survivors can still report
    try:
        host.process.wait(timeout=10)
    finally:
        host.shutdown()  # kills it if it is still there
    linger = 1 + LINGER_MARGIN_SECONDS  # heartbeat_timeout=1
    assert linger - 1 < time.monotonic() - started < linger + 5
    assert host.process.returncode == 0


def test_an_address_of_another_host_is_a_clear_error(port, capfd):
    with pytest.raises(RuntimeError, match=r"10\.255\.255\.1:\d+ for 2 processes .* this host"):
        start_service_host(f"10.255.255.1:{port}", 2)
    helper_said = capfd.readouterr().err
    assert (
        f"phalanx: cannot listen on 10.255.255.1:{port} (10.255.255.1: Cannot assign" in helper_said
    )


def test_hosted_outside_swaps_jaxs_factory_and_restores_it():
    original = _jax.get_distributed_runtime_service
    with pytest.raises(KeyError), hosted_outside():
        assert _jax.get_distributed_runtime_service is start_service_host
        raise KeyError("initialize failed")
    assert _jax.get_distributed_runtime_service is original


def test_shutdown_of_a_helper_that_already_exited_is_quiet(port):
    host = start_service_host(f"127.0.0.1:{port}", 2, heartbeat_timeout=30)
    host.process.kill()
    host.process.wait()
    ServiceHost(host.process).shutdown()
    assert host.process.returncode == -signal.SIGKILL
