"""DevicePrefetcher: order, read-ahead, exact state, and no thread left behind."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from phalanx.data import Dataset, DevicePrefetcher


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("phalanx-prefetch")]


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def dataset() -> Dataset:
    return Dataset.from_tensor_slices(np.arange(20)).shuffle(20, seed=0).batch(3)


def test_yields_put_fn_of_every_batch_in_order():
    expected = [b.tolist() for b in dataset()]
    with DevicePrefetcher(dataset(), put_fn=lambda b: ("put", b.tolist())) as batches:
        got = list(batches)
    assert got == [("put", b) for b in expected]
    assert not prefetch_threads()


def test_next_batches_are_put_ahead_of_the_consumer():
    put = []
    source = [np.array([i]) for i in range(10)]
    prefetcher = DevicePrefetcher(source, put_fn=put.append, host_depth=4, device_depth=2)
    with prefetcher.start():
        wait_until(prefetcher._producer.queue.full)
        assert put == []  # nothing is put before the consumer asks
        next(prefetcher)
        assert len(put) == 3  # batch 0, then 1 and 2 topped up
        next(prefetcher)
        # Batch 1 leaves the device buffer and batch 3 is put before step 1 runs.
        assert [int(b[0]) for b in put] == [0, 1, 2, 3]
    assert not prefetch_threads()


def test_thread_stops_when_the_consumer_leaves_early():
    with DevicePrefetcher(dataset(), host_depth=1) as batches:
        next(batches)
        assert len(prefetch_threads()) == 1
    assert not prefetch_threads()


def test_thread_stops_when_the_consumer_raises():
    with pytest.raises(RuntimeError, match="step failed"), DevicePrefetcher(dataset()) as batches:
        next(batches)
        raise RuntimeError("step failed")
    assert not prefetch_threads()


def test_thread_stops_on_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt), DevicePrefetcher(dataset()) as batches:
        for i, _ in enumerate(batches):
            if i == 2:
                raise KeyboardInterrupt
    assert not prefetch_threads()


def test_keyboard_interrupt_in_put_fn():
    def put(batch):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), DevicePrefetcher(dataset(), put_fn=put) as batches:
        next(batches)
    assert not prefetch_threads()


def test_producer_error_reaches_the_consumer_after_earlier_batches():
    def source():
        yield np.zeros(2)
        yield np.ones(2)
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):  # noqa: SIM117
        with DevicePrefetcher(source()) as batches:
            for batch in batches:
                got.append(batch.tolist())
    assert got == [[0.0, 0.0], [1.0, 1.0]]
    assert not prefetch_threads()


def test_close_is_idempotent_and_ends_iteration():
    prefetcher = DevicePrefetcher(dataset())
    next(prefetcher)
    prefetcher.close()
    prefetcher.close()
    assert not prefetch_threads()
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_a_slow_consumer_does_not_let_the_producer_run_away():
    produced = []

    def source():
        for i in range(100):
            produced.append(i)
            yield np.array([i])

    with DevicePrefetcher(source(), host_depth=2, device_depth=1) as batches:
        next(batches)
        time.sleep(0.1)
        # Batch 0 taken + 1 on device + 2 in the queue + 1 blocked in put = 5 at most.
        assert len(produced) <= 5


def test_state_is_that_of_the_last_batch_returned():
    ds = dataset()
    with DevicePrefetcher(ds, host_depth=4, device_depth=2) as batches:
        state0 = batches.get_state()
        first = [next(batches).tolist() for _ in range(2)]
        wait_until(batches._producer.queue.full)  # the thread has read far ahead
        state = batches.get_state()
        rest = [b.tolist() for b in batches]
    assert state0["step"] == 0 and state["step"] == 2 and len(first) == 2
    fresh = dataset()
    with DevicePrefetcher(fresh) as resumed:
        resumed.set_state(state)
        assert [b.tolist() for b in resumed] == rest


def test_set_state_after_start_and_uncheckpointable_sources():
    with DevicePrefetcher(dataset()) as batches:
        next(batches)
        with pytest.raises(RuntimeError, match="before the first batch"):
            batches.set_state({})
    plain = DevicePrefetcher([np.zeros(1)])
    assert not plain.checkpointable
    with pytest.raises(TypeError, match="does not support get_state"):
        plain.get_state()
    plain.close()


@pytest.mark.parametrize("depth", [0, -1])
def test_bad_depths(depth):
    with pytest.raises(ValueError, match="host_depth must be a positive integer"):
        DevicePrefetcher([], host_depth=depth)
    with pytest.raises(ValueError, match="device_depth must be a positive integer"):
        DevicePrefetcher([], device_depth=depth)


def test_device_put_with_jax():
    import jax

    device = jax.devices()[0]
    with DevicePrefetcher(dataset(), put_fn=lambda b: jax.device_put(b, device)) as batches:
        out = list(batches)
    assert all(isinstance(b, jax.Array) for b in out)
    assert [np.asarray(b).tolist() for b in out] == [b.tolist() for b in dataset()]


def test_grain_iterators_are_checkpointable_through_the_prefetcher():
    import grain

    source = (
        grain.MapDataset.range(10)
        .batch(3)
        .to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    )
    with DevicePrefetcher(iter(source), host_depth=3) as batches:
        assert batches.checkpointable
        next(batches)
        wait_until(lambda: batches._producer.queue.qsize() >= 2)
        state = batches.get_state()
        rest = [b.tolist() for b in batches]
    assert state == {"next_index": 1} and rest == [[3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("threaded", [False, True])
def test_autotune_follows_its_tuner_between_thread_and_inline_and_loses_no_batch(
    threaded, monkeypatch
):
    # The model's predictions are injected (its decisions are tested in test_autotune.py);
    # they flip every few batches, so batches made by the thread are handed out across
    # switches both ways.
    from phalanx._src.data import autotune

    def predict(tuner, width, serial):
        flip = (tuner.elements // 7) % 2
        return 1.0 if width == int(threaded != bool(flip)) else 2.0

    monkeypatch.setattr(autotune.Tuner, "_predict", predict)
    monkeypatch.setattr(autotune, "CHECK", 1)
    n = 100
    ds = Dataset.from_tensor_slices(np.arange(n, dtype=np.int32)).batch(1)
    prefetcher = DevicePrefetcher(iter(ds), autotune=True, host_depth=3)
    got, steps, modes = [], [], set()
    with prefetcher:
        for batch in prefetcher:
            got.append(int(batch[0]))
            steps.append(prefetcher.get_state()["step"])
            modes.add(prefetcher.threaded)
    assert got == list(range(n))  # every batch once, in order, across the switches
    assert steps == list(range(1, n + 1))  # the position follows the batches handed out
    assert modes == {True, False}
    assert not prefetch_threads()
