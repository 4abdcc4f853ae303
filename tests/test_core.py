"""The placement core without any transport or Kubernetes: a cluster state, a `MemoryStore`.

What every transport relies on is held here once: a promise is stored before it is answered,
a write the store refuses leaves nothing held, only the leader's restored book answers, only the
holder changes a reservation, and the answer names each GPU's UUID and nearest NIC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace

import pytest

from aggregator.state import ClusterState
from gputopo.core import (
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    PermissionDeniedError,
    PlacementCore,
    UnavailableError,
)
from gputopo.delta import DeltaError, NodeDelta
from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.request import Group, PlacementRequest
from gputopo.reservations import MemoryStore, Reservation, StoreError
from tests import looptime
from tests.builders import pcie_node

FOUR = PlacementRequest(groups=(Group("tp", gpus_per_pod=4),), job="ns/train")


def _state(now: list[float]) -> ClusterState:
    state = ClusterState(clock=lambda: now[0])
    state.add_static(pcie_node("n1", gpus=8, nics=2))
    return state


class RefusingStore(MemoryStore):
    """A store whose writes fail (an API server away), to show nothing is held then."""

    async def put(self, reservation: Reservation) -> None:
        raise StoreError("the API server is away")

    async def delete(self, rid: str) -> None:
        raise StoreError("the API server is away")

    async def sync(self, live: Iterable[str]) -> int:
        raise StoreError("the API server is away")


def test_each_promise_is_stored_before_it_is_answered() -> None:
    now = [1000.0]
    store = MemoryStore()
    core = PlacementCore(state=_state(now), clock=lambda: now[0], store=store)

    async def scenario() -> None:
        dry = await core.place(FOUR, dry_run=True)
        assert (dry.result.placed, dry.reservation, store.stored()) == (True, None, [])
        placed = await core.place(FOUR, ttl_s=30.0, caller="binder")
        held = placed.reservation
        assert held is not None
        assert [(r.id, r.expires_at, r.holder) for r in store.stored()] == [
            (held.id, 1030.0, "binder")
        ]
        await core.commit(held.id, owner="ns/pg", caller="binder")
        assert [(r.committed, r.owner) for r in store.stored()] == [(True, "ns/pg")]
        freed = await core.release(held.id, caller="binder")
        assert (freed.gpu_count, store.stored(), core.book.reservations()) == (4, [], [])

    asyncio.run(scenario())


def test_a_write_the_store_refuses_holds_nothing_and_says_unavailable() -> None:
    now = [1000.0]
    state = _state(now)
    core = PlacementCore(state=state, clock=lambda: now[0], store=RefusingStore())

    async def scenario() -> None:
        with pytest.raises(UnavailableError, match="could not be stored, so it was not made"):
            await core.place(FOUR)

    asyncio.run(scenario())
    assert (state.held_gpus(), len(state.snapshot().node("n1").free)) == ({}, 8)
    assert core.stats.rejections == {"UNAVAILABLE": 1}


def test_a_release_the_store_refuses_frees_nothing() -> None:
    now = [1000.0]
    store = MemoryStore()
    core = PlacementCore(state=_state(now), clock=lambda: now[0], store=store)

    async def scenario() -> None:
        held = (await core.place(FOUR)).reservation
        assert held is not None
        core.store = RefusingStore()
        with pytest.raises(UnavailableError, match="release could not be stored"):
            await core.release(held.id)
        assert core.book.reservation(held.id) is held

    asyncio.run(scenario())


def test_a_follower_and_an_unrestored_leader_answer_nothing_about_reservations() -> None:
    now = [1000.0]
    leading = [False]
    store = MemoryStore()
    core = PlacementCore(
        state=_state(now),
        clock=lambda: now[0],
        store=store,
        restored=False,
        leading=lambda: leading[0],
    )

    async def scenario() -> None:
        with pytest.raises(NotLeaderError, match="not the leader") as refused:
            await core.place(FOUR)
        assert refused.value.code == "UNAVAILABLE"
        assert (await core.place(FOUR, dry_run=True)).result.placed  # dry runs need no book
        leading[0] = True
        result = PlacementResult(True, "gputopo", pods=(PodPlacement("tp", 0, 0, 0, "n1", (0, 1)),))
        await store.put(Reservation("kept", {"n1": frozenset({0, 1})}, None, result=result))
        asking = asyncio.create_task(core.explain("kept"))
        await asyncio.sleep(0)
        assert not asking.done()  # waits for the restore rather than calling it unknown
        assert await core.restore() == 1
        assert (await asking).reservation is not None
        assert core.book.held("n1") == frozenset({0, 1})

    asyncio.run(scenario())


def test_only_the_holder_commits_or_releases() -> None:
    now = [1000.0]
    core = PlacementCore(state=_state(now), clock=lambda: now[0])

    async def scenario() -> None:
        held = (await core.place(FOUR, caller="binder")).reservation
        assert held is not None
        for verb in (core.commit(held.id, caller="intruder"), core.release(held.id)):
            with pytest.raises(PermissionDeniedError, match="made by another caller"):
                await verb
        with pytest.raises(NotFoundError, match="no live reservation 'nope'"):
            await core.commit("nope", caller="binder")

    asyncio.run(scenario())
    assert (core.denied, core.stats.rejections) == (2, {"PERMISSION_DENIED": 2, "NOT_FOUND": 1})


@pytest.mark.parametrize(
    ("ttl_s", "message"),
    [
        pytest.param(0.0, "reservation_ttl: must be positive", id="a TTL of zero"),
        pytest.param(7200.0, "at most 3600 s", id="a TTL past the maximum"),
    ],
)
def test_a_bad_ttl_names_the_field(ttl_s: float, message: str) -> None:
    now = [1000.0]
    core = PlacementCore(state=_state(now), clock=lambda: now[0])
    with pytest.raises(InvalidRequestError, match=message):
        asyncio.run(core.place(FOUR, ttl_s=ttl_s))


def test_the_answer_names_each_gpus_uuid_and_nearest_nic() -> None:
    now = [1000.0]
    core = PlacementCore(state=_state(now), clock=lambda: now[0])
    decision = asyncio.run(core.place(FOUR, dry_run=True))
    (pod,) = decision.result.pods
    assert pod.uuids == tuple(f"GPU-n1-{g}" for g in pod.gpus)
    assert len(pod.nics) == 4
    assert set(pod.nics) <= {"eth0", "eth1"}
    assert decision.generation == core.state.snapshot().generation


def test_the_state_refuses_a_delta_its_base_cannot_take_before_changing_anything() -> None:
    # Moved from ingest into the state, where the incarnation rule it re-stated lives.
    now = [1000.0]
    state = ClusterState(clock=lambda: now[0])
    node = pcie_node("n1", gpus=2)
    state.apply_snapshot(node, incarnation=5, sequence=1)
    stray = replace(node.gpus[0], index=3)  # the node has GPUs 0 and 1: a new one is 2
    with pytest.raises(DeltaError, match=r"delta\.gpus\[0\]\.index: is 3; the node has 2"):
        state.apply_delta("n1", NodeDelta(gpus=(stray,)), incarnation=5, sequence=2)
    record = state.record("n1")
    assert record is not None
    assert (record.sequence, record.topology.gpu_count) == (1, 2)


class FlakyStore(MemoryStore):
    """A store that cannot be read the first `failures` times (an API server starting up)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def load(self, *, now: float) -> list[Reservation]:
        if self.failures:
            self.failures -= 1
            raise StoreError("connection refused")
        return await super().load(now=now)


def test_restore_backs_off_until_the_store_answers_in_loop_time() -> None:
    # Fake loop time (tests/looptime.py): 0.5 s then 1 s of backoff, and no real second spent.
    async def scenario() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        core = PlacementCore(
            state=_state([1000.0]), clock=loop.time, store=FlakyStore(2), restored=False
        )
        start = loop.time()
        restored = await core.restore()
        return restored, loop.time() - start

    assert looptime.run(scenario()) == (0, 1.5)


def test_an_unrestored_leader_says_unavailable_after_ten_seconds_of_loop_time() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        core = PlacementCore(state=_state([1000.0]), clock=loop.time, restored=False)
        start = loop.time()
        with pytest.raises(UnavailableError, match="still being restored"):
            await core.commit("any")
        return loop.time() - start

    assert looptime.run(scenario()) == 10.0


def test_an_expired_reservation_frees_its_gpus_and_leaves_the_store() -> None:
    async def scenario() -> tuple[int, int, list[Reservation]]:
        loop = asyncio.get_running_loop()
        store = MemoryStore()
        state = ClusterState(clock=loop.time)
        state.add_static(pcie_node("n1", gpus=8))
        core = PlacementCore(state=state, clock=loop.time, store=store)
        await core.place(FOUR, ttl_s=30.0)
        held = len(state.snapshot().node("n1").free)
        await asyncio.sleep(30.0)  # the TTL, in loop time
        gone = await core.sync()
        return held, gone, store.stored()

    assert looptime.run(scenario(), start=1000.0) == (4, 1, [])
