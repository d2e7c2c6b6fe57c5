"""The loop's promises: no thread outlives fit, no device sync nobody asked for, and the
feeding variants (device-resident data, no prefetch) give the same numbers."""

import threading

import jax
import numpy as np
import optax
import pytest
from conftest import build, make_data

import phalanx
from phalanx._src.train.engine.engine import Engine
from phalanx._src.train.engine.execution import BLOCK, WINDOW
from phalanx._src.train.engine.transfers import Transfers
from phalanx._src.train.feeding import sources
from phalanx._src.train.feeding.blocks import Blocks
from phalanx._src.train.feeding.device_data import Source
from phalanx._src.train.loops import fit as fit_loop
from phalanx._src.train.loops import phase


def _dataset(n=96, workers=2):
    x, y = make_data(n)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(16)
    return ds.map(lambda xb, yb: (xb * 1.0, yb), num_parallel_calls=workers)


class _Boom(phalanx.callbacks.Callback):
    def __init__(self, error):
        super().__init__()
        self.error = error

    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            raise self.error


def _alive_pipeline_threads(before):
    return [t.name for t in threading.enumerate() if t.is_alive() and t not in before]


@pytest.mark.parametrize("error", [None, RuntimeError("boom"), KeyboardInterrupt()])
def test_no_thread_outlives_fit(all_devices, error):
    model = build(all_devices)
    before = set(threading.enumerate())
    callbacks = [] if error is None else [_Boom(error)]
    if error is None:
        model.fit(_dataset(), epochs=2, verbose=0, callbacks=callbacks)
    else:
        with pytest.raises(type(error)):
            model.fit(_dataset(), epochs=2, verbose=0, callbacks=callbacks)
    assert _alive_pipeline_threads(before) == []


def test_hooks_nobody_overrides_cost_no_device_sync(all_devices, monkeypatch):
    fetches = []
    real = Engine.fetch_logs
    monkeypatch.setattr(
        Engine, "fetch_logs", lambda engine, values=None: fetches.append(1) or real(engine, values)
    )
    x, y = make_data(80)
    model = build(all_devices)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)  # 5 steps an epoch
    assert len(fetches) == 2  # one per epoch, none per step

    class EveryBatch(phalanx.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(logs["loss"])

    fetches.clear()
    every = EveryBatch()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[every])
    assert len(every.seen) == 10 and len(fetches) == 2 + 10


class _Reader(phalanx.callbacks.Callback):
    """Records each batch end: (batch, its logs, how many steps the model had dispatched)."""

    def __init__(self, async_safe=False, stop_at=None):
        super().__init__()
        self.async_safe = async_safe
        self.stop_at = stop_at
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((batch, dict(logs), self.model.train_step_count))
        if batch == self.stop_at:
            self.model.stop_training = True


@pytest.mark.parametrize("k", [1, 2])
def test_async_safe_batch_ends_run_after_the_next_dispatch_with_the_same_logs(all_devices, k):
    x, y = make_data(80)  # 5 batches an epoch: calls of 1 step, or of 2, 2 and 1 at K=2
    runs = []
    for async_safe in (False, True):
        model = build(all_devices, optimizer="adam", steps_per_execution=k)
        reader = _Reader(async_safe)
        history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                            callbacks=[reader])  # fmt: skip
        runs.append((reader.seen, history.history["loss"], model.get_weights()))
    (sync, sync_history, sync_weights), (deferred, history, weights) = runs
    # The same hooks with the same logs, and the same training...
    assert [(b, logs) for b, logs, _ in deferred] == [(b, logs) for b, logs, _ in sync]
    assert history == sync_history
    for a, b in zip(weights, sync_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    # ...but each call's hooks ran once the next call of its epoch was dispatched.
    done = [count for _, _, count in sync]
    ahead = [done[i + 1] if sync[i + 1][0] > sync[i][0] else done[i] for i in range(len(done) - 1)]
    assert [count for _, _, count in deferred] == [*ahead, done[-1]]
    assert ahead != done[:-1]


class _Tick:
    def __init__(self):
        self.waits = 0

    def block_until_ready(self):
        self.waits += 1


def test_in_flight_forgets_the_calls_up_to_a_read_tick_and_bounds_the_rest():
    in_flight = phase.InFlight()
    ticks = [_Tick() for _ in range(phase.MAX_IN_FLIGHT + 5)]
    for tick in ticks[:3]:
        in_flight.add(tick)
    in_flight.read(ticks[1])  # a reader one call behind: the last call stays queued
    assert list(in_flight._ticks) == [ticks[2]]
    in_flight.read(_Tick())  # not queued (an epoch's logs, say): nothing changes
    assert list(in_flight._ticks) == [ticks[2]]
    in_flight.read(ticks[2])
    assert not in_flight._ticks
    for tick in ticks[3:]:
        in_flight.add(tick)
    assert [t.waits for t in ticks] == [0] * 3 + [1] * 2 + [0] * (len(ticks) - 5)
    in_flight.drain()
    assert all(t.waits == 1 for t in ticks[5:]) and not in_flight._ticks


@pytest.mark.parametrize("async_safe", [False, True])
def test_a_reader_of_every_batch_leaves_no_call_to_wait_for(all_devices, monkeypatch, async_safe):
    queued = []
    real_add = phase.InFlight.add

    def add(self, tick):
        queued.append(len(self._ticks))  # before this call: none, or the one being read
        real_add(self, tick)

    monkeypatch.setattr(phase.InFlight, "add", add)
    x, y = make_data(160)
    model = build(all_devices)
    reader = _Reader(async_safe)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[reader])
    assert len(queued) == 20 and len(reader.seen) == 20
    assert max(queued) == (1 if async_safe else 0)


def test_one_callback_that_is_not_async_safe_keeps_every_batch_end_in_step():
    x, y = make_data(48)
    strategy = phalanx.Strategy(devices=jax.devices()[:1])
    mixed = [_Reader(async_safe=True), _Reader()]
    build(strategy).fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=mixed)
    for reader in mixed:
        assert [count for *_, count in reader.seen] == [1, 2, 3]


@pytest.mark.parametrize(("async_safe", "steps"), [(False, 2), (True, 3)])
def test_stop_training_from_a_batch_end_stops_after_that_call_or_the_next(async_safe, steps):
    x, y = make_data(80)
    model = build(phalanx.Strategy(devices=jax.devices()[:1]))
    reader = _Reader(async_safe, stop_at=1)
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[reader])
    assert model.train_step_count == steps
    assert [batch for batch, *_ in reader.seen] == list(range(steps))


class _EpochRecorder(phalanx.callbacks.Callback):
    """Records every hook it gets, in order, with the steps dispatched at the time."""

    def __init__(self, async_safe):
        super().__init__()
        self.async_safe = async_safe
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(("begin", epoch, self.model.train_step_count))

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(("batch", batch, self.model.train_step_count))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(("end", epoch, self.model.train_step_count, logs["loss"]))


@pytest.mark.parametrize("validation_freq", [None, 2])
def test_async_safe_epoch_hooks_run_once_the_next_epoch_is_dispatched(validation_freq):
    x, y = make_data(64)  # 4 steps an epoch
    runs = []
    for async_safe in (False, True):
        model = build(phalanx.Strategy(devices=jax.devices()[:1]), optimizer="adam")
        recorder = _EpochRecorder(async_safe)
        kwargs = {} if validation_freq is None else {"validation_data": (x, y)}
        history = model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                            callbacks=[recorder], validation_freq=validation_freq or 1,
                            **kwargs)  # fmt: skip
        runs.append((recorder.seen, history.history, model.get_weights()))
    (sync, sync_history, sync_weights), (deferred, history, weights) = runs
    # The same hooks in the same order with the same logs, and the same training...
    assert [h[:2] + h[3:] for h in deferred] == [h[:2] + h[3:] for h in sync]
    assert history["loss"] == sync_history["loss"]
    assert history.get("val_loss") == sync_history.get("val_loss")
    for a, b in zip(weights, sync_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    # ...but an epoch's end and the next one's begin ran after the next epoch's first step was
    # dispatched (batch hooks run one step behind), except where the epoch validated.
    ends = {h[1]: h[2] for h in deferred if h[0] == "end"}
    validated = {e for e in range(4) if validation_freq and (e + 1) % validation_freq == 0}
    assert ends == {e: 4 * (e + 1) + (e < 3 and e not in validated) for e in range(4)}
    assert {h[1]: h[2] for h in sync if h[0] == "end"} == {e: 4 * (e + 1) for e in range(4)}


@pytest.mark.parametrize("variant", [{"device_data": False}, {"prefetch": 0}])
def test_feeding_variants_give_the_same_numbers(all_devices, variant):
    x, y = make_data(100)
    results = []
    for kwargs in ({}, variant):
        model = build(all_devices, optimizer="adam")
        ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(100, seed=4).batch(24)
        history = model.fit(ds, epochs=2, verbose=0, **kwargs)
        results.append((history.history["loss"], model.get_weights()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    for a, b in zip(results[1][1], results[0][1], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_an_iterator_carried_over_epochs_gives_the_host_pipelines_numbers(all_devices, k):
    # 5 batches an epoch from a repeating dataset of 100 rows (batches straddle the
    # repetitions; K=2 leaves a short group): each next epoch's first table is read before
    # the epoch ends, and validation runs in between.
    x, y = make_data(100)
    results = []
    for device_data in (True, False):
        model = build(all_devices, optimizer="adam", steps_per_execution=k)
        ds = phalanx.data.Dataset.from_tensor_slices((x, y)).shuffle(100, seed=4)
        history = model.fit(
            ds.repeat().batch(24), epochs=3, steps_per_epoch=5, validation_data=(x, y),
            verbose=0, device_data=device_data,
        )  # fmt: skip
        results.append((history.history, model.get_weights(), model.train_step_count))
    (got, got_weights, got_steps), (want, want_weights, want_steps) = results
    assert got_steps == want_steps == 15
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6)
    for a, b in zip(got_weights, want_weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_device_data_is_used_for_in_memory_datasets(all_devices, monkeypatch):
    used = []
    real = sources.device_data.prepare
    monkeypatch.setattr(
        sources.device_data, "prepare", lambda *a, **k: used.append(r := real(*a, **k)) or r
    )
    x, y = make_data(48)
    build(all_devices).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert used and used[0] is not None
    used.clear()
    build(all_devices).fit(_dataset(48, workers=None), epochs=1, verbose=0)  # a map: rows
    assert used == [None]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize(
    "rows, steps_per_epoch, kinds",
    # kinds: the positions the batches were found at. 100 rows are 4 whole batches of 24
    # and a partial one; `repeat().batch()` over them reads windows across the repetitions
    # after its first pass, so every batch is read as a window from the first (one layout,
    # one program: `Blocks.look_ahead`).
    [
        (96, None, {BLOCK}),
        (96, 4, {BLOCK}),
        (100, None, {BLOCK}),
        (100, 5, {WINDOW}),
    ],
    ids=["whole_blocks", "whole_blocks_repeated", "partial_last_batch", "straddling_repeat"],
)
def test_batches_read_in_order_train_at_a_device_cursor(
    all_devices, monkeypatch, rows, steps_per_epoch, kinds, k
):
    # Unshuffled batches are found in order (blocks, or windows across a repetition) and
    # read on the devices: the data crosses in the first epoch only, and the numbers are the
    # host pipeline's (a partial last batch padded and masked as it pads it).
    found = []
    real = Blocks.positions
    monkeypatch.setattr(
        Blocks, "positions", lambda self, *a: found.append(r := real(self, *a)) or r
    )
    x, y = make_data(rows)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y))
    ds = ds.batch(24) if steps_per_epoch is None else ds.repeat().batch(24)
    results = []
    for device_data in (True, False):
        model = build(all_devices, optimizer="adam", steps_per_execution=k)
        history = model.fit(
            ds, epochs=3, steps_per_epoch=steps_per_epoch, verbose=0, device_data=device_data
        )
        results.append((history.history, model.get_weights(), model.train_step_count))
    assert None not in found and {kind for kind, _ in found} == kinds
    (got, got_weights, got_steps), (want, want_weights, want_steps) = results
    assert got_steps == want_steps
    assert got["host_to_device_mib"][1:] == [0.0, 0.0]  # nothing crosses after the first
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    for a, b in zip(got_weights, want_weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_blocks_are_placed_once_and_read_where_they_lie(all_devices):
    x, y = make_data(100)  # 4 whole batches of 24 and a partial one of 4
    blocks = Blocks(Source((x, y), all_devices), all_devices)
    rows = lambda start, n=24: np.arange(start, start + n, dtype=np.int32)  # noqa: E731
    wrap = lambda start: np.arange(start, start + 24, dtype=np.int32) % 100  # noqa: E731
    assert blocks.positions([rows(24), rows(48)], 24) == (BLOCK, [1, 2])
    # The partial last batch is block 4; block 0 follows it (`batch().repeat()`).
    assert blocks.positions([rows(72), rows(96, 4), rows(0)], 24) == (BLOCK, [3, 4, 0])
    # `repeat().batch()`: full windows across the data's end, B rows apart mod N.
    assert blocks.positions([rows(72), wrap(96), wrap(20)], 24) == (WINDOW, [72, 96, 20])
    assert blocks.positions([rows(12)], 24) == (WINDOW, [12])  # off a boundary: a window
    assert blocks.positions([rows(72)[::-1]], 24) is None  # out of order
    assert blocks.positions([rows(0)[:12]], 24) is None  # a short batch that is not the last
    assert blocks.positions([rows(90, 10)], 24) is None  # past the data
    assert blocks.positions([rows(0), rows(48)], 24) is None  # not consecutive
    # A scan's layout: every block in one array per leaf, split over the replicas; the
    # partial batch padded as the host pipeline pads it (a pad repeats a real row), masked.
    ledger = Transfers()
    door = ledger.door()
    (bx, by), masks = blocks.body(24, door)
    assert bx.shape == (5, 24, x.shape[1]) and by.shape == (5, 24)
    assert tuple(bx.sharding.spec) == (None, *all_devices.data_sharding.spec)
    np.testing.assert_array_equal(np.asarray(bx)[:4], x[:96].reshape(4, 24, -1))
    padded = np.where(np.arange(24) < 4, np.arange(24), 0)  # the pads repeat row 0
    np.testing.assert_array_equal(np.asarray(bx)[4], x[96:][padded])
    np.testing.assert_array_equal(np.asarray(by)[4, :4], y[96:])
    np.testing.assert_array_equal(np.asarray(masks), np.arange(24)[None] < [[24]] * 4 + [[4]])
    crossed = ledger.total.host_to_device_bytes
    # Once, with no overlap: the body, its masks, and the offsets its parts were written at.
    per = -(-5 // 8)  # batches per part (~8 parts)
    parts = -(-5 // per)
    assert crossed == bx.nbytes + by.nbytes + masks.nbytes + 4 * parts * len(jax.devices())
    blocks.body(24, door)
    assert ledger.total.host_to_device_bytes == crossed  # placed once
    # Windows read the source replicated: assembled from the blocks, nothing crosses.
    fx, fy = blocks.flat(door)
    assert ledger.total.host_to_device_bytes == crossed and fx.sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(fx), x)
    np.testing.assert_array_equal(np.asarray(fy), y)
    # Single-step calls take each block's own array (no slice in the step).
    (tx, _), mask = blocks.batch(4, 24, None)
    np.testing.assert_array_equal(np.asarray(tx)[:4], x[96:])
    np.testing.assert_array_equal(np.asarray(mask), np.arange(24) < 4)
    assert blocks.batch(1, 24, None)[1] is None
    # A cursor the last call returned is reused at its position; another is placed.
    cursor = blocks.cursor(BLOCK, 3, door)
    blocks.moved(BLOCK, 4, cursor)
    assert blocks.cursor(BLOCK, 4, None) is cursor
    assert int(blocks.cursor(BLOCK, 0, None)) == 0


@pytest.mark.parametrize("k", [1, 2])
def test_each_epochs_logs_cover_its_own_batches_as_the_next_queues_behind(
    all_devices, monkeypatch, k
):
    # Learning rate 0: the weights never move, so each epoch's logs are evaluate's numbers
    # on that epoch's own two batches of a dataset read on. The metric sums are zeroed at
    # each epoch's start (one set of zeros, never donated, serves every reset), and around
    # the validation in between.
    x, y = make_data(96)
    queued = []  # calls still queued when each epoch starts: not drained at the boundary
    real_run_phase = fit_loop.run_phase

    def run_phase(model, phase, *args, in_flight=None, **kwargs):
        if phase == "train":
            queued.append(len(in_flight._ticks))
        return real_run_phase(model, phase, *args, in_flight=in_flight, **kwargs)

    monkeypatch.setattr(fit_loop, "run_phase", run_phase)
    added = []
    real_add = phase.InFlight.add

    def add(self, tick):
        real_add(self, tick)
        added.append(len(self._ticks))

    monkeypatch.setattr(phase.InFlight, "add", add)
    model = build(all_devices, optimizer=optax.sgd(0.0), steps_per_execution=k)
    ds = phalanx.data.Dataset.from_tensor_slices((x, y)).batch(16)  # 6 batches
    history = model.fit(ds.repeat(), epochs=3, steps_per_epoch=2, verbose=0,
                        validation_data=(x[:32], y[:32]), validation_freq=2)  # fmt: skip
    for epoch in range(3):
        rows = slice(32 * epoch, 32 * (epoch + 1))
        want = model.evaluate(x[rows], y[rows], batch_size=16, verbose=0, return_dict=True)
        for key in ("loss", "accuracy"):
            np.testing.assert_allclose(history.history[key][epoch], want[key], rtol=1e-6)
    val = model.evaluate(x[:32], y[:32], batch_size=16, verbose=0, return_dict=True)
    np.testing.assert_allclose(history.history["val_loss"], [val["loss"]], rtol=1e-6)
    # Epoch 2 queued behind epoch 1; epoch 3 starts on drained devices, after validation.
    assert queued[0] == 0 and queued[1] > 0 and queued[2] == 0
    assert max(added) <= phase.MAX_IN_FLIGHT
