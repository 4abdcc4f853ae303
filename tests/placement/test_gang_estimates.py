"""Gang estimates kept across decisions (`gang._FILLS`) decide exactly what a cold search does.

Consecutive decisions on a churning cluster see mostly the same racks, so the estimate of a
domain's class counts is kept between decisions; these check that a warm decision equals a
cold one, on the NVL72 racks where the regression against a31d26b was measured, and after the
cluster changed under it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gputopo.placement import clear_caches, gang, place
from gputopo.request import Scope, request_from_mapping
from gputopo.sim.scenarios import Occupancy, build_nodes, empty_snapshot

TP8_ON_TRAYS = request_from_mapping(
    {"groups": [{"name": "tp", "pods": 2, "gpus_per_pod": 4, "scope": {"required": "nvlink"}}]}
)
GANG_32 = request_from_mapping(
    {"scope": {"preferred": "leaf"}, "groups": [{"name": "g", "pods": 8, "gpus_per_pod": 4}]}
)
GANG_64 = request_from_mapping(
    {"scope": {"preferred": "leaf"}, "groups": [{"name": "g", "pods": 16, "gpus_per_pod": 4}]}
)


def test_warm_decisions_equal_cold_ones_while_the_racks_churn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each warm decision starts from the estimates every warm decision before it kept (the
    cold ones, run in between to compare, must not wipe them), and must use some of them:
    two gangs of one pod size but different pod counts share everything but their count."""
    occupancy = Occupancy(empty_snapshot(build_nodes("nvl72", 1000)), seed=3)
    occupancy.fill(0.5)
    calls = Counter[str]()
    remembered, fill_estimate = gang._remembered, gang._fill_estimate

    def asked(*args: Any) -> Any:
        calls["asked"] += 1
        return remembered(*args)

    def computed(*args: Any) -> Any:
        calls["computed"] += 1
        return fill_estimate(*args)

    monkeypatch.setattr(gang, "_remembered", asked)
    monkeypatch.setattr(gang, "_fill_estimate", computed)
    gang.clear_caches()
    kept: dict[tuple[object, ...], object] = {}
    reused = 0
    for _ in range(12):
        snap = occupancy.churn()
        for request in (TP8_ON_TRAYS, GANG_32, GANG_64):
            gang._FILLS.clear()
            gang._FILLS.update(kept)  # type: ignore[arg-type]
            before = calls["asked"] - calls["computed"]
            warm, _ = place(snap, request)
            reused += calls["asked"] - calls["computed"] - before
            kept = dict(gang._FILLS)
            clear_caches()
            cold, _ = place(snap, request)
            assert warm == cold
    assert reused > 0  # the warm decisions did use kept estimates


@pytest.mark.parametrize("layout", ["nvl72", "dgx-h100", "mixed"])
def test_counts_past_the_pods_do_not_change_an_estimate(layout: str) -> None:
    """`_signature` caps each class's count at the gang's pods, so racks with 7 and 11 free
    trays share one estimate: on every domain of a half-full cluster, raising the counts that
    are already at least the pods (keeping the small-domain flag) gives the same signature and
    the same estimate, and lowering one below the pods gives another signature."""
    snapshot = Occupancy(empty_snapshot(build_nodes(layout, 1000)), seed=5).fill(0.5)
    raised = lowered = 0
    for request in (TP8_ON_TRAYS, GANG_32, GANG_64):
        (group,) = request.groups
        for scope in (Scope.NVLINK, Scope.LEAF, Scope.SPINE):
            for domain in snapshot.domains(scope):
                classes = dict(snapshot.domain_classes(scope, domain))
                usable = {
                    c: n for c, n in classes.items() if c[1].bit_count() >= group.gpus_per_pod
                }
                small = sum(usable.values()) <= gang.SMALL_DOMAIN
                room = gang.SMALL_DOMAIN - sum(usable.values()) if small else 50
                more = {
                    c: n + room if c in usable and n >= group.pods else n
                    for c, n in classes.items()
                }
                if room > 0 and more != classes:
                    raised += 1
                    assert gang._signature(more, group, True) == gang._signature(
                        classes, group, True
                    )
                    assert gang._fill_estimate(more, group, True) == gang._fill_estimate(
                        classes, group, True
                    )
                fewer = {c: n - 1 for c, n in usable.items() if 0 < n <= group.pods}
                if fewer:
                    lowered += 1
                    assert gang._signature({**classes, **fewer}, group, True) != gang._signature(
                        classes, group, True
                    )
    # each cluster exercises both directions (12 and 6 domains at least, seed 5)
    assert raised >= 10
    assert lowered >= 5
