"""Uneven gangs in the cost model: every node pays for its own share of the collective.

The cases repeat the worked example of `gputopo.cost`'s docstring: a 12-GPU gang, 8 GPUs on
node A and 4 on node B, rings of 360 GB/s, 50 GB/s of NIC per GPU, S = 1 GB, no latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from gputopo import cost
from gputopo.links import LinkKind
from gputopo.placement.intranode import NodeChoice
from gputopo.placement.predict import collective, node_floor_seconds
from gputopo.request import Group, Pattern

GB = 10**9
A = cost.NodeLoad(gpus=8, intra_gbps=360, net_gbps_per_gpu=50)
B = cost.NodeLoad(gpus=4, intra_gbps=360, net_gbps_per_gpu=50)


@dataclass(frozen=True)
class UnevenCase:
    id: str
    pattern: str
    loads: tuple[cost.NodeLoad, ...]
    want_ms: float


UNEVEN_CASES = [
    UnevenCase(
        "8 + 4 all-reduce: A's ring 4.861 ms, then B pushes 1/4 GB per GPU at 50 GB/s: 5.0 ms",
        "all_reduce",
        (A, B),
        2 * 7 / 8 / 360 * 1e3 + 5.0,
    ),
    UnevenCase(
        "8 + 8 all-reduce is the uniform formula: 4.861 + 2.5 ms",
        "all_reduce",
        (cost.NodeLoad(8, 360, 50, count=2),),
        2 * 7 / 8 / 360 * 1e3 + 2.5,
    ),
    UnevenCase(
        "8 + 4 all-to-all: each of B's GPUs sends 8/12 GB off the node at 50 GB/s",
        "all_to_all",
        (A, B),
        8 / 12 / 50 * 1e3,
    ),
    UnevenCase(
        "8 + 1 + 1 + 1 + 1 all-reduce: a lone GPU pushes 2 * 4/5 GB through its own share",
        "all_reduce",
        (A, cost.NodeLoad(1, math.inf, 50, count=4)),
        2 * 7 / 8 / 360 * 1e3 + 2 * 4 / 5 / 50 * 1e3,
    ),
]


@pytest.mark.parametrize("case", UNEVEN_CASES, ids=lambda c: c.id)
def test_uneven_gangs_are_priced_node_by_node(case: UnevenCase) -> None:
    if case.pattern == "all_reduce":
        got = cost.uneven_allreduce_seconds(size_bytes=GB, loads=case.loads)
    else:
        got = cost.uneven_alltoall_seconds(size_bytes=GB, loads=case.loads)
    assert got * 1e3 == pytest.approx(case.want_ms, rel=1e-9)


def test_identical_nodes_give_the_uniform_hierarchical_formula() -> None:
    uniform = cost.hierarchical_allreduce_seconds(
        size_bytes=GB,
        gpus_per_node=4,
        nodes=3,
        intra_gbps=200,
        inter_gbps_per_gpu=25,
        intra_latency_us=2,
        inter_latency_us=5,
    )
    uneven = cost.uneven_allreduce_seconds(
        size_bytes=GB,
        loads=[cost.NodeLoad(4, 200, 25, count=3)],
        intra_latency_us=2,
        inter_latency_us=5,
    )
    assert uneven == pytest.approx(uniform, rel=1e-12)


def test_egress_floor_is_the_slowest_nodes_egress() -> None:
    # B's egress is 4 x 50 = 200 GB/s: 2 * 1/2 * 1 GB / 200 GB/s = 5 ms; A's 400 GB/s: 2.5 ms.
    assert cost.egress_floor_seconds(size_bytes=GB, egress_gbps=[400, 200]) == pytest.approx(5e-3)
    assert cost.egress_floor_seconds(size_bytes=GB, egress_gbps=[400]) == 0.0
    assert math.isinf(cost.egress_floor_seconds(size_bytes=GB, egress_gbps=[400, 0]))


def _choice(gpus: int, ring: float, shares: list[float]) -> NodeChoice:
    return NodeChoice(
        tuple(range(gpus)),
        ring if gpus > 1 else math.inf,
        LinkKind.NVLINK,
        tuple(shares),
        tuple(f"nic{i}" for i in range(gpus)),
        0.0,
    )


@st.composite
def uneven_replicas(draw: st.DrawFn) -> tuple[list[NodeChoice], int]:
    nodes = []
    for _ in range(draw(st.integers(2, 6))):
        gpus = draw(st.integers(1, 8))
        ring = draw(st.sampled_from([20.0, 50.0, 150.0, 360.0]))
        shares = draw(
            st.lists(st.sampled_from([3.125, 6.25, 12.5, 25.0, 50.0]), min_size=gpus, max_size=gpus)
        )
        nodes.append(_choice(gpus, ring, shares))
    size = draw(st.sampled_from([10**6, 10**8, 2 * 10**9]))
    return nodes, size


@given(replica=uneven_replicas())
@settings(max_examples=300, deadline=None)
def test_a_multi_node_allreduce_is_never_predicted_below_any_nodes_egress_floor(
    replica: tuple[list[NodeChoice], int],
) -> None:
    nodes, size = replica
    group = Group(
        "g",
        pods=sum(len(c.gpus) for c in nodes),
        gpus_per_pod=1,
        pattern=Pattern.ALL_REDUCE,
        message_bytes=size,
    )
    _, seconds, _ = collective(group, [(c, 1) for c in nodes], nodes=len(nodes), nvlink=False)
    egress = [sum(c.nic_gbps) for c in nodes]
    floor = cost.egress_floor_seconds(size_bytes=size, egress_gbps=egress)
    note(f"egress {egress}: floor {floor}, predicted {seconds}")
    assert seconds >= floor * (1 - 1e-12)
    # and the engine's pruning floor of every node is below the whole prediction
    n = sum(len(c.gpus) for c in nodes)
    for c in nodes:
        own = node_floor_seconds(group, c, ranks=n, nodes=len(nodes), nvlink=False)
        assert own <= seconds * (1 + 1e-12)


@given(replica=uneven_replicas(), pattern=st.sampled_from(list(Pattern)))
@settings(max_examples=200, deadline=None)
def test_no_node_of_any_pattern_finishes_after_the_prediction(
    replica: tuple[list[NodeChoice], int], pattern: Pattern
) -> None:
    nodes, size = replica
    n = sum(len(c.gpus) for c in nodes)
    group = Group("g", pods=n, gpus_per_pod=1, pattern=pattern, message_bytes=size)
    _, seconds, _ = collective(group, [(c, 1) for c in nodes], nodes=len(nodes), nvlink=False)
    for c in nodes:
        own = node_floor_seconds(group, c, ranks=n, nodes=len(nodes), nvlink=False)
        assert own <= seconds * (1 + 1e-12)


def test_a_pipeline_across_uneven_nodes_waits_for_the_slowest_nics_share() -> None:
    # 8 GPUs at 50 GB/s each and a lone GPU behind a 12.5 GB/s share: 1 GB crosses at 12.5 GB/s
    group = Group("pp", pods=9, gpus_per_pod=1, pattern=Pattern.PIPELINE, message_bytes=GB)
    big = _choice(8, 360.0, [50.0] * 8)
    lone = _choice(1, 360.0, [12.5])
    bus, seconds, _ = collective(group, [(big, 1), (lone, 1)], nodes=2, nvlink=False)
    assert bus == 12.5
    assert seconds == pytest.approx(1 / 12.5 + 0.0, abs=1e-4)  # plus one NIC hop's latency
