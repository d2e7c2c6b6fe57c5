"""The peer watchdog and start-up timer, driven by a fake coordination service and clock."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from phalanx._src.cluster.native_terminate import NATIVE_ABORT_STATUS
from phalanx._src.cluster.watchdog import PeerWatchdog, StartupTimer


class FakeClient:
    """The two key-value calls the watchdog makes; `alive` peers post on every round."""

    def __init__(self, alive):
        self.store = {}
        self.alive = set(alive)
        self.down = False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE: connection refused")
        self.store[key] = value

    def key_value_dir_get(self, prefix):
        if self.down:
            raise RuntimeError("UNAVAILABLE: connection refused")
        for peer in self.alive:
            key = f"{prefix}{peer}"
            self.store[key] = str(int(self.store.get(key, "0")) + 1)
        return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _watchdog(client, clock, said, process_id=0, n=3):
    dog = PeerWatchdog(client, process_id, n, timeout=20, die=said.append, clock=clock)
    dog._seen = {p: ("", clock()) for p in range(n)}  # what start() does, without the thread
    return dog


def test_a_silent_peer_is_named_after_the_timeout_and_not_before():
    client, clock, said = FakeClient(alive=[1]), Clock(), []
    dog = _watchdog(client, clock, said)
    for _ in range(19):
        clock.now += 1
        assert dog.check()
    assert said == []
    clock.now += 2  # process 2 never posted: 21 s of silence
    assert not dog.check()
    assert said[0].startswith("phalanx: process 2 of 3 stopped responding 21 s ago; ")
    assert "BackupAndRestore" in said[0] and "restart" in said[0]


def test_a_peer_that_stops_posting_is_timed_from_its_last_post():
    client, clock, said = FakeClient(alive=[1, 2]), Clock(), []
    dog = _watchdog(client, clock, said)
    for _ in range(10):
        clock.now += 1
        assert dog.check()
    client.alive.discard(1)  # dies at t=110
    for _ in range(20):
        clock.now += 1
        assert dog.check()
    clock.now += 1
    assert not dog.check()
    assert said == [said[0]] and said[0].startswith("phalanx: process 1 of 3 stopped responding 21")


def test_a_silent_process_0_is_named_as_the_coordinator():
    # Its service lives on in a helper process (see service_host): only its counter stops.
    client, clock, said = FakeClient(alive=[2]), Clock(), []
    dog = _watchdog(client, clock, said, process_id=1)
    clock.now += 21
    assert not dog.check()
    assert said[0].startswith("phalanx: process 0 of 3 (the coordinator) stopped responding 21 s")


def test_an_unreachable_coordinator_is_reported_as_process_0(monkeypatch):
    monkeypatch.setattr("phalanx._src.cluster.watchdog._still_joined", lambda: True)
    client, clock, said = FakeClient(alive=[0, 2]), Clock(), []
    dog = _watchdog(client, clock, said, process_id=1)
    clock.now += 1
    assert dog.check()
    client.down = True
    clock.now += 3
    assert not dog.check()
    assert said[0].startswith("phalanx: process 0 of 3 (the coordinator) stopped responding 3 s")


def test_an_orderly_shutdown_is_not_reported(monkeypatch):
    monkeypatch.setattr("phalanx._src.cluster.watchdog._still_joined", lambda: True)
    client, clock, said = FakeClient(alive=[0]), Clock(), []
    dog = _watchdog(client, clock, said, process_id=1, n=2)
    dog.exiting = True  # interpreter exit: JAX's shutdown takes the service away
    client.down = True
    assert not dog.check()
    assert said == []


@pytest.mark.parametrize(
    ("process_id", "n", "named"),
    [(0, 2, "process(es) 1 to join"), (0, 4, "among 1, 2, 3"), (2, 4, "0 (the coordinator)")],
)
def test_the_startup_timer_names_the_missing_processes_and_the_coordinator(process_id, n, named):
    said = []
    timer = StartupTimer(process_id, n, "10.0.0.1:1234", 60, die=said.append)
    timer._expired()
    assert said[0].startswith(f"phalanx: process {process_id} of {n} gave up after 60 s waiting")
    assert named in said[0]
    assert "10.0.0.1:1234" in said[0] and "PHALANX_INIT_TIMEOUT" in said[0]


def test_the_startup_timer_is_cancelled_once_joined():
    said = []
    with StartupTimer(0, 2, "127.0.0.1:1", 0.05, die=said.append) as timer:
        pass
    timer._timer.join(1)
    assert said == []


class FakeHook:
    """What `TerminateHook` gives the watchdog: `fired` once a native thread terminated."""

    def __init__(self):
        self.fired = threading.Event()


def _native_watchdog(client, clock, said):
    dog = PeerWatchdog(
        client, 0, 3, timeout=20, interval=1, die=lambda *a: said.append(a), clock=clock
    )
    dog.native = FakeHook()
    dog._seen = {p: ("", clock()) for p in range(3)}
    return dog


def test_after_a_native_terminate_a_dead_peer_is_still_named():
    # Gloo saw the broken connection first: the verdict is the watchdog's, as without it.
    client, clock, said = FakeClient(alive=[1]), Clock(), []
    dog = _native_watchdog(client, clock, said)
    dog.native.fired.set()
    clock.now += 21
    assert not dog.check()
    assert said[0][0].startswith("phalanx: process 2 of 3 stopped responding 21 s ago")


def test_a_native_terminate_with_every_peer_answering_is_named_as_a_native_failure():
    client, clock, said = FakeClient(alive=[1, 2]), Clock(), []
    dog = _native_watchdog(client, clock, said)
    for _ in range(5):
        clock.now += 1
        assert dog.check()
    dog.native.fired.set()
    for _ in range(23):  # seen at the first check, then the timeout and two intervals
        clock.now += 1
        assert dog.check(), said
    clock.now += 1
    assert not dog.check()
    ((message, status),) = said
    assert status == NATIVE_ABORT_STATUS == 134
    assert message.startswith("phalanx: process 0 of 3: a native library (C++) failed")
    assert "PHALANX_NATIVE_TERMINATE=0" in message


THROW_IN_A_THREAD = """
import ctypes, sys, threading
from phalanx._src.cluster.native_terminate import TerminateHook
hook = TerminateHook.install()
throw = ctypes.CDLL("libstdc++.so.6")._ZSt21__throw_runtime_errorPKc
threading.Thread(target=throw, args=(b"Connection reset by peer",), daemon=True).start()
print("FIRED" if hook.fired.wait(30) else "NOT FIRED", flush=True)
hook.uninstall()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="libstdc++'s exception thrower, by name")
def test_an_uncaught_cpp_exception_on_a_thread_reaches_the_hook_not_the_abort(child_env):
    done = subprocess.run(
        [sys.executable, "-c", THROW_IN_A_THREAD],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "FIRED"), done.stderr
    assert "terminate called" not in done.stderr
