"""Progress of a run as a person reads it: a live bar on a terminal, plain lines anywhere else.

Output that is not a terminal (CI logs, ``nohup``, ``| cat``, notebooks) gets one line every
``every`` rounds, so a long run shows signs of life and an ETA while it runs.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def status(row: dict[str, Any]) -> str:
    return (f"val {row['val_accuracy']:.3f}  test {row['test_accuracy']:.3f}  "
            f"loss {row.get('train_loss', float('nan')):.3f}  {human_bytes(row['bytes_total'])}")


class RunProgress:
    """``update(round, row)`` after every round (``row``: the metrics when the round was evaluated);
    a bench counts its runs with it (``unit="run"``)."""

    def __init__(self, title: str, total: int, completed: int, *, enabled: bool = True,
                 stream: TextIO | None = None, unit: str = "round"):
        self.title, self.total, self.first, self.unit = title, total, completed, unit
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.live = enabled and self.stream.isatty()
        self.every = max(1, total // 20)
        self.started = time.perf_counter()
        self.last = ""
        self._bar = None

    def __enter__(self) -> "RunProgress":
        if self.live:  # rich is loaded only for a live bar
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn())
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total, completed=self.first, status="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, r: int, row: dict[str, Any] | None) -> None:
        if row is not None:
            self.last = status(row)
        if self._bar is not None:
            self._bar.update(self._task, completed=r, status=self.last)
        elif self.enabled and (r % self.every == 0 or r == self.total):
            elapsed = time.perf_counter() - self.started
            eta = elapsed / max(r - self.first, 1) * (self.total - r)
            print(f"{self.title}: {self.unit} {r}/{self.total}  {self.last}  elapsed {elapsed:.0f} s  eta {eta:.0f} s",
                  file=self.stream, flush=True)
