"""One phase over a feeder: dispatch, bounded calls in flight, hooks and logs.

The device never waits for the host: inputs are made ahead (`feeding.feeders`); K steps
run per compiled call; every call returns its logs with the state, and they are copied to
the host only when a callback wants them, and at the end of an epoch. On XLA:CPU more than
~30 queued calls with a collective deadlock (stack-facts), so at most `MAX_IN_FLIGHT` calls
are queued (`InFlight`).

Example:
  >>> result = run_phase(engine, "test", iter(data), None, CallbackList([]), None)
  >>> result.steps, engine.fetch_logs()
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from phalanx._src.data.autotune import Tuner
from phalanx._src.data.wait import InputWaitMeter
from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.api.callbacks.callback_list import CallbackList
from phalanx._src.train.feeding.batches import Groups
from phalanx._src.train.feeding.blocks import Blocks
from phalanx._src.train.feeding.dispatch import Runner
from phalanx._src.train.feeding.feeders import Carry, Feeder, HostFeeder, ResidentFeeder

if TYPE_CHECKING:
    from phalanx._src.train.engine.engine import Engine

MAX_IN_FLIGHT = 8


class PhaseResult(NamedTuple):
    """What `run_phase` did."""

    steps: int  # steps run
    exhausted: bool  # whether the source ran out
    position: Any  # the source's position after the last batch run (None: not reported)
    carry: Carry | None  # the next epoch's first fill, made at the end of this one


class InFlight:
    """Blocks on the oldest call once `MAX_IN_FLIGHT` are queued."""

    def __init__(self) -> None:
        self._ticks: collections.deque = collections.deque()

    def add(self, tick: jax.Array) -> None:
        self._ticks.append(tick)
        if len(self._ticks) > MAX_IN_FLIGHT:
            self._ticks.popleft().block_until_ready()

    def read(self, tick: jax.Array) -> None:
        """Forgets `tick`, whose value was just read, and the calls queued before it: each
        call takes the state the one before returned, so they all ran (no wait left for
        `add` to do on 8 devices' buffers, 20 us a call on XLA:CPU)."""
        ticks = self._ticks
        if ticks and ticks[-1] is tick:
            ticks.clear()
        elif len(ticks) > 1 and ticks[-2] is tick:  # an async-safe reader: the next is queued
            last = ticks.pop()
            ticks.clear()
            ticks.append(last)

    def drain(self) -> None:
        while self._ticks:
            self._ticks.popleft().block_until_ready()


def next_batch(feed: Any, in_flight: InFlight, meter: InputWaitMeter | None) -> Any:
    """The next device batch (None at the end), timing only what the devices wait for.

    With async dispatch the host often waits for a batch while the devices still run the
    steps already queued; that is not input wait. So when no batch is ready, the queued work
    is waited for first (nothing else could be dispatched anyway), and only the time the
    idle devices then wait for the batch is counted.
    """
    if meter is None or feed.ready():
        return next(feed, None)
    in_flight.drain()
    with meter.waiting():
        return next(feed, None)


def run_phase(
    engine: Engine,
    phase: str,
    iterator: Iterator[Any],
    limit: int | None,
    callbacks: CallbackList,
    meter: InputWaitMeter | None,
    on_state: Any = None,
    prefetch: int = 2,
    source: Any = None,
    steps_hint: int | None = None,
    next_limit: int | None = None,
    blocks: Blocks | None = None,
    after_first: Callable[[], None] | None = None,
    in_flight: InFlight | None = None,
    ahead: Carry | None = None,
    tuner: Tuner | None = None,
) -> PhaseResult:
    """Runs `phase` ('train' or 'test') over up to `limit` batches of `iterator`.

    `next_limit`: the next epoch's step count when it reads on from `iterator`; its first
    fill is then made before this epoch ends (`ResidentFeeder`), and returned as `carry`
    for the next epoch's call (`ahead`). `blocks`: `source` cut into whole
    batches, which training calls take directly when the batches read them in order.
    `after_first`: called once the phase's first call is dispatched (fit runs the last
    epoch's end there, see `fit.fit`). `in_flight`: the caller's bound on queued calls,
    left undrained at the end (fit's next epoch queues behind this one's last calls instead
    of the devices idling at the boundary); by default the phase drains its own. `tuner`:
    host batches come from the prefetch thread or the loop's thread, whichever it measures
    faster (fit's `prefetch=AUTOTUNE`; one tuner across the call's epochs).

    The batch-end hooks run after each execution, before the next one is dispatched; when
    every receiver is `async_safe` (`CallbackList.batch_end_deferred`) they run just after
    the next one is dispatched instead, so the devices do not idle while the host reads
    the logs and runs them (a progress bar, a logger).

    Returns:
      A `PhaseResult`.
    """
    k = engine.steps_per_call(limit or steps_hint)
    distributor = BatchDistributor(engine.strategy, pad_at_end=True)
    resident = prefetch > 0 and source is not None  # device-resident data
    if not resident or ahead is None or ahead.iterator is not iterator or ahead.k != k:
        ahead = None
    taken = 0 if ahead is None else ahead.batches
    groups = Groups(iterator, k, None if limit is None else limit - taken)
    runner = Runner(engine, phase, k, distributor, source, blocks)
    if blocks is not None and phase == "train" and resident:
        blocks.look_ahead(iterator)  # (once: whether windows come, see `Blocks`)
    begin_hook = callbacks.batch_hook(phase, "begin")
    end_hook = callbacks.batch_hook(phase, "end")
    interval = callbacks.batch_logs_interval(phase)
    deferred = end_hook is not None and callbacks.batch_end_deferred(phase)
    pending: tuple[int, Any] | None = None  # a deferred batch end: (batch, its log values)
    owned = in_flight is None
    in_flight = InFlight() if owned else in_flight
    steps = 0
    next_fetch = interval or 0
    logs: dict[str, float] = {}
    feed: Feeder
    if resident:
        then = None if next_limit is None or phase != "train" else (iterator, next_limit)
        feed = ResidentFeeder(groups, runner.fill, runner.table_groups(), ahead, then)
    else:
        feed = HostFeeder(groups, runner.put, prefetch, tuner)
    advance = feed.advance
    position = None
    with feed:
        item = next(feed, None)
        if meter is not None:
            # The wait for the first batch is the pipeline's start-up (threads, workers, the
            # first transfer), not its steady state: the clock starts here.
            meter.start_epoch()
        if item is not None:
            dispatch = runner.bind(item, in_flight.add)  # each next one bound ahead, see below
        while item is not None:
            n = item[2]  # (mode, device input, batches): see `Runner.put`
            if begin_hook is not None:
                begin_hook(steps, None)
            in_flight.add(dispatch())
            advance()  # the next input is made while the devices run this step
            steps += n
            if phase == "train":
                engine.train_step_count += n
            if meter is not None:
                meter.step_done(n)
            if after_first is not None:
                after_first, first = None, after_first
                first()
            if on_state is not None:
                on_state(steps, feed)
            # The next item is taken, and its call bound, while the devices run this call,
            # before its hooks wait for its logs: after that wait, only the hooks run before
            # the next dispatch.
            if feed.checkpointable:
                position = feed.get_state()  # where a stop below leaves the source
            item = next_batch(feed, in_flight, meter)
            if item is not None:
                dispatch = runner.bind(item, in_flight.add)
            if pending is not None:  # the last execution's, now that this one is queued
                logs = _end_batch(engine, end_hook, in_flight, *pending, logs)
                pending = None
            if end_hook is not None:
                values = None
                if interval is not None and steps >= next_fetch:
                    values = engine.last_logs
                    next_fetch = steps + interval
                if deferred:
                    pending = (steps - 1, values)
                else:
                    logs = _end_batch(engine, end_hook, in_flight, steps - 1, values, logs)
            if phase == "train" and engine.stop_training:
                break
        if pending is not None:
            _end_batch(engine, end_hook, in_flight, *pending, logs)
        if owned:
            in_flight.drain()
        if item is None and feed.checkpointable:
            position = feed.get_state()
    carry = None
    if phase == "train" and not engine.stop_training:
        carry = getattr(feed, "carry", None)
    return PhaseResult(steps, groups.exhausted, position, carry)


def _end_batch(
    engine: Engine,
    hook: Any,
    in_flight: InFlight,
    batch: int,
    values: list | None,
    logs: dict[str, float],
) -> dict[str, float]:
    """Calls the batch-end `hook` with `values` fetched, or with the last fetched `logs`
    when `values` is None (no fetch due); returns the logs it was given."""
    if values is not None:
        logs = engine.fetch_logs(values)
        in_flight.read(values[0])  # the call's tick (`Runner.bind`)
    hook(batch, logs)  # the hook hands the callbacks a copy
    return logs
