"""Progress of long work on stderr: a bar on a terminal, plain lines in logs and CI.

Benchmarks run for minutes; without a word an operator cannot tell a slow run from a hung one.
stdout stays for the figures (often `--json` piped into a tool), so progress goes to stderr. On a
terminal one line is redrawn in place; anywhere else (a CI log, a file) a redrawn line would be
noise, so plain lines are written, at most one per `min_interval_s` and always the last.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 24


class Progress:
    """Counts `done` of `total` steps of one piece of work called `label`."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        min_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = max(1, total)
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._began = clock()
        self._last: float | None = None
        self._closed = False

    def advance(self, steps: int = 1, note: str = "") -> None:
        """`steps` more are done; `note` says what is running now."""
        self.done = min(self.total, self.done + steps)
        now = self._clock()
        finished = self.done >= self.total
        if self._tty:
            if finished or self._last is None or now - self._last >= 0.1:
                self._stream.write("\r\x1b[K" + self._line(note, bar=True))
                self._stream.flush()
                self._last = now
        elif finished or self._last is None or now - self._last >= self._min_interval_s:
            self._stream.write(self._line(note, bar=False) + "\n")
            self._stream.flush()
            self._last = now

    def close(self) -> None:
        """End the bar's line (a terminal) and say how long the whole took."""
        if self._closed:
            return
        self._closed = True
        took = self._clock() - self._began
        if self._tty:
            self._stream.write("\n")
        self._stream.write(f"{self.label}: done in {took:.1f} s\n")
        self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self, note: str, *, bar: bool) -> str:
        count = f"{self.done}/{self.total}"
        tail = f" {note}" if note else ""
        if not bar:
            return f"{self.label}: {count}{tail}"
        filled = round(_WIDTH * self.done / self.total)
        return f"{self.label} [{'#' * filled}{'.' * (_WIDTH - filled)}] {count}{tail}"
