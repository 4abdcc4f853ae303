"""The scheduler's metric families (names fixed across the project: `gputopo_scheduler_*`).

The binder keeps plain numbers; `SchedulerCollector` turns them into families on each scrape,
as the other processes do, so names and help cannot drift from `SCHEDULER_METRICS`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gputopo.runtime.metrics import MetricSpec, counter, family, gauge, histogram, histogram_family

__all__ = ["SCHEDULER_METRICS", "SchedulerCollector", "SchedulerStats"]

_P = "gputopo_scheduler_"
GROUPS_PENDING = gauge(
    "groups_pending", "Gangs waiting: below their minimum or not placeable yet.", prefix=_P
)
TIME_TO_BIND = histogram(
    "time_to_bind_seconds",
    "From a gang's minimum reached (all its pods seen) to every pod bound.",
    prefix=_P,
)
BIND_ATTEMPTS = counter("bind_attempts", "Binding subresource calls made.", prefix=_P)
REPAIRS = counter(
    "repairs",
    "Gangs undone (bound pods deleted, reservation released) to be placed again.",
    prefix=_P,
)
DECISIONS = counter(
    "decisions",
    "Gang decisions by outcome: bound, unschedulable, invalid, undone, error.",
    "outcome",
    prefix=_P,
)
SCHEDULER_METRICS: tuple[MetricSpec, ...] = (
    GROUPS_PENDING,
    TIME_TO_BIND,
    BIND_ATTEMPTS,
    REPAIRS,
    DECISIONS,
)
_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(slots=True)
class SchedulerStats:
    """What the binder counts."""

    groups_pending: int = 0
    bind_attempts: int = 0
    repairs: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    bind_buckets: list[int] = field(default_factory=lambda: [0] * (len(_BUCKETS) + 1))
    bind_sum_s: float = 0.0

    def decided(self, outcome: str) -> None:
        """Count one decision."""
        self.decisions[outcome] = self.decisions.get(outcome, 0) + 1

    def bound_after(self, seconds: float) -> None:
        """One gang bound `seconds` after its minimum was reached."""
        self.bind_buckets[bisect.bisect_left(_BUCKETS, seconds)] += 1
        self.bind_sum_s += seconds


class SchedulerCollector:
    """A prometheus_client collector over `SchedulerStats`."""

    def __init__(self, stats: SchedulerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """The families, from the numbers now."""
        s = self._stats
        yield family(GROUPS_PENDING, value=s.groups_pending)
        cumulative, running = [], 0
        for bound, n in zip((*map(str, _BUCKETS), "+Inf"), s.bind_buckets, strict=True):
            running += n
            cumulative.append((bound, float(running)))
        yield histogram_family(TIME_TO_BIND, buckets=cumulative, sum_value=s.bind_sum_s)
        yield family(BIND_ATTEMPTS, value=s.bind_attempts)
        yield family(REPAIRS, value=s.repairs)
        decisions = family(DECISIONS)
        assert isinstance(decisions, CounterMetricFamily | GaugeMetricFamily)
        for outcome, n in sorted(s.decisions.items()):
            decisions.add_metric([outcome], n)
        yield decisions
