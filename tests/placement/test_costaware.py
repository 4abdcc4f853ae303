"""The gputopo policy's choices, as stories: each test names the decision it defends."""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.placement import POLICIES, PlacementResult, UnknownPolicyError, place
from gputopo.request import RequestError, Scope, request_from_mapping
from tests.builders import nvswitch_node, pcie_node, snapshot

BRIDGED = [(0, 1), (2, 3), (4, 5), (6, 7)]


def decide(snap: Any, data: dict[str, Any], policy: str = "gputopo") -> PlacementResult:
    result, _ = place(snap, request_from_mapping(data), policy=policy)
    return result


def test_tp2_on_a_pcie_server_takes_a_bridged_pair() -> None:
    snap = snapshot([pcie_node("p", bridged_pairs=BRIDGED)])
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 2}]})
    assert result.placed
    assert tuple(sorted(result.pods[0].gpus)) in BRIDGED


def test_tp2_completes_a_broken_pair_before_breaking_a_whole_one() -> None:
    # GPU 0 is busy, so 1 is alone; 2-3 would be a whole pair. A TP-2 that needs NVLink should
    # take a whole bridged pair (it cannot use the lonely GPU 1 over NVLink), and a TP-1 should
    # take the lonely GPU 1 rather than break a pair.
    snap = snapshot([pcie_node("p", bridged_pairs=BRIDGED)], used={"p": [0]})
    tp2 = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 2}]})
    assert tuple(sorted(tp2.pods[0].gpus)) in BRIDGED[1:]
    tp1 = decide(snap, {"groups": [{"name": "one", "gpus_per_pod": 1}]})
    assert tp1.pods[0].gpus == (1,)


def test_required_nvlink_scope_keeps_a_tp4_out_of_a_pcie_server() -> None:
    # Four GPUs of a bridged-pair server are two NVLink islands, not one NVLink domain.
    snap = snapshot([pcie_node("p", bridged_pairs=BRIDGED)])
    result = decide(
        snap, {"groups": [{"name": "tp", "gpus_per_pod": 4, "scope": {"required": "nvlink"}}]}
    )
    assert not result.placed
    assert "nvlink" in result.reason.lower() or result.rejections


def test_tp8_prefers_the_faster_nvlink_node() -> None:
    a100 = nvswitch_node("a100", lanes=12, generation=3, tiers=("l1",))
    h100 = nvswitch_node("h100", lanes=18, generation=4, tiers=("l1",))
    result = decide(snapshot([a100, h100]), {"groups": [{"name": "tp", "gpus_per_pod": 8}]})
    assert result.pods[0].node == "h100"


def test_tp4_packs_into_a_partly_used_node_and_keeps_a_whole_node_free() -> None:
    nodes = [nvswitch_node("n1", tiers=("l",)), nvswitch_node("n2", tiers=("l",))]
    snap = snapshot(nodes, used={"n2": [0, 1, 2, 3]})
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 4}]})
    assert result.pods[0].node == "n2"


def test_tp4_on_an_empty_node_stays_on_one_numa_node() -> None:
    snap = snapshot([nvswitch_node("n", numa_nodes=2)])
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 4}]})
    numa = {snap.node("n").topology.gpus[g].numa_node for g in result.pods[0].gpus}
    assert len(numa) == 1


def test_gang_of_four_nodes_stays_under_one_leaf() -> None:
    nodes = [nvswitch_node(f"a{i}", tiers=("leaf-a", "spine")) for i in range(3)]
    nodes += [nvswitch_node(f"b{i}", tiers=("leaf-b", "spine")) for i in range(5)]
    result = decide(
        snapshot(nodes),
        {
            "scope": {"required": "leaf"},
            "groups": [{"name": "train", "pods": 4, "gpus_per_pod": 8}],
        },
    )
    assert result.placed
    assert {p.node[0] for p in result.pods} == {"b"}
    assert len({p.node for p in result.pods}) == 4


def test_gang_prefers_fast_nics_when_it_must_leave_the_node() -> None:
    slow = [nvswitch_node(f"s{i}", nic_mbps=100_000, tiers=("ls", "sp")) for i in range(2)]
    fast = [nvswitch_node(f"f{i}", nic_mbps=400_000, tiers=("lf", "sp")) for i in range(2)]
    result = decide(
        snapshot(slow + fast), {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 8}]}
    )
    assert {p.node for p in result.pods} == {"f0", "f1"}


def test_prefill_decode_with_a_kv_need_lands_in_the_nvl72_domain() -> None:
    h100 = [nvswitch_node(f"h{i}", tiers=("lh", "sp")) for i in range(4)]
    trays = [
        nvswitch_node(f"t{i:02}", gpus=4, nics=4, generation=5, tiers=("lt", "sp"), domain="nvl72")
        for i in range(18)
    ]
    result = decide(
        snapshot(h100 + trays),
        {
            "groups": [
                {"name": "prefill", "replicas": 2, "gpus_per_pod": 4},
                {"name": "decode", "replicas": 2, "gpus_per_pod": 4},
            ],
            "edges": [{"from": "prefill", "to": "decode", "min_gbps": 300}],
        },
    )
    assert result.placed
    assert {p.node[0] for p in result.pods} == {"t"}
    assert result.prediction is not None
    (edge,) = result.prediction.edges
    assert edge.satisfied
    assert edge.gbps >= 300


def test_kv_need_no_domain_can_meet_is_refused_with_the_bandwidth_reason() -> None:
    h100 = [nvswitch_node(f"h{i}", tiers=("lh", "sp")) for i in range(4)]
    result = decide(
        snapshot(h100),
        {
            "groups": [
                {"name": "prefill", "replicas": 2, "gpus_per_pod": 4},
                {"name": "decode", "replicas": 2, "gpus_per_pod": 4},
            ],
            "edges": [{"from": "prefill", "to": "decode", "min_gbps": 300}],
        },
    )
    assert not result.placed
    assert any(r.code == "bandwidth" for r in result.rejections)


def test_stale_nodes_are_never_used() -> None:
    snap = snapshot([nvswitch_node("fresh"), nvswitch_node("old")], stale=["fresh"])
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 8}]})
    assert result.pods[0].node == "old"


def test_node_selector_limits_the_nodes() -> None:
    snap = snapshot([nvswitch_node("a"), nvswitch_node("b")], labels={"b": {"pool": "inference"}})
    result = decide(
        snap,
        {"node_selector": {"pool": "inference"}, "groups": [{"name": "tp", "gpus_per_pod": 2}]},
    )
    assert result.pods[0].node == "b"


def test_spread_puts_replicas_on_different_nodes() -> None:
    snap = snapshot([nvswitch_node("a", tiers=("l",)), nvswitch_node("b", tiers=("l",))])
    result = decide(
        snap,
        {
            "groups": [
                {
                    "name": "r",
                    "replicas": 2,
                    "gpus_per_pod": 2,
                    "spread": {"across": "node", "required": True},
                }
            ]
        },
    )
    assert result.placed
    assert len({p.node for p in result.pods}) == 2


def test_too_big_says_how_many_are_free() -> None:
    snap = snapshot([nvswitch_node("a")], used={"a": range(4)})
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 8}]})
    assert not result.placed
    assert "only 4 free" in result.reason


def test_a_pod_never_spans_nodes() -> None:
    snap = snapshot([nvswitch_node("a", gpus=4), nvswitch_node("b", gpus=4)])
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 8}]})
    assert not result.placed


def test_ranks_are_consecutive_within_a_replica() -> None:
    nodes = [nvswitch_node(f"n{i}", tiers=("l",)) for i in range(2)]
    result = decide(snapshot(nodes), {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 8}]})
    assert sorted(p.rank for p in result.pods) == [0, 8]
    assert result.prediction is not None
    assert result.prediction.groups[0].span is Scope.LEAF


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_never_hands_out_a_busy_gpu(policy: str) -> None:
    snap = snapshot(
        [nvswitch_node("a", tiers=("l",)), pcie_node("b", tiers=("l",))],
        used={"a": [1, 3, 5], "b": [0]},
    )
    result = decide(snap, {"groups": [{"name": "g", "replicas": 3, "gpus_per_pod": 3}]}, policy)
    assert result.placed
    taken = [(p.node, g) for p in result.pods for g in p.gpus]
    assert len(taken) == len(set(taken)) == 9
    assert not {("a", 1), ("a", 3), ("a", 5), ("b", 0)} & set(taken)


def test_unknown_policy_is_an_error_listing_the_known_ones() -> None:
    snap = snapshot([nvswitch_node("a")])
    with pytest.raises(UnknownPolicyError, match="gputopo"):
        place(snap, request_from_mapping({"groups": [{"name": "g"}]}), policy="magic")


def test_invalid_requests_are_rejected_before_placing() -> None:
    from gputopo.request import Group, PlacementRequest

    with pytest.raises(RequestError, match="gpus_per_pod"):
        place(
            snapshot([nvswitch_node("a")]),
            PlacementRequest(groups=(Group(name="g", gpus_per_pod=0),)),
        )
