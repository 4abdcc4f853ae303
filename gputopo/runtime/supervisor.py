"""Root tasks that cannot die in silence: one that ends on its own ends the process.

A process's long-lived loops (the report stream, the binder, housekeeping, the watchers) run as
asyncio tasks that nothing awaits while the process serves. A bug in one used to end that task
alone: the exporter went on answering /healthz without reporting, and a scheduler kept renewing
its Lease and saying ready while no gang was bound cluster-wide. kopf's rule is the fix: a root
task that returns or raises is fatal. The process then stops cleanly (releasing its Lease, so
another replica takes over at once) and exits non-zero, so the kubelet restarts it.

A root task that is *cancelled* ended because the process asked (a follower stops its writers,
a shutdown stops everything): that is not a death.

    tasks = Supervisor("aggregator")
    tasks.spawn(housekeeping(), "housekeeping")
    await tasks.wait(stop)  # returns once `stop` is set; raises RootTaskDiedError if one died
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["RootTaskDiedError", "Supervisor"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class RootTaskDiedError(Exception):
    """A root task ended on its own; `task` names it, `__cause__` is what it raised (None when
    it returned)."""

    def __init__(self, process: str, task: str, error: BaseException | None) -> None:
        how = f"raised {type(error).__name__}: {error}" if error is not None else "returned"
        super().__init__(f"{process}: root task {task!r} {how}; stopping")
        self.task = task
        self.error = error


class Supervisor:
    """The root tasks of one process (see the module docstring)."""

    def __init__(self, process: str) -> None:
        self.process = process
        self._tasks: set[asyncio.Task[Any]] = set()
        self.died: RootTaskDiedError | None = None
        self._death = asyncio.Event()

    def spawn(self, coro: Coroutine[Any, Any, _T], name: str) -> asyncio.Task[_T]:
        """Start a root task; should it end other than by cancellation, the process ends."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self.died is not None:
            return
        error = task.exception()
        self.died = RootTaskDiedError(self.process, task.get_name(), error)
        log.critical("%s", self.died, exc_info=error)
        self._death.set()

    def check(self) -> None:
        """Raise `RootTaskDiedError` if a root task has died."""
        if self.died is not None:
            raise self.died from self.died.error

    async def wait(self, stop: asyncio.Event | None = None) -> None:
        """Return once `stop` is set (never without one); raise `RootTaskDiedError` as soon as a
        root task dies."""
        waits = [asyncio.ensure_future(self._death.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self.check()

    async def watch(self, main: Coroutine[Any, Any, _T]) -> _T:
        """Run `main` (the process's own loop, such as a leader election) until it returns;
        should a root task die first, `main` is cancelled (its cleanup runs) and
        `RootTaskDiedError` raised."""
        work = asyncio.ensure_future(main)
        death = asyncio.ensure_future(self._death.wait())
        try:
            await asyncio.wait([work, death], return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            self.check()
        return work.result()

    async def cancel(self) -> None:
        """Cancel every root task still running and wait for them (a shutdown: no death)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
