"""The damage pick visits the tightest domains first and stops early, yet picks the node the
full scan over every cell picks (`plans.best_node`, `plans._tightest_cells`)."""

from __future__ import annotations

import pytest

from gputopo.placement import place, plans
from gputopo.request import Scope, request_from_mapping
from gputopo.sim.scenarios import Occupancy, build_nodes, empty_snapshot

TP8 = request_from_mapping(
    {
        "job": "tp8",
        "groups": [{"name": "tp", "gpus_per_pod": 8, "scope": {"required": "nvlink"}}],
    }
)
TP8_TRAYS = request_from_mapping(
    {
        "job": "tp8",
        "groups": [{"name": "tp", "pods": 2, "gpus_per_pod": 4, "scope": {"required": "nvlink"}}],
    }
)
HALF = request_from_mapping({"job": "half", "groups": [{"name": "w", "gpus_per_pod": 4}]})


@pytest.mark.parametrize(
    ("layout", "request_", "busy"),
    [
        pytest.param("dgx-h100", TP8, 0.1, id="whole DGX nodes, mostly free leaves"),
        pytest.param("dgx-h100", TP8, 0.5, id="whole DGX nodes, half busy"),
        pytest.param("dgx-h100", TP8, 0.9, id="whole DGX nodes, nearly full"),
        pytest.param("dgx-h100", HALF, 0.5, id="half a DGX node, many classes"),
        pytest.param("nvl72", TP8_TRAYS, 0.3, id="two trays of an NVL72 rack"),
        pytest.param("nvl72", TP8_TRAYS, 0.8, id="two trays of a busy NVL72 rack"),
    ],
)
def test_the_early_stop_picks_what_the_full_scan_picks(
    monkeypatch: pytest.MonkeyPatch, layout: str, request_: object, busy: float
) -> None:
    occupancy = Occupancy(empty_snapshot(build_nodes(layout, 2304)), seed=11)
    occupancy.fill(busy)
    for _ in range(3):
        snap = occupancy.churn()
        monkeypatch.setattr(plans, "_FEW_CELLS", 0)  # every class through the early stop
        fast, _ = place(snap, request_, policy="gputopo")  # type: ignore[arg-type]
        monkeypatch.setattr(plans, "_FEW_CELLS", 10**9)  # every cell of every class
        full, _ = place(snap, request_, policy="gputopo")  # type: ignore[arg-type]
        assert fast.placed == full.placed
        assert fast.pods == full.pods


def test_a_common_class_is_decided_from_the_tightest_domains_alone() -> None:
    occupancy = Occupancy(empty_snapshot(build_nodes("dgx-h100", 8192)), seed=5)
    snap = occupancy.fill(0.5)
    assert snap.fit_scope is Scope.LEAF
    whole = next(c for c in snap.classes() if c[1] == c[0].full_mask)
    visited = plans._tightest_cells(snap, Scope.LEAF, whole, 8)
    holding = snap.class_cells(whole)
    assert visited, "a free node exists, so some cell holds one"
    # The early stop must leave most of the cells holding a free node unvisited; a generous
    # bound (half), as the cut depends only on the seeded occupancy, not on this machine.
    assert len(visited) < len(holding) / 2
