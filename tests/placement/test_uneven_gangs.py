"""Gangs whose pods land on nodes with different free GPUs, on recorded machines."""

from __future__ import annotations

from dataclasses import replace

from gputopo import cost
from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.machines import load_machine
from gputopo.placement import place
from gputopo.placement.predict import predict
from gputopo.placement.result import PodPlacement
from gputopo.request import request_from_mapping
from gputopo.topology import FabricPosition


def _dgx(name: str, busy: set[int]) -> NodeState:
    topo = load_machine("dgx-h100", node_name=name)
    topo = replace(topo, fabric=FabricPosition(tiers=("leaf-0", "spine")))
    return NodeState(topo, frozenset(range(8)) - busy)


def test_a_3x4_gang_takes_a_free_dgx_for_two_pods_rather_than_one_pod_per_node() -> None:
    snap = ClusterSnapshot([_dgx("a", set()), _dgx("b", {0, 1, 2, 3}), _dgx("c", {0, 1, 2, 3})])
    req = request_from_mapping({"groups": [{"name": "g", "pods": 3, "gpus_per_pod": 4}]})
    result, _ = place(snap, req)
    assert result.placed
    assert result.prediction is not None
    per_node = sorted(sum(1 for p in result.pods if p.node == n) for n in "abc")
    assert per_node == [0, 1, 2]
    spread = (
        PodPlacement("g", 0, 0, 0, "a", (0, 1, 2, 3)),
        PodPlacement("g", 0, 1, 4, "b", (4, 5, 6, 7)),
        PodPlacement("g", 0, 2, 8, "c", (4, 5, 6, 7)),
    )
    one_each = predict(snap, req, spread).communication_seconds
    assert cost.time_bucket(result.prediction.communication_seconds) < cost.time_bucket(one_each)


def test_the_node_with_fewer_gpus_of_a_gang_sets_the_network_time() -> None:
    snap = ClusterSnapshot([_dgx("a", set()), _dgx("b", {0, 1, 2, 3})])
    req = request_from_mapping({"groups": [{"name": "g", "pods": 3, "gpus_per_pod": 4}]})
    even = predict(
        ClusterSnapshot([_dgx("a", set()), _dgx("b", set())]),
        request_from_mapping({"groups": [{"name": "g", "pods": 4, "gpus_per_pod": 4}]}),
        (
            PodPlacement("g", 0, 0, 0, "a", (0, 1, 2, 3)),
            PodPlacement("g", 0, 1, 4, "a", (4, 5, 6, 7)),
            PodPlacement("g", 0, 2, 8, "b", (0, 1, 2, 3)),
            PodPlacement("g", 0, 3, 12, "b", (4, 5, 6, 7)),
        ),
    ).communication_seconds
    uneven = predict(
        snap,
        req,
        (
            PodPlacement("g", 0, 0, 0, "a", (0, 1, 2, 3)),
            PodPlacement("g", 0, 1, 4, "a", (4, 5, 6, 7)),
            PodPlacement("g", 0, 2, 8, "b", (4, 5, 6, 7)),
        ),
    ).communication_seconds
    # 8 + 4 moves less data than 8 + 8, but b's 4 GPUs push twice the shard through 4 NICs
    assert uneven > even
