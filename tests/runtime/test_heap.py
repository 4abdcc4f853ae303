"""The heap policy: survivors frozen out of collections, a full collection when due."""

from __future__ import annotations

import asyncio
import gc
import math
import weakref
from collections.abc import Iterator

import pytest

from gputopo.app.cli import main
from gputopo.runtime.heap import LongLivedHeap
from tests import looptime


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Leave the interpreter as the test found it: nothing frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_step_freezes_what_lives_and_a_due_step_collects_frozen_cycles() -> None:
    clock = Clock()
    heap = LongLivedHeap(freeze_every_s=30.0, full_every_s=100.0, clock=clock)
    survivor = [object() for _ in range(10)]
    cycle = Cycle()
    heap.step()
    assert gc.get_freeze_count() > len(survivor)
    assert heap.stats().full_collections == 0
    # A cycle dropped while frozen: no collection sees it until the next full one.
    collected: list[bool] = []
    watch = weakref.ref(cycle, lambda _: collected.append(True))
    del cycle
    gc.collect()
    assert not collected
    assert watch() is not None
    clock.now = 99.0
    heap.step()
    assert not collected
    clock.now = 100.0
    heap.step()  # due: unfreeze, collect, freeze again
    assert collected
    assert watch() is None
    stats = heap.stats()
    assert (stats.freezes, stats.full_collections) == (3, 1)
    assert stats.frozen_objects == gc.get_freeze_count() > 0
    del survivor


def test_acyclic_objects_frozen_are_still_freed_when_dropped() -> None:
    heap = LongLivedHeap(freeze_every_s=1.0, clock=Clock())

    class Leaf:
        pass

    leaf = Leaf()
    watch = weakref.ref(leaf)
    heap.step()
    del leaf  # reference counting frees it, frozen or not
    assert watch() is None


NONSENSE = [(-1.0, 10.0), (1.0, 0.0), (1.0, -5.0), (math.nan, 10.0), (1.0, math.nan)]


@pytest.mark.parametrize(("freeze", "full"), NONSENSE)
def test_nonsense_intervals_are_refused(freeze: float, full: float) -> None:
    with pytest.raises(ValueError, match="--heap-freeze must be >= 0"):
        LongLivedHeap(freeze_every_s=freeze, full_every_s=full)


@pytest.mark.parametrize(("freeze", "full"), NONSENSE)
def test_the_command_refuses_them_with_the_same_words(
    freeze: float, full: float, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--heap-freeze", str(freeze), "--heap-full-collection", str(full)]
    assert main(["aggregator", "--insecure", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--heap-freeze must be >= 0 and --heap-full-collection > 0" in err


def test_off_is_not_run() -> None:
    heap = LongLivedHeap(freeze_every_s=0.0)
    assert not heap.enabled
    with pytest.raises(ValueError, match="off"):
        asyncio.run(heap.run())


def test_run_steps_once_per_interval() -> None:
    """The root task's timer, on loop time (no real waiting): three steps in 95 s at 30 s."""
    heap = LongLivedHeap(freeze_every_s=30.0, full_every_s=3600.0)

    async def scenario() -> int:
        task = asyncio.create_task(heap.run())
        await asyncio.sleep(95.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return heap.stats().freezes

    assert looptime.run(scenario()) == 3


def test_run_freezes_what_a_full_collection_of_the_interpreter_left() -> None:
    """A full collection the interpreter makes (here gc.collect) is followed, on the loop, by a
    freeze of its survivors; the callback is gone once the task ends."""
    heap = LongLivedHeap(freeze_every_s=3600.0)
    callbacks = len(gc.callbacks)

    async def scenario() -> tuple[int, int, int]:
        task = asyncio.create_task(heap.run())
        await asyncio.sleep(0)  # the task registers its callback
        survivors = [[i] for i in range(1000)]
        young = gc.get_freeze_count()
        gc.collect(1)  # not a full collection: nothing to freeze after it
        await asyncio.sleep(0)
        after_young = heap.stats().after_collection
        gc.collect(2)
        gc.collect(2)  # two before the loop turns: one freeze scheduled
        await asyncio.sleep(0)
        frozen = gc.get_freeze_count() - young
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert len(survivors) == 1000
        return after_young, heap.stats().after_collection, frozen

    # Only the test's own collections: an automatic one (any allocation may start one) would be
    # a full collection the test did not count.
    gc.disable()
    try:
        after_young, after_full, frozen = asyncio.run(scenario())
    finally:
        gc.enable()
    assert (after_young, after_full) == (0, 1)
    assert frozen >= 1000
    assert heap.stats().freezes == 1
    assert len(gc.callbacks) == callbacks
