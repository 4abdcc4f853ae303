"""The heartbeat pacing rule and the staleness threshold that follows it (gputopo.heartbeats)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gputopo.heartbeats import (
    DEFAULT_MAX_HEARTBEATS_PER_SECOND,
    MAX_INTERVAL_S,
    HeartbeatPacer,
    paced_interval,
)


@dataclass(frozen=True, slots=True)
class IntervalCase:
    streams: int
    max_per_second: float
    want_s: float
    base_s: float = 5.0


INTERVALS = [
    pytest.param(IntervalCase(0, 1000, 5.0), id="no streams keep the base"),
    pytest.param(IntervalCase(5000, 1000, 5.0), id="5,000 nodes at 1,000/s keep the 5 s base"),
    pytest.param(IntervalCase(5001, 1000, 6.0), id="one stream past the budget: a second more"),
    pytest.param(IntervalCase(10_000, 1000, 10.0), id="10,000 nodes get 10 s"),
    pytest.param(IntervalCase(20_000, 1000, 20.0), id="20,000 nodes get 20 s"),
    pytest.param(IntervalCase(20_000, 0, 5.0), id="0 turns pacing off"),
    pytest.param(IntervalCase(10_000_000, 1000, MAX_INTERVAL_S), id="capped"),
    pytest.param(IntervalCase(1000, 1000, 90.0, base_s=90.0), id="never below the base"),
    pytest.param(IntervalCase(3000, 200, 15.0), id="a smaller budget paces sooner"),
    pytest.param(IntervalCase(10, 1000, 0.2, base_s=0.2), id="a sub-second base within budget"),
    pytest.param(IntervalCase(300, 1000, 1.0, base_s=0.2), id="a sub-second base past budget"),
]


@pytest.mark.parametrize("case", INTERVALS)
def test_paced_interval(case: IntervalCase) -> None:
    got = paced_interval(case.streams, base_s=case.base_s, max_per_second=case.max_per_second)
    assert got == case.want_s


def test_the_default_budget_gives_20_s_at_20k_nodes() -> None:
    got = paced_interval(20_000, base_s=5.0, max_per_second=DEFAULT_MAX_HEARTBEATS_PER_SECOND)
    assert got == 20.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pacer(clock: Clock, max_per_second: float = 1000.0) -> HeartbeatPacer:
    return HeartbeatPacer(
        base_s=5.0, stale_after_s=30.0, max_per_second=max_per_second, clock=clock
    )


def test_growth_is_announced_at_once_and_staleness_follows() -> None:
    clock = Clock()
    p = pacer(clock)
    assert (p.interval_s, p.stale_after_s) == (5.0, 30.0)
    assert p.update(20_000)
    assert (p.interval_s, p.stale_after_s) == (20.0, 120.0)  # 6 intervals, as configured
    assert not p.update(20_000)  # the same fleet: no new announcement


def test_a_fleet_hovering_at_a_boundary_does_not_make_it_flap() -> None:
    clock = Clock()
    p = pacer(clock)
    p.update(20_001)
    assert p.interval_s == 21.0
    for streams in (20_000, 19_500, 20_001, 19_200):
        assert not p.update(streams), streams
    assert p.interval_s == 21.0
    assert p.update(15_000)  # well below: shrinks, leaving room for 10 % more
    assert p.interval_s == 17.0


def test_a_shrink_keeps_the_longer_threshold_for_one_old_stale_window() -> None:
    clock = Clock()
    p = pacer(clock)
    p.update(20_000)
    assert p.update(1000)
    assert p.interval_s == 5.0  # announced at once: exporters speed up
    assert p.stale_after_s == 120.0  # but one told 20 s may still wait 20 s
    clock.now += 119.0
    assert p.stale_after_s == 120.0
    clock.now += 2.0
    assert p.stale_after_s == 30.0


def test_several_shrinks_honour_the_largest_interval_still_held() -> None:
    clock = Clock()
    p = pacer(clock)
    p.update(30_000)  # 30 s
    p.update(15_000)  # 17 s (with the margin), 30 s held until +180 s
    clock.now += 100
    p.update(1000)  # 5 s, 17 s held until +100+102 s
    assert p.stale_after_s == 180.0
    clock.now += 81  # past the 30 s hold, inside the 17 s one
    assert p.stale_after_s == 102.0
    clock.now += 30
    assert p.stale_after_s == 30.0


def test_pacing_off_keeps_the_configured_threshold() -> None:
    clock = Clock()
    p = pacer(clock, max_per_second=0)
    assert not p.update(50_000)
    assert (p.interval_s, p.stale_after_s) == (5.0, 30.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"base_s": 0.0}, "heartbeat interval must be positive", id="zero base"),
        pytest.param({"max_per_second": -1.0}, "at least 0", id="negative budget"),
    ],
)
def test_bad_options_are_named(options: dict[str, float], message: str) -> None:
    kwargs: dict[str, float] = {"base_s": 5.0, "stale_after_s": 30.0, **options}
    with pytest.raises(ValueError, match=message):
        HeartbeatPacer(clock=Clock(), **kwargs)
