"""The live progress bar of `ProgbarLogger` on terminals, drawn with `rich`.

Redrawn only when the loop calls a batch hook (no refresh thread). When its phase ends the
bar is replaced by one plain summary line, so a finished epoch reads the same in a terminal's
scrollback as in a log file.
"""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)


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

    def update(self, seen: int, text: str) -> None:
        """Shows `seen` steps done and `text` (the latest loss and metrics)."""
        self._seen = seen
        elapsed = time.perf_counter() - self._start
        rate = f"{seen / elapsed:.1f} steps/s" if elapsed > 0 else ""
        self.progress.update(self.task, completed=seen, rate=rate, text=text)
        self.progress.refresh()

    def close(self, summary: str | None = None) -> None:
        """Removes the bar; prints '<description> <steps> - <summary>' when given."""
        self.progress.stop()
        if summary is not None:
            steps = f"{self._seen}/{self.total}" if self.total else f"{self._seen}"
            line = f"{self.description} {steps} - {summary}"
            self.console.print(line, markup=False, soft_wrap=True)  # one line, never wrapped
