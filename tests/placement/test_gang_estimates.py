"""Gang estimates kept across decisions (`gang._FILLS`) decide exactly what a cold search does.

Consecutive decisions on a churning cluster see mostly the same racks, so the estimate of a
domain's class counts is kept between decisions; these check that a warm decision equals a
cold one, on the NVL72 racks where the regression against a31d26b was measured, and after the
cluster changed under it.
"""

from __future__ import annotations

from gputopo.placement import gang, intranode, place
from gputopo.request import request_from_mapping
from gputopo.sim.scenarios import Occupancy, build_nodes, empty_snapshot

TP8_ON_TRAYS = request_from_mapping(
    {"groups": [{"name": "tp", "pods": 2, "gpus_per_pod": 4, "scope": {"required": "nvlink"}}]}
)
GANG_64 = request_from_mapping(
    {"scope": {"preferred": "leaf"}, "groups": [{"name": "g", "pods": 16, "gpus_per_pod": 4}]}
)


def test_warm_decisions_equal_cold_ones_while_the_racks_churn() -> None:
    occupancy = Occupancy(empty_snapshot(build_nodes("nvl72", 1000)), seed=3)
    occupancy.fill(0.5)
    gang.clear_caches()
    kept = 0
    for _ in range(12):
        snap = occupancy.churn()
        for request in (TP8_ON_TRAYS, GANG_64):
            warm, _ = place(snap, request)
            kept = max(kept, len(gang._FILLS))
            gang.clear_caches()
            intranode.clear_caches()
            cold, _ = place(snap, request)
            assert warm == cold
    assert kept > 0  # the warm decisions did use kept estimates
