"""The exhaustive yardstick, and the gputopo policy against it on tiny clusters."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from gputopo import cost
from gputopo.cluster import ClusterSnapshot
from gputopo.placement import POLICIES, place
from gputopo.request import PlacementRequest, request_from_mapping
from gputopo.sim.exhaustive import TooLargeError, optimum
from tests.builders import nvswitch_node, pcie_node, snapshot

BRIDGED = [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_the_optimum_of_a_tp2_on_a_pcie_server_is_a_bridged_pair() -> None:
    snap = snapshot([pcie_node("p", bridged_pairs=BRIDGED)], used={"p": [0, 3]})
    best = optimum(snap, request_from_mapping({"groups": [{"name": "tp", "gpus_per_pod": 2}]}))
    assert best.valid == 15  # C(6, 2) pairs of the 6 free GPUs
    assert tuple(sorted(best.pods[0].gpus)) in [(4, 5), (6, 7)]


def test_no_valid_placement_is_an_infinite_optimum() -> None:
    snap = snapshot([nvswitch_node("n", gpus=4)])
    best = optimum(snap, request_from_mapping({"groups": [{"name": "tp", "gpus_per_pod": 8}]}))
    assert best.valid == 0
    assert math.isinf(best.seconds)


def test_too_large_instances_are_refused_up_front() -> None:
    snap = snapshot([nvswitch_node(f"n{i}") for i in range(4)])
    req = request_from_mapping({"groups": [{"name": "g", "pods": 4, "gpus_per_pod": 4}]})
    with pytest.raises(TooLargeError, match="assignments"):
        optimum(snap, req, max_trials=1000)


@st.composite
def tiny(draw: st.DrawFn) -> tuple[ClusterSnapshot, PlacementRequest]:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        tiers = (draw(st.sampled_from(["la", "lb"])), "s")
        kind = draw(st.sampled_from(["h100", "a100", "pcie", "tray"]))
        if kind == "h100":
            nodes.append(nvswitch_node(f"h{i}", gpus=4, nics=4, tiers=tiers))
        elif kind == "a100":
            nodes.append(nvswitch_node(f"a{i}", gpus=4, lanes=12, generation=3, tiers=tiers))
        elif kind == "pcie":
            nodes.append(pcie_node(f"p{i}", gpus=4, bridged_pairs=[(0, 1), (2, 3)], tiers=tiers))
        else:
            nodes.append(
                nvswitch_node(f"t{i}", gpus=4, nics=4, generation=5, tiers=tiers, domain="r")
            )
    used = {t.name: draw(st.sets(st.integers(0, 3), max_size=3)) for t in nodes}
    pattern = draw(st.sampled_from(["all_reduce", "all_to_all", "pipeline"]))
    shape = draw(st.sampled_from([(1, 2, 1), (1, 3, 1), (2, 1, 1), (2, 2, 1), (1, 2, 2)]))
    pods, per, replicas = shape
    data = {
        "groups": [
            {
                "name": "g",
                "pods": pods,
                "gpus_per_pod": per,
                "replicas": replicas,
                "pattern": pattern,
            }
        ]
    }
    return snapshot(nodes, used=used), request_from_mapping(data)


@given(case=tiny())
def test_gputopo_is_as_fast_as_the_optimum_and_no_policy_beats_the_optimum(
    case: tuple[ClusterSnapshot, PlacementRequest],
) -> None:
    snap, req = case
    best = optimum(snap, req)
    for name in sorted(POLICIES):
        result, _ = place(snap, req, policy=name)
        note(f"{name}: {result.pods} {result.prediction}")
        if result.placed:
            assert best.valid > 0
            assert result.prediction is not None
            assert result.prediction.communication_seconds >= best.seconds * (1 - 1e-9)
    ours, _ = place(snap, req)
    note(f"optimum: {best}")
    assert ours.placed == (best.valid > 0)
    if ours.placed:
        assert ours.prediction is not None
        assert cost.time_bucket(ours.prediction.communication_seconds) <= cost.time_bucket(
            best.seconds
        )
