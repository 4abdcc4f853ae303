"""How often the aggregator asks exporters for heartbeats, and when silence means stale.

Why pace at all: an exporter heartbeats after `interval` of silence, so a fleet of N idle
nodes sends N / interval heartbeats a second, each costing the aggregator's one event loop
about as much gRPC transport as a delta. At 20,000 nodes and a fixed 5 s that is 4,000
reports a second of nothing but "still here". The aggregator instead announces the interval
in every acknowledgement (`ReportResponse.heartbeat_interval`) and lengthens it with the
number of live streams so that heartbeats stay under a budget (Nomad's servers do the same
with their heartbeat TTL and `max_heartbeats_per_second`). The price is slower detection of
a silent node: staleness keeps the configured multiple of the interval.

The rules, all pure (the clock is a parameter):

1. `paced_interval`: max(base, streams / budget), rounded up to whole seconds so that the
   announcement moves only when the fleet crosses a multiple of the budget, capped.
2. `HeartbeatPacer.update` grows the interval at once; it shrinks only when the smaller
   interval would hold with `SHRINK_MARGIN` more streams, so a fleet hovering at a
   boundary does not make it flap.
3. `HeartbeatPacer.stale_after_s` is the configured multiple (stale-after / base interval)
   of the largest interval that an obedient exporter may still be waiting out: the current
   one, or a larger one announced before a shrink, held for one stale window of that larger
   interval. Growth needs no hold: the new threshold is the larger one, from the moment the
   first acknowledgement carries it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = [
    "DEFAULT_MAX_HEARTBEATS_PER_SECOND",
    "MAX_INTERVAL_S",
    "SHRINK_MARGIN",
    "HeartbeatPacer",
    "paced_interval",
]

# 1,000 a second keeps a fleet of up to 5,000 nodes at the 5 s default and gives 20,000 nodes
# 20 s: about a quarter of what the aggregator's loop serves (4,000 reports/s was a whole core).
DEFAULT_MAX_HEARTBEATS_PER_SECOND = 1000.0
# Past a minute between heartbeats, staleness (6 intervals by default) would take six minutes
# to notice a dead node, and a ghost (10 min silent, no stream) would outlive nothing.
MAX_INTERVAL_S = 60.0
# The interval shrinks only when it would still be enough for 10 % more streams.
SHRINK_MARGIN = 0.1


def paced_interval(
    streams: int, *, base_s: float, max_per_second: float, cap_s: float = MAX_INTERVAL_S
) -> float:
    """Seconds between heartbeats for `streams` live report streams: `base_s`, or longer so
    that the streams send at most `max_per_second` heartbeats a second (whole seconds), never
    past `cap_s` (nor below `base_s`). `max_per_second` 0 turns pacing off."""
    if max_per_second <= 0 or streams / max_per_second <= base_s:
        return base_s  # within budget: a sub-second base (tests, demos) stays as it is
    return max(base_s, min(float(math.ceil(streams / max_per_second)), cap_s))


class HeartbeatPacer:
    """The announced heartbeat interval and the staleness threshold that follows it (module
    docstring). `clock` returns seconds (any epoch, only differences are used)."""

    def __init__(
        self,
        *,
        base_s: float,
        stale_after_s: float,
        max_per_second: float = DEFAULT_MAX_HEARTBEATS_PER_SECOND,
        clock: Callable[[], float],
        cap_s: float = MAX_INTERVAL_S,
    ) -> None:
        if not base_s > 0:
            raise ValueError(f"heartbeat interval must be positive, not {base_s}")
        if max_per_second < 0:
            raise ValueError(f"max heartbeats per second must be at least 0, not {max_per_second}")
        self.base_s = base_s
        self.max_per_second = max_per_second
        self.cap_s = max(cap_s, base_s)
        # How many intervals of silence make a node stale (30 s / 5 s: 6).
        self.multiple = stale_after_s / base_s
        self._clock = clock
        self.interval_s = base_s
        # (until when, interval): larger intervals announced before a shrink, still honoured.
        self._held: list[tuple[float, float]] = []

    def update(self, streams: int) -> bool:
        """Pace for `streams` live report streams; True when the announced interval changed."""
        want = paced_interval(
            streams, base_s=self.base_s, max_per_second=self.max_per_second, cap_s=self.cap_s
        )
        if want < self.interval_s:
            roomy = paced_interval(
                math.ceil(streams * (1 + SHRINK_MARGIN)),
                base_s=self.base_s,
                max_per_second=self.max_per_second,
                cap_s=self.cap_s,
            )
            if roomy >= self.interval_s:
                return False
            want = roomy
        if want == self.interval_s:
            return False
        if want < self.interval_s:
            # Exporters told the old interval may wait it out once before they hear the new
            # one: keep its threshold for one stale window of it.
            old = self.interval_s
            self._held.append((self._clock() + self.multiple * old, old))
        self.interval_s = want
        return True

    @property
    def stale_after_s(self) -> float:
        """Seconds of silence after which a node is stale, now."""
        now = self._clock()
        self._held = [(until, s) for until, s in self._held if until > now]
        longest = max([self.interval_s, *(s for _, s in self._held)])
        return self.multiple * longest
