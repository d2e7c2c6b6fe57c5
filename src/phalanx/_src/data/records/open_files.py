"""At most `limit` record files open at once, the least recently used closed first.

Why: a shuffle over record files reads a record from any file at any step, and keeping
every file open once touched holds one descriptor per shard, in the main process and in
every worker process: ImageNet's 1,024 shards meet the usual limit of 1,024 open files
(`ulimit -n`). An LRU keeps the files read lately open (`Options().
experimental_max_open_files`, 64 by default) and closes the others; reopening a file costs
one `open`, far less than reading a record.

A file in use (a thread is reading it) is never closed under it: the cache goes over the
limit by the number of files read at that moment, and comes back when they are released.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

DEFAULT_LIMIT = 64


class OpenFiles:
    """Handles to files by key, opened by `opener(key, *args)` and closed by `closer`.

    Example:
      >>> files = OpenFiles(64, lambda i: os.open(paths[i], os.O_RDONLY), os.close)
      >>> fd = files.acquire(3)
      >>> try:
      ...     data = os.pread(fd, 100, 0)
      ... finally:
      ...     files.release(3)
    """

    def __init__(
        self, limit: int, opener: Callable[..., Any], closer: Callable[[Any], None]
    ) -> None:
        self.limit = limit
        self._opener, self._closer = opener, closer
        self._open: collections.OrderedDict[Any, list] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, key: Any, *args: Any) -> Any:
        """The open handle of `key` (opened with `args` if it is not open); `release` it."""
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry[1] += 1
                return entry[0]
            self._evict(self.limit - 1)  # room first: never limit + 1 open, even briefly
            handle = self._opener(key, *args)
            self._open[key] = [handle, 1]
            return handle

    def release(self, key: Any) -> None:
        """Ends one use of `key`'s handle (it stays open until evicted)."""
        with self._lock:
            self._open[key][1] -= 1
            if len(self._open) > self.limit:  # in-use handles held it over the limit
                self._evict(self.limit)

    def discard(self, key: Any) -> None:
        """Closes `key`'s handle now (its file is done)."""
        with self._lock:
            entry = self._open.pop(key, None)
        if entry is not None:
            self._closer(entry[0])

    def _evict(self, keep: int) -> None:
        """Closes unused handles, the least recently used first, until `keep` are open."""
        if len(self._open) <= keep:
            return
        for key in list(self._open):
            handle, users = self._open[key]
            if users == 0:
                del self._open[key]
                self._closer(handle)
                if len(self._open) <= keep:
                    return

    def close(self) -> None:
        """Closes every handle."""
        with self._lock:
            entries, self._open = list(self._open.values()), collections.OrderedDict()
        for handle, _ in entries:
            self._closer(handle)
