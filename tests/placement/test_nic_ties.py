"""Among GPU sets the cost model prices the same, a gang that leaves its nodes takes the one on
more NICs (issue 26): the model prices a node's network by its slowest GPU's NIC share, so four
GPUs on two shared NICs tie with four on three NICs, while NCCL spreads the inter-node rings
over every NIC the GPUs reach."""

from __future__ import annotations

from gputopo.placement import place
from gputopo.request import request_from_mapping
from tests.builders import nvswitch_node, snapshot

# One NIC per GPU pair (GPUs 0-1 on mlx5_0, 2-3 on mlx5_1, ...), one NUMA node.
NODES = [
    nvswitch_node(f"n{i}", nics=4, numa_nodes=1, tiers=("leaf-0", "spine-0", "core"))
    for i in range(2)
]


def _nics(gpus: tuple[int, ...]) -> set[int]:
    return {g // 2 for g in gpus}


def test_a_gang_across_two_nodes_spreads_its_gpus_over_three_nics_not_two() -> None:
    # GPUs 6 and 7 busy on both nodes: 6 free, so a 2 x 4-GPU gang needs both nodes, and four
    # of GPUs 0-5 reach at most three NICs. Lowest indices (0-3) would pack them on two.
    snap = snapshot(NODES, used={"n0": [6, 7], "n1": [6, 7]})
    request = request_from_mapping(
        {"job": "g", "groups": [{"name": "w", "pods": 2, "gpus_per_pod": 4}]}
    )
    result, _ = place(snap, request, policy="gputopo")
    assert result.placed
    assert sorted(p.node for p in result.pods) == ["n0", "n1"]
    for pod in result.pods:
        assert len(_nics(pod.gpus)) == 3, pod


def test_a_gang_on_one_node_keeps_its_lowest_gpus() -> None:
    # Nothing leaves the node: NICs do not matter and the usual order stands.
    snap = snapshot(NODES, used={"n0": [6, 7], "n1": [6, 7]})
    request = request_from_mapping(
        {"job": "g", "groups": [{"name": "w", "pods": 1, "gpus_per_pod": 4}]}
    )
    result, _ = place(snap, request, policy="gputopo")
    assert result.placed
    assert result.pods[0].gpus == (0, 1, 2, 3)
