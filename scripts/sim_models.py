#!/usr/bin/env python3
"""Where the simulator's job-time model and gputopo's cost model disagree, placement by placement.

    .venv/bin/python scripts/sim_models.py

Prints a Markdown table (the README's): for canonical placements of one all-reduce group, the
bus bandwidth gputopo's cost model predicts (`gputopo.placement.predict`, what the `gputopo`
policy chooses by) and the bus bandwidth the simulator's job-time model grades it with
(`gputopo.sim.jobtime`, measured NCCL figures), and their ratio.
"""

from __future__ import annotations

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.placement.predict import predict
from gputopo.placement.result import PodPlacement
from gputopo.request import Group, PlacementRequest
from gputopo.sim.clusters import Cluster, lingjun_cluster, nvl72_cluster
from gputopo.sim.jobtime import JobTimeModel

_LINGJUN = "ip,DSW,PSW,ASW\n" + "".join(f"h{i},G1,P1,S{i // 2}\n" for i in range(4))


def _pcie() -> Cluster:
    return lingjun_cluster("ip,DSW,PSW,ASW\np,G1,P1,S1\n", profile="pcie-h100-nvlbridge-8x")


def _row(
    label: str, cluster: Cluster, placed: list[tuple[int, tuple[int, ...]]]
) -> tuple[str, float, float]:
    names = [n.name for n in cluster.nodes]
    snap = ClusterSnapshot(NodeState(n, frozenset(range(n.gpu_count))) for n in cluster.nodes)
    pods = []
    rank = 0
    for i, (node, gpus) in enumerate(placed):
        pods.append(PodPlacement("g", 0, i, rank, names[node], gpus))
        rank += len(gpus)
    per = {len(g) for _, g in placed}
    group = Group("g", pods=len(placed), gpus_per_pod=per.pop() if len(per) == 1 else 1)
    cost = predict(snap, PlacementRequest(groups=(group,)), pods).groups[0].bus_gbps
    model = JobTimeModel({n.name: n for n in cluster.nodes})
    by_node: dict[str, list[int]] = {}
    for node, gpus in placed:
        by_node.setdefault(names[node], []).extend(gpus)
    return label, cost, model.bus_gbps(by_node)


def main() -> None:
    """Print the table."""
    h100 = lingjun_cluster(_LINGJUN)
    pcie = _pcie()
    racks = nvl72_cluster(2)
    rows = [
        _row("8 GPUs, one DGX H100 (NVSwitch)", h100, [(0, tuple(range(8)))]),
        _row("2 GPUs, one DGX H100", h100, [(0, (0, 1))]),
        _row(
            "16 GPUs, 2 whole DGX H100, one leaf",
            h100,
            [(0, tuple(range(8))), (1, tuple(range(8)))],
        ),
        _row(
            "16 GPUs, 2 whole DGX H100, two leaves",
            h100,
            [(0, tuple(range(8))), (2, tuple(range(8)))],
        ),
        _row("16 GPUs, 4 per node on 4 DGX H100", h100, [(n, (0, 1, 2, 3)) for n in range(4)]),
        _row("4 GPUs, 1 per node on 4 DGX H100", h100, [(n, (0,)) for n in range(4)]),
        _row("2 GPUs, NVLink-bridged pair (PCIe H100)", pcie, [(0, (0, 1))]),
        _row("2 GPUs, same socket, no bridge (PCIe H100)", pcie, [(0, (0, 2))]),
        _row("2 GPUs, across sockets (PCIe H100)", pcie, [(0, (0, 4))]),
        _row("8 GPUs, whole PCIe H100 server", pcie, [(0, tuple(range(8)))]),
        _row("72 GPUs, one GB200 NVL72 rack", racks, [(n, (0, 1, 2, 3)) for n in range(18)]),
        _row("8 GPUs, 2 trays of one NVL72 rack", racks, [(0, (0, 1, 2, 3)), (1, (0, 1, 2, 3))]),
        _row(
            "8 GPUs, 2 trays in 2 NVL72 racks",
            racks,
            [(0, (0, 1, 2, 3)), (18, (0, 1, 2, 3))],
        ),
    ]
    print(
        "| placement (one all-reduce group) | cost model busbw GB/s | job-time model GB/s "
        "| cost / job-time |"
    )
    print("|---|---:|---:|---:|")
    for label, cost, model in rows:
        print(f"| {label} | {cost:.0f} | {model:.0f} | {cost / model:.2f} |")


if __name__ == "__main__":
    main()
