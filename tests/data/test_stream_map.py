"""A map after a streaming op hands its threads tasks of several elements: same results,
errors at their element, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phalanx._src.data import executors
from phalanx.data import AUTOTUNE, Dataset

N = 100


def _stream(fn, **map_kwargs):
    """A streaming pipeline (after `filter` there is no random access) mapped by `fn`."""
    ds = Dataset.range(N).filter(lambda x: x % 7 != 3)
    return ds.map(fn, **map_kwargs)


def _square(x):
    return x * x


def _cursor(iterator):
    """The _ParallelMapCursor inside an iterator over `_stream(...)`."""
    seen, todo = set(), [iterator]
    while todo:
        obj = todo.pop()
        if isinstance(obj, executors._ParallelMapCursor):
            return obj
        if id(obj) in seen or not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        todo.extend(vars(obj).values())
    raise AssertionError("no streaming map cursor in the iterator")


@pytest.fixture
def big_tasks(monkeypatch):
    """Every task as large as allowed, however long an element takes (no timing in tests)."""
    monkeypatch.setattr(executors, "_TASK_SECONDS", 1e9)


def test_the_task_size_follows_the_time_an_element_takes():
    it = iter(_stream(_square, num_parallel_calls=2))
    next(it)
    cursor = _cursor(it)
    for mapped, seconds, size in [(4, 1e-4, 8), (1, 0.0075, 1), (4, 0.0048, 4), (2, 0.0, 8)]:
        cursor._learn(mapped, seconds)
        assert cursor._task == size, (mapped, seconds)


def test_tasks_of_several_elements_give_the_inline_results(big_tasks):
    reference = [int(v) for v in _stream(_square)]
    assert len(reference) == N - 14
    it = iter(_stream(_square, num_parallel_calls=2))
    got = [int(next(it)) for _ in range(20)]
    assert _cursor(it)._task == executors._MAX_TASK
    assert got + [int(v) for v in it] == reference


def _predicted(monkeypatch, table):
    """AUTOTUNE's model predicts `table[width]` seconds between elements (no timing)."""
    from phalanx._src.data import autotune

    monkeypatch.setattr(autotune.Tuner, "_predict", lambda self, width, serial: table[width])


def test_autotune_bursts_single_elements_then_tasks_grow(big_tasks, monkeypatch):
    _predicted(monkeypatch, {0: 1.0, 1: 0.9, 2: 0.5})
    ds = _stream(_square, num_parallel_calls=AUTOTUNE)
    it = iter(ds)
    got = [int(next(it))]  # timed inline
    cursor = _cursor(it)
    assert (cursor._width, cursor._budget) == (2, 2)  # a burst of 2 single elements
    got += [int(next(it)) for _ in range(2)]
    assert ds.autotune_report.startswith("AUTOTUNE chose 2 threads after 3 elements")
    assert cursor._budget is None
    got += [int(next(it)) for _ in range(30)]
    assert cursor._task == executors._MAX_TASK
    assert got + [int(v) for v in it] == [int(v) for v in _stream(_square)]


def _fails_at_18(x):
    if x == 18:
        raise ValueError("element 18 is bad")
    return x


def test_an_error_inside_a_task_comes_after_the_elements_before_it(big_tasks):
    it = iter(_stream(_fails_at_18, num_parallel_calls=2))
    got = []
    with pytest.raises(ValueError, match="element 18 is bad"):
        for value in it:
            got.append(int(value))
    assert got == [x for x in range(18) if x % 7 != 3]


@pytest.mark.parametrize("stop", [1, 13, 40])
def test_a_restored_iterator_continues_exactly_mid_task(stop, big_tasks):
    reference = [int(v) for v in _stream(_square)]
    it = iter(_stream(_square, num_parallel_calls=2))
    head = [int(next(it)) for _ in range(stop)]
    state = json.loads(json.dumps(it.get_state()))
    restored = iter(_stream(_square, num_parallel_calls=2))
    restored.set_state(state)
    assert head + [int(v) for v in restored] == reference
    assert [int(v) for v in it] == reference[stop:]


def test_arrays_come_back_in_order_from_tasks(big_tasks):
    def image(x):
        return np.full((4, 5, 3), x, np.uint8), x

    batches = list(_stream(image, num_parallel_calls=3).batch(8))
    labels = np.concatenate([b[1] for b in batches])
    assert labels.tolist() == [x for x in range(N) if x % 7 != 3]
    for pixels, label in batches:
        assert np.array_equal(pixels[:, 0, 0, 0], label.astype(np.uint8))


def test_autotune_maps_each_width_on_a_pool_of_its_width(monkeypatch):
    # A burst of 2 threads, then 1 thread (within 10 % of 2: the fewer workers); going from
    # 2 threads to 1 must not keep the 2-thread pool (it once measured "1 thread" at the
    # speed of 2).
    from phalanx._src.data import autotune

    def predict(tuner, width, serial):  # 1 thread looks as good as 2 once they are measured
        measured = bool(tuner._shares)
        return {0: 1.0, 1: 0.52 if measured else 0.9, 2: 0.5}[width]

    monkeypatch.setattr(autotune.Tuner, "_predict", predict)
    pools, mismatched = [], []
    real_pool = executors.concurrent.futures.ThreadPoolExecutor

    class Pool(real_pool):
        def __init__(self, workers, **kwargs):
            super().__init__(workers, **kwargs)
            self.width = workers
            pools.append(workers)

        def submit(self, fn, *args):
            width = max(args[0].tuner.level, 1)  # args[0]: the map node; its tuner's level
            if width != self.width:
                mismatched.append((self.width, width))
            return super().submit(fn, *args)

    monkeypatch.setattr(executors.concurrent.futures, "ThreadPoolExecutor", Pool)
    ds = _stream(_square, num_parallel_calls=AUTOTUNE)
    expected = [x * x for x in range(N) if x % 7 != 3]
    assert list(ds) == expected
    assert ds.autotune_report.startswith("AUTOTUNE chose 1 thread after 3 elements")
    assert mismatched == []
    assert pools == [2, 1]


def test_leaving_threads_hands_out_the_elements_in_flight_then_maps_inline(monkeypatch):
    table = {0: 1.0, 1: 0.9, 2: 0.5}
    _predicted(monkeypatch, table)
    it = iter(_stream(_square, num_parallel_calls=AUTOTUNE))
    got = [int(next(it)) for _ in range(12)]
    cursor = _cursor(it)
    assert cursor._width == 2 and cursor._pending  # tasks in flight
    table.update({0: 0.5, 2: 1.0})  # the calling thread is now faster
    got += [int(v) for v in it]
    assert got == [x * x for x in range(N) if x % 7 != 3]
    assert cursor._width == 0 and cursor._pool is None


def test_the_consumers_own_time_never_holds_the_elements_of_a_width_left(monkeypatch):
    # The consumer works 1 s (a fake clock) between two requests. After a width change the
    # elements in flight at the old width are handed out untimed; the next timed element's
    # own time once ran from the last *timed* hand-out, so it held all of those (39 s
    # here), and AUTOTUNE took the consumer for the bottleneck at every width.
    import time
    import types

    from phalanx._src.data import autotune

    table = {0: 1.0, 1: 0.9, 2: 0.5}
    _predicted(monkeypatch, table)
    now = [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: now[0], thread_time=time.thread_time)
    monkeypatch.setattr(executors, "time", clock)
    owns = []
    consumed = autotune.Tuner.consumed

    def recording(self, own, wait, cpu, fill=False):
        owns.append(own)
        return consumed(self, own, wait, cpu, fill)

    monkeypatch.setattr(autotune.Tuner, "consumed", recording)
    it = iter(_stream(_square, num_parallel_calls=AUTOTUNE))
    got = []
    for _ in range(12):
        got.append(int(next(it)))
        now[0] += 1.0
    cursor = _cursor(it)
    assert cursor._width == 2 and cursor._pending  # tasks in flight
    table.update({0: 0.5, 2: 1.0})  # inline is now faster: the threads' tasks drain
    for value in it:
        got.append(int(value))
        now[0] += 1.0
    assert got == [x * x for x in range(N) if x % 7 != 3]
    assert cursor._width == 0
    timed = [own for own in owns if own is not None]
    assert len(timed) > 12 and max(timed) == 1.0
