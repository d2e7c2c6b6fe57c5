"""The feeders: one protocol, two ways to have a call's device input ready when it is due.

A loop iterates a `Feeder`; each item is one compiled call's device input, made by a
`Runner` (`dispatch`) from a group of up to K host batches (`batches.Groups`):

- `HostFeeder`: host batches, made and put on the devices ahead of use in a thread
  (`DevicePrefetcher`), or in the loop's own thread when no prefetch is asked.
- `ResidentFeeder`: device-resident data (`device_data`), whose batches are row numbers.
  Making an input costs less than handing it over from a thread, and a producer thread
  running Python while the loop waits on the devices delays the loop's wake-up by up to
  the interpreter's switch interval (5 ms). So inputs are made in the loop's thread, a
  fill at a time (one group, or a `Table` of ~128 steps' row numbers), when the loop calls
  `advance()` right after dispatching a call: the next fill is made while the devices run.
  Fit's next epoch's first fill can be made the same way at the end of this epoch
  (`Carry`), so the devices do not idle while the host makes it between epochs.

Both report `get_state()`: the source's position after the last item handed out, so a
checkpoint resumes exactly.

Example:
  >>> with ResidentFeeder(Groups(iter(indices), k, None), runner.fill,
  ...                     runner.table_groups()) as feeder:
  ...     for item in feeder:
  ...         tick = runner.bind(item)()
  ...         feeder.advance()       # the next input is made while the devices run
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from phalanx._src.data.autotune import Tuner
from phalanx._src.data.prefetch import DevicePrefetcher
from phalanx._src.train.feeding.batches import Groups

# `(group, source state after it)` pairs in, `(item, source state after it)` pairs out.
Fill = Callable[[list[tuple[list[Any], Any]]], list[tuple[Any, Any]]]


class Feeder(Protocol):
    """What the loops iterate: device inputs, one compiled call's worth each."""

    checkpointable: bool  # whether `get_state()` reports the source's position

    def __enter__(self) -> Feeder: ...

    def __exit__(self, *exc: object) -> None: ...

    def __iter__(self) -> Feeder: ...

    def __next__(self) -> Any: ...

    def ready(self) -> bool:
        """Whether the next item (or the end) is there without waiting."""
        ...

    def advance(self) -> None:
        """Makes the next input now, if it is due (the loop calls it after each dispatch)."""
        ...

    def get_state(self) -> Any:
        """The source's position after the last item handed out."""
        ...


class HostFeeder:
    """Host batches made into device inputs by `put`: in a thread, `prefetch` batches ahead
    on the host and on the devices, or in the calling thread when `prefetch` is 0. With a
    `tuner` (`data.autotune.Tuner`, kept by the caller across epochs) the thread and the
    calling thread are measured and the faster kept (`DevicePrefetcher(autotune=...)`)."""

    def __init__(
        self,
        groups: Groups,
        put: Callable[[list[Any]], Any],
        prefetch: int,
        tuner: Tuner | None = None,
    ) -> None:
        self._groups = groups
        self._put = put
        self.checkpointable = groups.checkpointable
        self._thread = None
        if prefetch > 0:
            self._thread = DevicePrefetcher(
                groups,
                put,
                host_depth=prefetch,
                device_depth=prefetch,
                put_in_thread=True,
                autotune=tuner if tuner is not None else False,
            )

    def __enter__(self) -> HostFeeder:
        if self._thread is not None:
            self._thread.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.__exit__(*exc)

    def __iter__(self) -> HostFeeder:
        return self

    def __next__(self) -> Any:
        if self._thread is not None:
            return next(self._thread)
        return self._put(next(self._groups))

    def ready(self) -> bool:
        # Without a thread every batch is made when it is asked for.
        return self._thread is not None and self._thread.ready()

    def advance(self) -> None:
        return None  # the thread works on its own

    def get_state(self) -> Any:
        source = self._groups if self._thread is None else self._thread
        return source.get_state()


@dataclasses.dataclass(frozen=True)
class Carry:
    """Fit's next epoch's first fill, made before this epoch ended (see `ResidentFeeder`)."""

    iterator: Any  # the source iterator it was read from (carried to the next epoch)
    k: int
    batches: int
    items: list  # (item, source state after it)
    start: Any  # the source's state before it


class ResidentFeeder:
    """Device-resident data's inputs, made in the loop's thread a fill at a time.

    `fill` turns up to `per_fill` groups into items (one `Table` of row numbers, or one
    group's device input). The next fill is made when the last item of the current one has
    been handed out and the loop calls `advance()` after dispatching its call. With
    `then=(iterator, limit)` (fit's iterator carries over to the next epoch), the next
    epoch's first fill is made that way too at the end of this one, and comes back as
    `carry` for the next epoch's `ResidentFeeder(..., ahead=carry)`.

    Args:
      groups: the host iterator's batches, K at a time.
      fill: makes the items of some groups; see `Fill`.
      per_fill: groups per fill.
      ahead: this epoch's first fill, made by the last epoch's feeder.
      then: `(iterator, limit)` of the next epoch, when it reads on from this iterator.
    """

    def __init__(
        self,
        groups: Groups,
        fill: Fill,
        per_fill: int,
        ahead: Carry | None = None,
        then: tuple[Any, int] | None = None,
    ) -> None:
        self._groups = groups
        self._fill = fill
        self._per_fill = per_fill
        self._then = then
        self.carry: Carry | None = None
        self.checkpointable = groups.checkpointable
        self._items: collections.deque = collections.deque()  # (item, source state after it)
        self._done = False
        if ahead is not None:
            self._items.extend(ahead.items)
            self._state = ahead.start
        else:
            self._state = groups.get_state() if self.checkpointable else None

    def __enter__(self) -> ResidentFeeder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> ResidentFeeder:
        return self

    def ready(self) -> bool:
        return bool(self._items) or self._done

    def advance(self) -> None:
        """Makes the next fill now, if the current one is used up."""
        if self._items:
            return
        if self._done:
            self._make_carry()
            return
        taken = self._groups.take(self._per_fill)
        if taken:
            self._items.extend(self._fill(taken))
        if not taken or self._groups.exhausted or self._groups.used_up():
            self._done = True
            if not self._items:
                self._make_carry()  # while the devices run the epoch's last call

    def _make_carry(self) -> None:
        then, self._then = self._then, None
        if then is None or self._groups.exhausted:
            return
        iterator, limit = then
        groups = Groups(iterator, self._groups.k, limit)
        start = groups.get_state() if groups.checkpointable else None
        taken = groups.take(self._per_fill)
        if taken:
            batches = sum(len(group) for group, _ in taken)
            self.carry = Carry(iterator, self._groups.k, batches, self._fill(taken), start)

    def __next__(self) -> Any:
        if not self._items:  # else `advance` has nothing to do (the loop calls it each step)
            self.advance()
            if not self._items:
                raise StopIteration
        item, self._state = self._items.popleft()
        return item

    def get_state(self) -> Any:
        return self._state
