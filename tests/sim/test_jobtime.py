"""The simulator's job-time model: every figure cited, and placements turned into bandwidth and
time as the module docstring says."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest

from gputopo.placement.result import PodPlacement
from gputopo.request import Edge, Group, PlacementRequest
from gputopo.sim.clusters import lingjun_cluster, nvl72_cluster
from gputopo.sim.jobtime import BANDWIDTH, COMM_SHARE, TP_SHARE, JobTimeModel
from gputopo.sim.traces import JobClass, SimJob
from tests.builders import nvswitch_node, pcie_node

# owner/repo#number: a public thread anyone can open and read the measurement in.
_CITATION = re.compile(r"\b[\w.-]+/[\w.-]+#\d+\b")


@pytest.mark.parametrize("key", sorted(BANDWIDTH))
def test_every_figure_cites_where_it_was_measured(key: str) -> None:
    figure = BANDWIDTH[key]
    assert figure.gbps > 0
    assert figure.what.strip()
    assert _CITATION.search(figure.source), f"{key}: {figure.source!r} names no owner/repo#N"


def test_every_job_class_has_a_communication_share() -> None:
    assert set(COMM_SHARE) == set(JobClass)
    assert all(0 <= s <= 1 for s in COMM_SHARE.values())


def _h100_pair_model() -> JobTimeModel:
    nodes = [
        nvswitch_node("a", tiers=("leaf-1", "spine")),
        nvswitch_node("b", tiers=("leaf-1", "spine")),
        nvswitch_node("c", tiers=("leaf-2", "spine")),
        nvswitch_node("d", tiers=("leaf-2", "spine")),
        pcie_node("p", gpus=8, tiers=("leaf-3", "spine")),
    ]
    return JobTimeModel({n.name: n for n in nodes})


@dataclass(frozen=True)
class BusCase:
    placed: dict[str, list[int]]
    want_gbps: float


BUS_CASES = [
    pytest.param(BusCase({"a": list(range(8))}, 370.0), id="8 GPUs on one NVSwitch node: ring"),
    pytest.param(BusCase({"a": [0, 1]}, 370.0), id="2 GPUs on NVSwitch get the same figure"),
    pytest.param(
        BusCase({"a": list(range(8)), "b": list(range(8))}, 320.0),
        id="2 whole nodes: 8 NDR rails x 40",
    ),
    pytest.param(
        BusCase({n: [0, 1, 2, 3] for n in "abcd"}, 160.0),
        id="16 GPUs spread 4 per node: only 4 rails each",
    ),
    pytest.param(BusCase({n: [0] for n in "abcd"}, 40.0), id="one GPU per node: one rail"),
    pytest.param(BusCase({"p": [0, 1]}, 36.0), id="PCIe pair behind one switch"),
    pytest.param(BusCase({"p": [0, 4]}, 28.0), id="PCIe pair across sockets"),
]


@pytest.mark.parametrize("case", BUS_CASES)
def test_bus_bandwidth_of_a_placement(case: BusCase) -> None:
    assert _h100_pair_model().bus_gbps(case.placed) == pytest.approx(case.want_gbps)


def test_spine_oversubscription_applies_only_when_leaves_are_crossed() -> None:
    nodes = _h100_pair_model().nodes
    model = JobTimeModel(nodes, spine_oversubscription=2.0)
    same_leaf = {"a": list(range(8)), "b": list(range(8))}
    across = {"a": list(range(8)), "c": list(range(8))}
    assert model.bus_gbps(same_leaf) == pytest.approx(320.0)
    assert model.bus_gbps(across) == pytest.approx(160.0)


def test_nvl72_rack_is_one_nvlink_domain_and_racks_meet_over_ib() -> None:
    cluster = nvl72_cluster(2)
    model = JobTimeModel({n.name: n for n in cluster.nodes})
    rack0 = [n.name for n in cluster.nodes if n.fabric.accelerator_domain == "nvl72-0000"]
    rack1 = [n.name for n in cluster.nodes if n.fabric.accelerator_domain == "nvl72-0001"]
    assert model.bus_gbps({n: [0, 1, 2, 3] for n in rack0}) == pytest.approx(835.0)
    # Two trays in different racks: 4 GPUs each over IB at 49 per GPU of a partition.
    assert model.bus_gbps({rack0[0]: [0, 1, 2, 3], rack1[0]: [0, 1, 2, 3]}) == pytest.approx(
        4 * 49.0
    )
    assert model.ideal_gbps(72) == pytest.approx(835.0)
    assert model.ideal_gbps(144) == pytest.approx(394.0)  # never above the network cap


def _train(name: str, pods: int, per_pod: int, tp: int, duration: float = 1000.0) -> SimJob:
    group = Group("train", pods=pods, gpus_per_pod=per_pod)
    return SimJob(name, 0.0, duration, JobClass.TRAIN, PlacementRequest(groups=(group,)), tp=tp)


def _pods(spec: list[tuple[str, tuple[int, ...]]], group: str = "train") -> list[PodPlacement]:
    out, rank = [], 0
    for i, (node, gpus) in enumerate(spec):
        out.append(PodPlacement(group, 0, i, rank, node, gpus))
        rank += len(gpus)
    return out


def test_tp_group_kept_in_a_node_runs_at_ideal_time() -> None:
    model = _h100_pair_model()
    job = _train("j", pods=8, per_pod=1, tp=8)
    timing = model.evaluate(job, _pods([("a", (g,)) for g in range(8)]))
    assert timing.slowdown == pytest.approx(1.0)
    assert timing.seconds == pytest.approx(1000.0)
    assert (timing.tp_groups, timing.tp_groups_across_nodes) == (1, 0)


def test_tp_group_cut_across_nodes_is_slower_by_the_table() -> None:
    model = _h100_pair_model()
    job = _train("j", pods=8, per_pod=1, tp=8)
    split = [("a", (g,)) for g in range(4)] + [("b", (g,)) for g in range(4)]
    timing = model.evaluate(job, _pods(split))
    ratio = 370.0 / 160.0  # NVSwitch ring against 4 rails on each side
    share = COMM_SHARE[JobClass.TRAIN]
    assert timing.slowdown == pytest.approx(ratio)
    assert timing.seconds == pytest.approx(1000.0 * ((1 - share) + share * ratio))
    assert (timing.tp_groups, timing.tp_groups_across_nodes) == (1, 1)


def test_dp_share_and_tp_share_weigh_a_gang_of_several_tp_groups() -> None:
    model = _h100_pair_model()
    job = _train("j", pods=4, per_pod=4, tp=8)  # 16 GPUs, two TP-8 groups
    # Each TP group split over two nodes (4 + 4), the gang over four nodes.
    spec = [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3)), ("c", (0, 1, 2, 3)), ("d", (0, 1, 2, 3))]
    timing = model.evaluate(job, _pods(spec))
    tp_ratio = 370.0 / 160.0
    dp_ratio = 320.0 / 160.0  # ideal 16 GPUs: 2 whole nodes
    assert timing.slowdown == pytest.approx(TP_SHARE * tp_ratio + (1 - TP_SHARE) * dp_ratio)
    assert timing.tp_groups_across_nodes == 2


def test_comm_share_is_a_parameter() -> None:
    nodes = _h100_pair_model().nodes
    job = _train("j", pods=8, per_pod=1, tp=8)
    split = _pods([("a", (g,)) for g in range(4)] + [("b", (g,)) for g in range(4)])
    none = JobTimeModel(nodes, comm_share={JobClass.TRAIN: 0.0}).evaluate(job, split)
    all_comm = JobTimeModel(nodes, comm_share={JobClass.TRAIN: 1.0}).evaluate(job, split)
    assert none.seconds == pytest.approx(1000.0)
    assert all_comm.seconds == pytest.approx(1000.0 * 370.0 / 160.0)
    with pytest.raises(ValueError, match="comm share"):
        JobTimeModel(nodes, comm_share={JobClass.TRAIN: 1.5})


def _serve_job() -> SimJob:
    request = PlacementRequest(
        groups=(Group("prefill", gpus_per_pod=2), Group("decode", gpus_per_pod=4)),
        edges=(Edge("prefill", "decode", transfer_bytes=1, max_transfer_seconds=1.0),),
    )
    return SimJob("s", 0.0, 100.0, JobClass.SERVE, request)


@pytest.mark.parametrize(
    ("prefill", "decode", "want"),
    [
        pytest.param(("a", (0, 1)), ("a", (2, 3, 4, 5)), (0, 0, 0), id="same NVSwitch node"),
        pytest.param(("p", (0, 1)), ("p", (4, 5, 6, 7)), (1, 0, 0), id="across a PCI root"),
        pytest.param(("a", (0, 1)), ("b", (0, 1, 2, 3)), (0, 1, 0), id="across nodes"),
        pytest.param(("a", (0, 1)), ("c", (0, 1, 2, 3)), (0, 1, 1), id="across leaves"),
    ],
)
def test_kv_path_crossings(
    prefill: tuple[str, tuple[int, ...]],
    decode: tuple[str, tuple[int, ...]],
    want: tuple[int, int, int],
) -> None:
    pods = [
        PodPlacement("prefill", 0, 0, 0, prefill[0], prefill[1]),
        PodPlacement("decode", 0, 0, 0, decode[0], decode[1]),
    ]
    timing = _h100_pair_model().evaluate(_serve_job(), pods)
    got = (timing.kv_across_pci_root, timing.kv_across_node, timing.kv_across_leaf)
    assert timing.kv_pairs == 1
    assert got == want
    assert (timing.slowdown > 1.0) == any(want)


def test_ideal_uses_the_best_machine_of_the_cluster() -> None:
    cluster = lingjun_cluster("ip,DSW,PSW,ASW\nx,G1,P1,S1\ny,G1,P1,S1\n")
    model = JobTimeModel({n.name: n for n in cluster.nodes})
    assert model.ideal_gbps(8) == pytest.approx(370.0)
    assert model.ideal_gbps(16) == pytest.approx(320.0)
    assert math.isinf(model.ideal_gbps(1))


def test_gpus_that_can_ring_over_nvlink_get_nvlink_though_a_pair_has_none() -> None:
    # DGX-1 hybrid cube mesh: 0-1-5-4-0 is an NVLink ring, while 0-5 and 1-4 meet only over SYS.
    cluster = lingjun_cluster("ip,DSW,PSW,ASW\nx,G1,P1,S1\n", profile="dgx1-v100")
    node = cluster.nodes[0]
    model = JobTimeModel({node.name: node})
    assert model.bus_gbps({node.name: [0, 5]}) == pytest.approx(28.0)
    assert model.bus_gbps({node.name: [0, 1, 4, 5]}) == pytest.approx(116.0)
    assert model.bus_gbps({node.name: list(range(8))}) == pytest.approx(116.0)
