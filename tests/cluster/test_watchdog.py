"""The peer watchdog and start-up timer, driven by a fake coordination service and clock."""

from __future__ import annotations

import pytest

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
