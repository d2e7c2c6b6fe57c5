"""The live progress bar of `ProgbarLogger` on terminals, drawn with `rich`.

Redrawn only when the loop calls a batch hook (no refresh thread), at most 20 times a
second. When its phase ends the bar is replaced by one plain summary line, so a finished
epoch reads the same in a terminal's scrollback as in a log file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

REDRAW_SECONDS = 0.05


class LiveBar:
    """A one-line live bar: description, bar, steps, steps/s, ETA, then `text` (metrics).

    Args:
      stream: the terminal to draw on.
      description: e.g. 'Epoch 3/10'.
      total: steps in the phase, or None when unknown (no ETA then).
      width: characters of the bar.
    """

    def __init__(self, stream: TextIO, description: str, total: int | None, width: int) -> None:
        self.description = description
        self.total = total
        self._start = time.perf_counter()
        self._drawn = -float("inf")  # when the bar was last drawn
        self._seen = 0
        self.console = Console(file=stream, force_terminal=True, highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=width),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}", markup=False),
            TextColumn("ETA", markup=False),
            TimeRemainingColumn(),
            TextColumn("{task.fields[text]}", markup=False),
            console=self.console,
            auto_refresh=False,
            transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task(description, total=total, rate="", text="")

    def update(self, seen: int, text: str | Callable[[], str]) -> None:
        """Shows `seen` steps done and `text` (the latest loss and metrics, or a function
        making it). Redraws at most every `REDRAW_SECONDS` (as Keras's bar): drawing costs
        more than a small step."""
        self._seen = seen
        now = time.perf_counter()
        if now - self._drawn < REDRAW_SECONDS and seen != self.total:
            return
        self._drawn = now
        elapsed = now - self._start
        rate = f"{seen / elapsed:.1f} steps/s" if elapsed > 0 else ""
        text = text() if callable(text) else text
        self.progress.update(self.task, completed=seen, rate=rate, text=text)
        self.progress.refresh()

    def close(self, summary: str | None = None) -> None:
        """Removes the bar; prints '<description> <steps> - <summary>' when given."""
        self.progress.stop()
        if summary is not None:
            steps = f"{self._seen}/{self.total}" if self.total else f"{self._seen}"
            line = f"{self.description} {steps} - {summary}"
            self.console.print(line, markup=False, soft_wrap=True)  # one line, never wrapped
