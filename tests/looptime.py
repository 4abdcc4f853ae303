"""Fake loop time for asyncio tests of timeouts, TTLs and backoff, after kopf's `looptime`.

`run(coro)` runs a coroutine on an event loop whose clock only moves when the loop would
otherwise wait: instead of sleeping until its next timer, it jumps there. `asyncio.sleep(30)`,
`wait_for(..., 10)` and a backoff of 0.5, 1, 2 s take no real time, and what the test reads from
`loop.time()` is exact, so no bound has to allow for a slow machine. While work runs in an
executor (`run_in_executor`, `to_thread`) the clock stands still and the loop waits for it in
real time, so a deadline cannot fire merely because a thread took a moment. I/O is polled
without blocking; a test that waits on real sockets spins rather than jumps: use this for logic
that waits on time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple

__all__ = ["FakeTimeLoop", "run"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; a wait with a timeout moves the loop's clock instead."""

    def __init__(self, loop: FakeTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._loop.in_threads:  # the clock stands still; wait for the thread's wake-up
            return super().select(timeout)
        ready = super().select(0)
        if not ready and timeout is not None and timeout > 0:
            self._loop.now += timeout
        return ready


class FakeTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on fake time, starting at `start` (seconds)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.in_threads = 0  # executor calls not yet done
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        future = super().run_in_executor(executor, func, *args)
        self.in_threads += 1

        def done(_: asyncio.Future[_T]) -> None:
            self.in_threads -= 1

        future.add_done_callback(done)
        return future


def run(coro: Coroutine[Any, Any, _T], *, start: float = 0.0) -> _T:
    """Run `coro` to the end on a fresh `FakeTimeLoop`."""
    loop = FakeTimeLoop(start)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
