"""`Groups`: a host iterator's batches, K at a time (one compiled call's worth)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from phalanx._src.strategy import device_batch


class Groups:
    """Groups of up to K host batches, at most `limit` batches in all (None: to the end)."""

    def __init__(self, source: Iterator[Any], k: int, limit: int | None) -> None:
        self._source = source
        self.k = k  # batches per group
        self._left = limit
        self.checkpointable = bool(getattr(source, "checkpointable", False))
        self.exhausted = False

    def __iter__(self) -> Groups:
        return self

    def __next__(self) -> list[Any]:
        group: list[Any] = []
        while len(group) < self.k and (self._left is None or self._left > 0):
            try:
                batch = next(self._source)
            except StopIteration:
                self.exhausted = True
                break
            # The device boundary: strings are fine in the host pipeline, not in a step.
            device_batch.check_device_batch(batch, "a batch going to the model")
            group.append(batch)
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
        wanted = count * self.k if self._left is None else min(count * self.k, self._left)
        batches = self._source.next_many(wanted) if wanted else []
        if len(batches) < wanted:
            self.exhausted = True
        if self._left is not None:
            self._left -= len(batches)
        groups = [batches[i : i + self.k] for i in range(0, len(batches), self.k)]
        if not self.checkpointable:
            return [(group, None) for group in groups]
        left = len(batches)
        out = []
        state = self._source.get_state  # (through the wrappers' attribute lookups once)
        for group in groups:
            left -= len(group)
            out.append((group, state(back=left) if left else state()))
        return out
