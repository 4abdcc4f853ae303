"""The reservation book on its own: no aggregator, a fake clock.

The book keeps no store since the placement core writes through one (`gputopo.core`); what a
store sees is tested there (`tests/test_core.py`), against `MemoryStore`."""

from __future__ import annotations

import pytest

from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.reservations import Reservation, ReservationBook, ReservationError


def placed(**gpus: tuple[int, ...]) -> PlacementResult:
    pods = tuple(
        PodPlacement("g", 0, i, 0, node, held) for i, (node, held) in enumerate(gpus.items())
    )
    return PlacementResult(placed=True, policy="test", pods=pods)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_reserve_commit_release_and_what_each_node_holds(clock: Clock) -> None:
    moved: list[str] = []
    book = ReservationBook(clock=clock, on_change=moved.extend)
    res = book.reserve(placed(a=(0, 1), b=(3,)), ttl_s=10.0, job="ns/j")
    assert (res.expires_at, res.job, res.gpu_count) == (110.0, "ns/j", 3)
    assert moved == ["a", "b"]
    assert book.held_gpus() == {"a": frozenset({0, 1}), "b": frozenset({3})}
    assert book.free("a", 4) == frozenset({2, 3})
    assert book.free("b", 2) == frozenset({0, 1})  # held GPU 3 is beyond what b has now
    with pytest.raises(ValueError, match=r"GPUs \[1\] of a are already held"):
        book.reserve(placed(a=(1, 2)), ttl_s=10.0)
    book.commit(res.id, owner="ns/pg")
    clock.now = 1e9
    assert book.expire() == 0  # committed: kept until released
    assert book.reservations()[0].committed
    assert book.release(res.id) is res
    assert (book.held_gpus(), book.reservations(), moved) == ({}, [], ["a", "b", "a", "b"])
    with pytest.raises(ReservationError):
        book.release(res.id)
    with pytest.raises(ReservationError):
        book.commit(res.id)


def test_expiry_frees_gpus(clock: Clock) -> None:
    book = ReservationBook(clock=clock)
    short = book.reserve(placed(a=(0,)), ttl_s=1.0)
    long = book.reserve(placed(a=(1,)), ttl_s=60.0)
    clock.now += 1.0
    assert book.reservation(short.id) is None  # reads expire first
    assert book.reservations() == [long]
    assert book.held("a") == frozenset({1})


def test_restore_after_a_restart(clock: Clock) -> None:
    first = ReservationBook(clock=clock)
    kept = first.commit(first.reserve(placed(a=(0, 1)), ttl_s=5.0).id, owner="ns/pg")
    moved: list[str] = []
    second = ReservationBook(clock=clock, on_change=moved.extend)
    second.restore(first.reservations())
    assert second.reservations() == [kept]
    assert (second.held("a"), moved) == (frozenset({0, 1}), ["a"])
    # Restoring the same id again replaces it rather than holding its GPUs twice.
    second.restore([Reservation(kept.id, {"b": frozenset({2})}, None)])
    assert second.held_gpus() == {"b": frozenset({2})}
