"""Feeding the compiled steps: host batches in, bounded calls in flight, logs out.

The device never waits for the host: host batches are made ahead in a thread and put on the
devices ahead of use (`DevicePrefetcher`); device-resident data's row numbers go to the
devices ~128 steps at a time (`Tables`), or for predict one group ahead in the loop's own
thread, between steps (`Ahead`); K steps run per compiled
call; every call returns its logs with the state, and they are copied to the host only every
K steps when a callback wants them, and at the end of an epoch. On XLA:CPU more than ~30
queued calls with a collective deadlock (stack-facts), so at most `MAX_IN_FLIGHT` calls are
queued.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from phalanx._src.data.adapters import as_batches
from phalanx._src.data.dataset import Dataset
from phalanx._src.data.prefetch import DevicePrefetcher
from phalanx._src.data.wait import InputWaitMeter
from phalanx._src.strategy.distribute import BatchDistributor
from phalanx._src.train.api.callbacks.callback_list import CallbackList
from phalanx._src.train.engine import execution
from phalanx._src.train.feeding import device_data

if TYPE_CHECKING:
    from phalanx._src.train.model import Model

MAX_IN_FLIGHT = 8


def host_data(
    x: Any, y: Any, sample_weight: Any, batch_size: int | None, shuffle: bool, seed: int | None
) -> Iterable[Any]:
    """Keras's inputs as an iterable of host batches: arrays (with y, sample_weight) or any
    source `phalanx.data.as_batches` accepts."""
    if x is None:
        raise ValueError("no data: pass x (arrays or a dataset), e.g. model.fit(x_train, y_train)")
    if y is None and sample_weight is None:
        data = x
    else:
        data = tuple(v for v in (x, y, sample_weight) if v is not None)
    if shuffle and seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    batches = as_batches(data, batch_size, shuffle=shuffle, seed=seed)
    if jax.process_count() > 1 and isinstance(batches, Dataset) and batches.split is None:
        batches = batches.process_split()  # each process reads only its share of a batch
    return batches


def on_devices(model: Model, data: Iterable[Any], mode: bool | str) -> tuple[Iterable, Any]:
    """`(what to iterate, on-device source arrays or None)`; see `device_data`."""
    placed = device_data.prepare(data, model.strategy, mode)
    return (data, None) if placed is None else (placed.indices, placed.arrays)


class Groups:
    """Groups of up to K host batches, at most `limit` batches in all (None: to the end)."""

    def __init__(self, source: Iterator[Any], k: int, limit: int | None) -> None:
        self._source = source
        self._k = k
        self._left = limit
        self.checkpointable = bool(getattr(source, "checkpointable", False))
        self.exhausted = False

    def __iter__(self) -> Groups:
        return self

    def __next__(self) -> list[Any]:
        group: list[Any] = []
        while len(group) < self._k and (self._left is None or self._left > 0):
            try:
                group.append(next(self._source))
            except StopIteration:
                self.exhausted = True
                break
            if self._left is not None:
                self._left -= 1
        if not group:
            raise StopIteration
        return group

    def get_state(self) -> Any:
        return self._source.get_state()

    def used_up(self) -> bool:
        """Whether the limit is reached."""
        return self._left == 0

    def take(self, count: int) -> list[tuple[list[Any], Any]]:
        """Up to `count` next groups, each with the source's position after it (None when
        the source cannot report it), read with one `next_many` call where possible."""
        if getattr(self._source, "next_many", None) is None:
            out = []
            for group in itertools.islice(self, count):
                out.append((group, self.get_state() if self.checkpointable else None))
            return out
        wanted = count * self._k if self._left is None else min(count * self._k, self._left)
        batches = self._source.next_many(wanted) if wanted else []
        if len(batches) < wanted:
            self.exhausted = True
        if self._left is not None:
            self._left -= len(batches)
        groups = [batches[i : i + self._k] for i in range(0, len(batches), self._k)]
        if not self.checkpointable:
            return [(group, None) for group in groups]
        left = len(batches)
        out = []
        state = self._source.get_state  # (through the wrappers' attribute lookups once)
        for group in groups:
            left -= len(group)
            out.append((group, state(back=left) if left else state()))
        return out


class _InLoop:
    """A feed made in the loop's own thread: an iterator and a context with nothing to stop."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> Any:
        return self


class Direct(_InLoop):
    """Device batches made in the calling thread, when no prefetch is asked (`prefetch=0`)."""

    def __init__(self, groups: Groups, put: Any) -> None:
        self._groups = groups
        self._put = put
        self.checkpointable = groups.checkpointable

    @staticmethod
    def ready() -> bool:
        return False  # every batch is made when it is asked for

    def __next__(self) -> Any:
        return self._put(next(self._groups))

    def get_state(self) -> Any:
        return self._groups.get_state()


class Ahead(_InLoop):
    """Device inputs made one group ahead in the calling thread, between steps.

    For device-resident data (`device_data`) a group's device input is a few kilobytes of
    row numbers: making it costs less than handing it over from a thread, and a producer
    thread running Python while the loop waits on the devices delays the loop's wake-up by
    up to the interpreter's switch interval (5 ms). So the loop calls `advance()` right after
    dispatching a step: the next input is made while the devices run that step.
    `get_state()` is the source's position after the last group returned, as for
    `DevicePrefetcher`, so a checkpoint resumes exactly.
    """

    def __init__(self, groups: Groups, put: Any) -> None:
        self._groups = groups
        self._put = put
        self.checkpointable = groups.checkpointable
        self._next: tuple[Any, Any] | None = None  # (device input, source state after it)
        self._done = False
        self._state = groups.get_state() if self.checkpointable else None

    def ready(self) -> bool:
        return self._next is not None or self._done

    def advance(self) -> None:
        """Makes the next group's device input now, if not made yet."""
        if self._next is not None or self._done:
            return
        try:
            group = next(self._groups)
        except StopIteration:
            self._done = True
            return
        state = self._groups.get_state() if self.checkpointable else None
        self._next = (self._put(group), state)

    def __next__(self) -> Any:
        self.advance()
        if self._next is None:
            raise StopIteration
        item, self._state = self._next
        self._next = None
        return item

    def get_state(self) -> Any:
        return self._state


@dataclasses.dataclass(frozen=True)
class NextTable:
    """The next epoch's first table, made before this epoch ended (see `Tables`)."""

    iterator: Any  # the source iterator it was read from (carried to the next epoch)
    k: int
    batches: int
    items: list  # (item, source state after it)
    start: Any  # the source's state before it


class Tables(_InLoop):
    """Device-resident data's inputs, one `execution.Table` of row numbers at a time.

    A table holds the row numbers of up to `Runner.TABLE_STEPS` steps and is sent to the
    devices in one copy; the compiled calls read their entries at a device-side cursor. The
    next table is made when the last item of the current one has been handed out, after its
    call was dispatched (the loop calls `advance()` then), so the devices run that call
    meanwhile. With `then=(iterator, limit)` (fit's iterator carries over to the next epoch),
    the next epoch's first table is made that way too, at the end of this one: its items
    come back as `next_table` for the next epoch's `Tables(..., ahead=...)`, so the devices
    do not idle while the host makes it between epochs. `get_state()` is the source's
    position after the last group returned, as for `DevicePrefetcher`, so a checkpoint
    resumes exactly.
    """

    def __init__(
        self,
        groups: Groups,
        runner: execution.Runner,
        ahead: NextTable | None = None,
        then: tuple[Any, int] | None = None,
    ) -> None:
        self._groups = groups
        self._runner = runner
        self._then = then
        self.next_table: NextTable | None = None
        self.checkpointable = groups.checkpointable
        self._items: collections.deque = collections.deque()  # (item, source state after it)
        self._done = False
        if ahead is not None:
            self._items.extend(ahead.items)
            self._state = ahead.start
        else:
            self._state = groups.get_state() if self.checkpointable else None

    def ready(self) -> bool:
        return bool(self._items) or self._done

    def advance(self) -> None:
        """Makes the next table now, if the current one is used up."""
        if self._items:
            return
        if self._done:
            self._make_next_table()
            return
        taken = self._groups.take(self._runner.table_groups())
        if taken:
            self._items.extend(self._put(taken))
        if not taken or self._groups.exhausted or self._groups.used_up():
            self._done = True
            if not self._items:
                self._make_next_table()  # while the devices run the epoch's last call

    def _put(self, taken: list[tuple[list[Any], Any]]) -> list[tuple[Any, Any]]:
        groups = [group for group, _ in taken]
        self._runner.prepare(groups[0])  # the mode (scan or single calls) sets the shape
        return list(zip(self._runner.put_table(groups), [s for _, s in taken], strict=True))

    def _make_next_table(self) -> None:
        then, self._then = self._then, None
        if then is None or self._groups.exhausted:
            return
        iterator, limit = then
        groups = Groups(iterator, self._runner.k, limit)
        start = groups.get_state() if groups.checkpointable else None
        taken = groups.take(self._runner.table_groups())
        if taken:
            batches = sum(len(group) for group, _ in taken)
            self.next_table = NextTable(iterator, self._runner.k, batches, self._put(taken), start)

    def __next__(self) -> Any:
        if not self._items:  # else `advance` has nothing to do (the loop calls it each step)
            self.advance()
            if not self._items:
                raise StopIteration
        item, self._state = self._items.popleft()
        return item

    def get_state(self) -> Any:
        return self._state


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


def reset_metrics(model: Model) -> None:
    """Zeroes the metric sums: puts in the model's zero sums, made once. No compiled call
    donates the metric sums, so one set serves every reset, and an epoch's boundary, where
    the devices wait for the host, makes none (a call: ~0.1 ms on one CPU device, ~0.5 ms
    on 8)."""
    leaves, packing = model._state_leaves()
    n = packing.metric_count
    made = model._compiled_fns.get("zero_metrics")
    if made is None or made[0] is not packing:
        repl = model.strategy.replicated_sharding
        zeros = jax.jit(lambda metrics: [jnp.zeros_like(m) for m in metrics], out_shardings=repl)
        made = model._compiled_fns["zero_metrics"] = (packing, zeros(leaves[:n]))
    model._set_state_leaves([*made[1], *leaves[n:]])


def fetch_logs(model: Model, values: list[jax.Array] | None = None) -> dict[str, float]:
    """The loss and metric values as Python floats (one device fetch): `values`, a compiled
    call's logs, or by default the current ones.

    The last compiled call already returned them for the sums it left in `model._state`
    (`execution.log_values`); only other sums (e.g. just reset) need a call of their own.
    """
    values = model._last_logs if values is None else values
    if values is None:
        metrics = model._state["metrics"]
        fn = model._compiled_fns.get("logs")
        if fn is None:
            graphdef = model.steps.metrics_graphdef
            fn = model._compiled_fns["logs"] = jax.jit(
                lambda metrics: execution.log_values(graphdef, metrics)
            )
        values = fn(metrics)
    for value in values[1:]:
        value.copy_to_host_async()  # the copies overlap; float() waits for each
    names = model._compiled_fns.get("log_names")
    if names is None:  # Keras's order: loss first
        names = model._compiled_fns["log_names"] = [
            m.name for m in (model.loss_tracker, *model.metrics)
        ]
    return {name: float(v) for name, v in zip(names, values, strict=True)}


def run_phase(
    model: Model,
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
    blocks: device_data.Blocks | None = None,
    after_first: Callable[[], None] | None = None,
    in_flight: InFlight | None = None,
) -> tuple[int, bool, Any]:
    """Runs `phase` ('train' or 'test') over up to `limit` batches of `iterator`.

    `next_limit`: the next epoch's step count when it reads on from `iterator`; its first
    table is then made before this epoch ends (`Tables`). `blocks`: `source` cut into whole
    batches, which training calls take directly when the batches read them in order.
    `after_first`: called once the phase's first call is dispatched (fit runs the last
    epoch's end there, see `loop.fit`). `in_flight`: the caller's bound on queued calls,
    left undrained at the end (fit's next epoch queues behind this one's last calls instead
    of the devices idling at the boundary); by default the phase drains its own.

    The batch-end hooks run after each execution, before the next one is dispatched; when
    every receiver is `async_safe` (`CallbackList.batch_end_deferred`) they run just after
    the next one is dispatched instead, so the devices do not idle while the host reads
    the logs and runs them (a progress bar, a logger).

    Returns:
      `(steps run, whether the source ran out, the source's position after the last batch
      run, or None when the source cannot report it)`.
    """
    k = model._execution_k(limit or steps_hint)
    distributor = BatchDistributor(model.strategy, pad_at_end=True)
    tabled = prefetch > 0 and source is not None  # device-resident data: `Tables`
    ahead = model._next_table  # made by the last epoch, if it read on from `iterator`
    if not tabled or ahead is None or ahead.iterator is not iterator or ahead.k != k:
        ahead = None
    taken = 0 if ahead is None else ahead.batches
    groups = Groups(iterator, k, None if limit is None else limit - taken)
    runner = execution.Runner(model, phase, k, distributor, source, blocks)
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
    if tabled:
        then = None if next_limit is None or phase != "train" else (iterator, next_limit)
        feed = Tables(groups, runner, ahead, then)
    elif prefetch > 0:
        feed = DevicePrefetcher(
            groups, runner.put, host_depth=prefetch, device_depth=prefetch, put_in_thread=True
        )
    else:
        feed = Direct(groups, runner.put)
    advance = getattr(feed, "advance", None)
    position = None
    with feed:
        item = next(feed, None)
        if meter is not None:
            # The wait for the first batch is the pipeline's start-up (threads, workers, the
            # first transfer), not its steady state: the clock starts here.
            meter.start_epoch()
        if item is not None:
            dispatch = runner.bind(item)  # each next one is bound ahead, see below
        while item is not None:
            n = item[2]  # (mode, device input, batches): see `Runner.put`
            if begin_hook is not None:
                begin_hook(steps, None)
            in_flight.add(dispatch())
            if advance is not None:
                advance()  # the next input is made while the devices run this step
            steps += n
            if phase == "train":
                model.train_step_count += n
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
                dispatch = runner.bind(item)
            if pending is not None:  # the last execution's, now that this one is queued
                logs = _end_batch(model, end_hook, in_flight, *pending, logs)
                pending = None
            if end_hook is not None:
                values = None
                if interval is not None and steps >= next_fetch:
                    values = model._last_logs
                    next_fetch = steps + interval
                if deferred:
                    pending = (steps - 1, values)
                else:
                    logs = _end_batch(model, end_hook, in_flight, steps - 1, values, logs)
            if phase == "train" and model.stop_training:
                break
        if pending is not None:
            _end_batch(model, end_hook, in_flight, *pending, logs)
        if owned:
            in_flight.drain()
        if item is None and feed.checkpointable:
            position = feed.get_state()
    if phase == "train":
        model._next_table = None if model.stop_training else getattr(feed, "next_table", None)
    return steps, groups.exhausted, position


def _end_batch(
    model: Model,
    hook: Any,
    in_flight: InFlight,
    batch: int,
    values: list | None,
    logs: dict[str, float],
) -> dict[str, float]:
    """Calls the batch-end `hook` with `values` fetched, or with the last fetched `logs`
    when `values` is None (no fetch due); returns the logs it was given."""
    if values is not None:
        logs = fetch_logs(model, values)
        in_flight.read(values[0])  # the call's tick (`Runner.bind`)
    hook(batch, logs)  # the hook hands the callbacks a copy
    return logs


def close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def length(data: Any) -> int | None:
    try:
        n = len(data)
    except TypeError:
        return None
    return n if n < float("inf") else None
