"""The garbage collector of a process whose state is millions of long-lived objects.

Why: the aggregator keeps every node's topology (millions of GC-tracked objects at 10,000
nodes) and allocates a few short-lived ones per report. CPython's collector walks every tracked
object of a generation when it collects it, and it runs a full collection each time the objects
that survived the younger generations grow by a quarter of the old ones: every delta leaves a new
amended topology behind, so at 4,000 reports/s the whole cluster state was walked again and again.
A native-stack profile of `gputopo bench ingest --nodes 10000` put 17 % of the aggregator's CPU
in `gc_collect_main`, each full collection a pause on the one event loop every report waits on.

The fix is `gc.freeze()` on a timer: what has lived `freeze_every_s` is moved to the permanent
generation, which no collection walks. Reference counting still frees those objects when they
are dropped (the topology, links and records are acyclic dataclasses and tuples); only garbage
*cycles* among frozen objects would stay. So that such cycles cannot pile up for the life of the
process, the heap is unfrozen and fully collected once per `full_every_s` (one pause an hour by
default, of about a second per 10,000 nodes), then frozen again.

A timer alone is not enough while the state grows fast. Between two freezes every new object
lands in the oldest generation, and the collector's own full collections (due whenever what
entered it since the last one passes a quarter of what it holds, which is little right after a
freeze) each walk everything that arrived since the freeze, so they get longer until the next
one: connecting 20,000 exporters, they grew to 0.3-1.2 s every 2-5 s, all connect long. So
`run` also freezes right after each full collection the interpreter makes on its own: what
survived one is long-lived by the same rule (and no garbage cycle among it is left, the
collection just looked), and the next one walks only what arrived since.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HeapStats", "LongLivedHeap", "heap_problem"]

log = logging.getLogger(__name__)


def heap_problem(freeze_every_s: float, full_every_s: float) -> str | None:
    """What is wrong with the two intervals (one line naming the flags), or None.
    `gputopo aggregator` prints it; `LongLivedHeap` refuses to start with it."""
    if not (freeze_every_s >= 0 and full_every_s > 0):  # NaN too
        return (
            "--heap-freeze must be >= 0 and --heap-full-collection > 0"
            f" (not {freeze_every_s:g} and {full_every_s:g})"
        )
    return None


@dataclass(frozen=True)
class HeapStats:
    """What the policy did: freezes, full collections and the last one's pause."""

    freezes: int
    full_collections: int
    frozen_objects: int
    last_full_pause_s: float
    # freezes made right after a full collection of the interpreter's own (counted in `freezes`)
    after_collection: int = 0


class LongLivedHeap:
    """Freeze what survived, and collect everything now and then (see the module docstring).

    `freeze_every_s` of 0 turns the policy off (the interpreter's default collector)."""

    def __init__(
        self,
        *,
        freeze_every_s: float = 30.0,
        full_every_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (problem := heap_problem(freeze_every_s, full_every_s)) is not None:
            raise ValueError(problem)
        self.freeze_every_s = freeze_every_s
        self.full_every_s = full_every_s
        self._clock = clock
        self._last_full = clock()
        self._freezes = 0
        self._after_collection = 0
        self._fulls = 0
        self._last_pause = 0.0
        self._freeze_due = False

    @property
    def enabled(self) -> bool:
        return self.freeze_every_s > 0

    def step(self) -> None:
        """One turn: a full collection when one is due, then a freeze."""
        now = self._clock()
        if now - self._last_full >= self.full_every_s:
            start = time.perf_counter()
            gc.unfreeze()
            gc.collect()
            self._last_pause = time.perf_counter() - start
            self._last_full = now
            self._fulls += 1
            log.info("full garbage collection took %.3f s", self._last_pause)
        gc.freeze()
        self._freezes += 1

    def stats(self) -> HeapStats:
        return HeapStats(
            self._freezes,
            self._fulls,
            gc.get_freeze_count(),
            self._last_pause,
            self._after_collection,
        )

    def _freeze_survivors(self) -> None:
        """On the loop, after a full collection of the interpreter's own: freeze what it left."""
        self._freeze_due = False
        gc.freeze()
        self._freezes += 1
        self._after_collection += 1

    async def run(self) -> None:
        """Step every `freeze_every_s` seconds, and freeze after every full collection the
        interpreter makes, for ever (a root task: spawn it only when `enabled`)."""
        if not self.enabled:
            raise ValueError("the heap policy is off (freeze_every_s=0): do not run it")
        loop = asyncio.get_running_loop()

        def collected(phase: str, info: dict[str, int]) -> None:
            # Called by the collector, in whichever thread allocated: only schedule here, once.
            if phase == "stop" and info["generation"] == 2 and not self._freeze_due:
                self._freeze_due = True
                loop.call_soon_threadsafe(self._freeze_survivors)

        gc.callbacks.append(collected)
        try:
            while True:
                await asyncio.sleep(self.freeze_every_s)
                self.step()
        finally:
            gc.callbacks.remove(collected)
