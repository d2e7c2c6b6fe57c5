"""Process workers: same elements, order and resume as sequential; clean stops, even on kill."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from phalanx.data import AUTOTUNE, Dataset, RemoteTraceback

N = 23


def augment(image, label):
    """A Python-bound per-example map, as augmentation code is (module-level: picklable)."""
    flipped = image[:, ::-1] if int(label) % 2 else image
    return (flipped * 2.0 + 1.0).astype(np.float32), label


def fail_on_seven(image, label):
    if int(label) == 7:
        raise KeyError(f"label {int(label)} is not allowed")
    return image, label


def pipeline(**map_kwargs):
    images = np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4)
    labels = np.arange(N, dtype=np.int32)
    ds = Dataset.from_tensor_slices((images, labels)).shuffle(N, seed=5)
    return ds.map(augment, **map_kwargs).batch(4)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


def _alive(pid):
    """Whether a process exists and is not a zombie (a reaped worker is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids, seconds=10.0):
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_process_workers_match_sequential_and_resume_mid_epoch():
    serial, workers = pipeline(), pipeline(num_parallel_calls=2, workers="process")
    _same(list(serial), list(workers))  # epoch 0
    it = iter(workers)  # epoch 1, reshuffled
    head = [next(it) for _ in range(2)]
    pids = it.worker_pids
    assert len(pids) == 2
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    serial_epoch1 = iter(pipeline())
    serial_epoch1.set_state({**state, "step": 0})
    _same(head + rest, list(serial_epoch1))
    restored = iter(pipeline(num_parallel_calls=2, workers="process"))
    restored.set_state(state)
    _same(rest, list(restored))
    # the workers outlive an epoch's end, for the next epoch (as persistent_workers)...
    it = iter(workers)
    next(it)
    assert it.worker_pids == pids
    list(it)
    # ...and stop with the dataset
    del workers, it, restored
    gc.collect()
    assert _wait_gone(pids) == []
    assert not multiprocessing.active_children()


def test_with_workers_and_autotune_over_processes_give_the_same_batches():
    reference = list(pipeline())
    _same(reference, list(pipeline().with_workers(2)))
    tuned = pipeline(num_parallel_calls=AUTOTUNE, workers="process")
    _same(reference, list(tuned))
    with pytest.raises(ValueError, match="workers must be 'thread' or 'process'"):
        pipeline(num_parallel_calls=2, workers="processes")


def test_a_worker_exception_reaches_the_user_with_its_traceback_and_workers_stop():
    images = np.zeros((10, 2), np.float32)
    ds = Dataset.from_tensor_slices((images, np.arange(10, dtype=np.int32)))
    ds = ds.map(fail_on_seven, num_parallel_calls=2, workers="process").batch(2)
    it = iter(ds)
    got = [next(it) for _ in range(3)]  # the batches before the failing one arrive
    assert [list(b[1]) for b in got] == [[0, 1], [2, 3], [4, 5]]
    pids = it.worker_pids
    with pytest.raises(KeyError, match="label 7 is not allowed") as raised:
        next(it)
    cause = raised.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "fail_on_seven" in str(cause) and "raise KeyError" in str(cause)
    assert _wait_gone(pids) == []
    assert not multiprocessing.active_children()


def test_workers_stop_when_the_consumer_stops_early():
    it = iter(pipeline(num_parallel_calls=2, workers="process"))
    next(it)
    pids = it.worker_pids
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    del it  # a `break` out of a for loop drops the iterator the same way
    gc.collect()
    assert _wait_gone(pids) == []
    assert not multiprocessing.active_children()


def test_an_unpicklable_map_gets_a_clear_error():
    lock = threading.Lock()
    ds = Dataset.from_tensor_slices(np.zeros((4, 1), np.float32))
    ds = ds.map(lambda v: (lock, v)[1], num_parallel_calls=2, workers="process")
    with pytest.raises(TypeError, match=r"cannot be pickled.*drop workers='process'"):
        next(iter(ds))


_CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from test_workers import pipeline

    if __name__ == "__main__":
        it = iter(pipeline(num_parallel_calls=2, workers="process"))
        for _ in range(3):
            next(it)
        print(json.dumps({{"state": it.get_state(), "pids": it.worker_pids}}), flush=True)
        time.sleep(120)
    """
)


def test_killing_the_parent_leaves_no_workers_and_the_state_resumes_exactly(child_env, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=os.path.dirname(__file__)))
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=child_env
    )
    try:
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready, "the child printed nothing in 120 s"
        report = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert len(report["pids"]) == 2
    assert _wait_gone(report["pids"], seconds=15) == []
    uninterrupted = list(pipeline())
    restored = iter(pipeline(num_parallel_calls=2, workers="process"))
    restored.set_state(report["state"])
    _same(uninterrupted[3:], list(restored))


def test_autotune_over_processes_starts_its_workers_once_and_stops_them_all(monkeypatch):
    from phalanx._src.data import autotune, workers

    # Deterministic predictions: 2 processes beat 1, which beats the calling thread. With
    # no GIL between processes there is no burst: AUTOTUNE starts 2 processes at once.
    table = {0: 1.0, 1: 0.6, 2: 0.5}
    monkeypatch.setattr(autotune.Tuner, "_predict", lambda self, width, serial: table[width])
    started = []  # (workers, pids) of every pool of worker processes started
    init = workers.Processes.__init__

    def counted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        started.append((self.workers, self.pids))

    monkeypatch.setattr(workers.Processes, "__init__", counted)
    images = np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4)
    serial = Dataset.from_tensor_slices((images, np.arange(N, dtype=np.int32))).shuffle(N, seed=5)
    tuned = serial.map(augment, num_parallel_calls=AUTOTUNE, workers="process").batch(4)
    serial = serial.map(augment).batch(4)
    options = tuned.options()
    options.threading.private_threadpool_size = 2
    tuned = tuned.with_options(options)
    it = iter(tuned)
    _same(list(serial), list(it))
    assert tuned.autotune_report.startswith("AUTOTUNE chose 2 processes after 1 element;")
    _same(list(serial), list(tuned))  # the next epoch runs on the kept 2 processes
    assert [count for count, _ in started] == [2]
    table.update({0: 0.4})  # now the calling thread is faster: the workers stop
    _same(list(serial), list(tuned))
    assert tuned.autotune_report.startswith("AUTOTUNE chose the calling thread")
    assert _wait_gone(started[0][1]) == []
    del it, tuned
    gc.collect()
    assert not multiprocessing.active_children()


def test_drain_hands_over_the_elements_in_flight_and_a_failed_pool_is_not_kept():
    from phalanx._src.data import plan, workers

    node = pipeline()._node
    pool = workers.Processes(node, 2, depth=2)
    try:
        expected = [plan.element(node, (0,), step) for step in range(6)]
        pool.begin((0,), 0, 6)
        got = [pool.next()]
        got += pool.drain()  # what was in flight (2 workers, 2 each)
        assert len(got) >= 4 and pool.idle and pool.alive
        _same(got, expected[: len(got)])
        pool.begin((0,), 0, 6)  # the freed slots serve again
        _same([pool.next() for _ in range(6)], expected)
    finally:
        pool.close()
    images = np.zeros((10, 2), np.float32)
    ds = Dataset.from_tensor_slices((images, np.arange(10, dtype=np.int32)))
    node = ds.map(fail_on_seven).batch(2)._node
    pool = workers.Processes(node, 2, depth=2)
    pool.begin((0,), 0, 5)
    pool.next()
    # Batch 3 (labels 6, 7) fails: drain stops before it and stops the workers, so that
    # whoever computes it next raises the error; nothing is parked.
    assert [list(b[1]) for b in pool.drain()] == [[2, 3], [4, 5]]
    parked = []
    pool.release(parked.append)
    assert parked == [] and not pool.alive
    assert _wait_gone(pool.pids) == []
    # A worker killed with elements in flight: nothing is parked either.
    pool = workers.Processes(node, 2, depth=2)
    pool.begin((0,), 0, 3)
    pool.next()
    os.kill(pool.pids[1], signal.SIGKILL)
    assert _wait_gone(pool.pids[1:]) == []
    drained = [list(b[1]) for b in pool.drain()]  # what came before the death, in order
    assert drained in ([], [[2, 3]], [[2, 3], [4, 5]])
    pool.release(parked.append)
    assert parked == [] and not pool.alive
    assert _wait_gone(pool.pids) == []
    assert not multiprocessing.active_children()
