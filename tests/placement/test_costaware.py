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


# --- what the cost-aware policy gets right that count-only placement does not -------------------


def _machine(profile: str, name: str, **fabric: Any) -> Any:
    from dataclasses import replace

    from gputopo.machines import load_machine
    from gputopo.topology import FabricPosition

    return replace(load_machine(profile, node_name=name), fabric=FabricPosition(**fabric))


def test_prefill_and_decode_share_a_root_complex_pairwise_not_all_prefill_on_one() -> None:
    # dynamo#10171: lowest-index-first put both prefill pods under PCI root 0 and the KV path
    # crossed the CPU. Here each prefill TP-2 sits under the same root complex as its decode.
    snap = snapshot([_machine("pcie-h100-nvlbridge-8x", "p1")])
    data = {
        "groups": [
            {"name": "prefill", "replicas": 2, "gpus_per_pod": 2},
            {"name": "decode", "replicas": 2, "gpus_per_pod": 2},
        ],
        "edges": [{"from": "prefill", "to": "decode", "min_gbps": 80, "pairing": "one_to_one"}],
    }
    ours = decide(snap, data)
    assert ours.placed
    numa = snap.node("p1").topology.gpus
    for r in range(2):
        pair = [p for p in ours.pods if p.replica == r]
        assert len({numa[g].numa_node for p in pair for g in p.gpus}) == 1
    prefill_numa = {numa[p.gpus[0]].numa_node for p in ours.pods if p.group == "prefill"}
    assert len(prefill_numa) == 2  # the two prefills on different root complexes
    for baseline in ("default", "first-fit", "kueue-bestfit"):
        theirs = decide(snap, data, baseline)
        assert theirs.prediction is not None
        assert not theirs.prediction.edges[0].satisfied, baseline


def test_a_gang_pod_takes_gpus_on_distinct_nics_on_its_numa_node() -> None:
    # p4d: GPU pairs share a NIC (0,1 -> NIC0; 2,3 -> NIC1). With 3 GPUs free per node the gang
    # must leave the node; its two GPUs per node should not queue on one NIC.
    nodes = [_machine("p4d-a100", f"p{i}", tiers=("l", "s")) for i in range(2)]
    snap = snapshot(nodes, used={"p0": range(3, 8), "p1": range(3, 8)})
    result = decide(snap, {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 2}]})
    assert result.placed
    assert len({p.node for p in result.pods}) == 2
    topo = nodes[0]
    for pod in result.pods:
        assert len({topo.nearest_nics(g)[0] for g in pod.gpus}) == 2, pod
        assert len({topo.gpus[g].numa_node for g in pod.gpus}) == 1
    baseline = decide(snap, {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 2}]}, "first-fit")
    assert baseline.prediction is not None
    assert result.prediction is not None
    assert result.prediction.communication_seconds < baseline.prediction.communication_seconds


def test_ranks_follow_nvlink_on_a_hybrid_cube_mesh() -> None:
    # DGX-1: not every GPU pair has NVLink. A TP-4 in rank order must hop over NVLink only.
    snap = snapshot([_machine("dgx1-v100", "v")])
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 4, "pattern": "pipeline"}]})
    gpus = result.pods[0].gpus
    topo = snap.node("v").topology
    hops = [topo.gpu_link(a, b) for a, b in zip(gpus, gpus[1:] + gpus[:1], strict=True)]
    assert all(h is not None and h.kind.name == "NVLINK" for h in hops), gpus


def test_small_jobs_keep_the_whole_nvl72_rack_free_for_the_next_big_one() -> None:
    rack_a = [
        nvswitch_node(f"a{i}", gpus=4, nics=4, generation=5, tiers=("l", "s"), domain="rack-a")
        for i in range(4)
    ]
    rack_b = [
        nvswitch_node(f"b{i}", gpus=4, nics=4, generation=5, tiers=("l", "s"), domain="rack-b")
        for i in range(4)
    ]
    snap = snapshot(rack_a + rack_b, used={"a0": [0, 1], "a1": [0, 1, 2, 3]})
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 4}]})
    assert result.pods[0].node.startswith("a")  # rack b stays whole
    pair = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 2}]})
    assert pair.pods[0].node == "a0"  # and a broken tray is filled before a whole one


def test_a_degraded_nvlink_node_loses_to_a_healthy_one() -> None:
    from dataclasses import replace

    from gputopo.links import LinkHealth

    sick = nvswitch_node("sick")
    links = tuple(
        replace(lk, health=LinkHealth.DEGRADED, nominal_gbps=lk.nominal_gbps / 3)
        if lk.kind.name == "NVLINK" and 0 in (lk.a.index, lk.b.index)
        else lk
        for lk in sick.links
    )
    snap = snapshot([replace(sick, links=links), nvswitch_node("well")])
    result = decide(snap, {"groups": [{"name": "tp", "gpus_per_pod": 8}]})
    assert result.pods[0].node == "well"


def test_a_multi_node_gang_takes_whole_nodes_and_the_same_gpus_on_each() -> None:
    nodes = [nvswitch_node(f"n{i}", tiers=("l", "s")) for i in range(4)]
    snap = snapshot(nodes, used={"n0": [0], "n1": [0, 1, 2, 3]})
    whole = decide(snap, {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 8}]})
    assert sorted(p.node for p in whole.pods) == ["n2", "n3"]
    # Only n0 (4 free) and n1 (6 free) have room: one pod each, on the same GPU indices, so
    # local rank k talks to local rank k over the same NIC rail on both nodes.
    snap = snapshot(nodes, used={"n0": [4, 5, 6, 7], "n1": [6, 7], "n2": range(8), "n3": range(8)})
    halves = decide(snap, {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 4}]})
    assert sorted(p.node for p in halves.pods) == ["n0", "n1"]
    assert len({p.gpus for p in halves.pods}) == 1, halves.pods


def test_a_refusal_explains_every_domain_it_tried() -> None:
    nodes = [nvswitch_node(f"a{i}", tiers=("la", "s")) for i in range(2)]
    nodes += [nvswitch_node(f"b{i}", tiers=("lb", "s")) for i in range(4)]
    snap = snapshot(nodes, used={"b0": [0], "b1": [0], "b2": [0], "b3": [0]})
    result = decide(
        snap,
        {"scope": {"required": "leaf"}, "groups": [{"name": "g", "pods": 3, "gpus_per_pod": 8}]},
    )
    assert not result.placed
    codes = {r.domain: r.code for r in result.rejections}
    assert codes["tier-0/s/la"] == "insufficient_gpus"
    assert codes["tier-0/s/lb"] == "fragmented"  # 28 free, but no node has 8
    assert "tier-0/s/lb" in result.reason or "fragmented" in result.reason


def test_a_rack_straddling_two_leaves_still_gives_nvlink_within_the_required_leaf() -> None:
    # Trays of one NVL72 rack hang off two leaves. A gang that must stay in one leaf cannot use
    # the whole rack, but the rack's trays inside one leaf still talk over NVLink.
    trays = [
        nvswitch_node(f"t{i}", gpus=4, nics=4, generation=5, tiers=(leaf, "s"), domain="rack")
        for i, leaf in enumerate(["la", "lb", "lb"])
    ]
    snap = snapshot([nvswitch_node("h", tiers=("la", "s")), *trays])
    result = decide(
        snap,
        {"scope": {"required": "leaf"}, "groups": [{"name": "g", "pods": 2, "gpus_per_pod": 4}]},
    )
    assert sorted(p.node for p in result.pods) == ["t1", "t2"]
    assert result.prediction is not None
    assert result.prediction.groups[0].bottleneck == "NVLink"


TWO_DGX = [nvswitch_node("a", tiers=("leaf", "spine")), nvswitch_node("b", tiers=("leaf", "spine"))]


@pytest.mark.parametrize(
    ("request_data", "stale", "labels", "want_code", "want_message"),
    [
        pytest.param(
            {"node_selector": {"gpu": "b200"}, "groups": [{"name": "tp", "gpus_per_pod": 8}]},
            [],
            {"a": {"gpu": "h100"}},
            "selector",
            "no node matches the selectors of group tp (gpu=b200)",
            id="a selector no node matches is a selector miss, not a lack of GPUs",
        ),
        pytest.param(
            {
                "groups": [
                    {"name": "tp", "gpus_per_pod": 8},
                    {"name": "pp", "gpus_per_pod": 8, "node_selector": {"gpu": "b200"}},
                ]
            },
            [],
            {"a": {"gpu": "h100"}},
            "selector",
            "no node matches the selectors of group pp (gpu=b200)",
            id="a group's own selector is named with its group",
        ),
        pytest.param(
            {"groups": [{"name": "tp", "gpus_per_pod": 8}]},
            ["a", "b"],
            {},
            "unhealthy",
            "none of the 2 node(s) group tp may use is placeable (stale)",
            id="every node stale is a health problem, not 0 free GPUs",
        ),
        pytest.param(
            {"node_selector": {"gpu": "h100"}, "groups": [{"name": "tp", "gpus_per_pod": 8}]},
            ["a"],
            {"a": {"gpu": "h100"}},
            "unhealthy",
            "none of the 1 node(s) group tp may use is placeable (stale)",
            id="the only selected node stale is a health problem",
        ),
    ],
)
def test_a_request_no_node_can_take_names_the_real_reason(
    request_data: dict[str, Any],
    stale: list[str],
    labels: dict[str, dict[str, str]],
    want_code: str,
    want_message: str,
) -> None:
    snap = snapshot(TWO_DGX, stale=stale, labels=labels)
    result, _ = place(snap, request_from_mapping(request_data))
    assert not result.placed
    assert result.reason == want_message
    assert [(r.domain, r.code.value, r.message) for r in result.rejections] == [
        ("placement", want_code, want_message)
    ]


def test_a_selected_node_that_is_placeable_is_still_judged_on_capacity() -> None:
    snap = snapshot(TWO_DGX, used={"a": range(4)}, labels={"a": {"gpu": "h100"}})
    req = {"node_selector": {"gpu": "h100"}, "groups": [{"name": "tp", "gpus_per_pod": 8}]}
    result, _ = place(snap, request_from_mapping(req))
    assert not result.placed
    assert {r.code.value for r in result.rejections} == {"insufficient_gpus"}
