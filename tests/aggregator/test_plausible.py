"""An absurd bandwidth never attracts a placement (issue 13).

The codec refuses figures beyond any hardware (`gputopo.bounds`); within those bounds a node
can still claim what its links cannot be: PCIe at 5,000 GB/s, or an H100's NVLink at 1,700.
The state cuts every link to the most its kind (and NVLink generation) can carry, so a claim
can at most tie with honest hardware of the same kind, never outbid it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from aggregator.state import ClusterState
from gputopo.links import LinkKind
from gputopo.machines import load_machine
from gputopo.nominal import plausible
from gputopo.placement import place
from gputopo.request import request_from_mapping
from gputopo.topology import Measurement, NodeTopology

PAIR = request_from_mapping(
    {"job": "pair", "groups": [{"name": "g", "pods": 1, "gpus_per_pod": 2}]}
)


def _claiming(topo: NodeTopology, gbps: float) -> NodeTopology:
    """Every link of `topo` claiming `gbps`, nominal and measured."""
    links = tuple(
        replace(
            lk,
            nominal_gbps=gbps,
            measured=Measurement(gbps, "cuda-memcpy", measured_at=1000.0),
        )
        for lk in topo.links
    )
    return replace(topo, links=links)


def test_an_h100s_nvlink_is_cut_to_what_nvlink_4_carries() -> None:
    honest = load_machine("dgx-h100", node_name="h")
    cut = plausible(_claiming(honest, 1700.0))
    nvlinks = [lk for lk in cut.links if lk.kind is LinkKind.NVLINK]
    assert nvlinks
    assert {lk.nominal_gbps for lk in nvlinks} == {450.0}
    assert {lk.measured.gbps for lk in nvlinks if lk.measured} == {450.0}
    pcie = [lk for lk in cut.links if lk.kind.is_pcie]
    assert max(lk.nominal_gbps for lk in pcie) <= 121.1
    assert plausible(honest) is honest  # an honest node is left as it is, object and all


@pytest.mark.parametrize("claim", [5_000.0, 9_999.0])
def test_a_pcie_node_claiming_absurd_bandwidth_draws_no_honest_request(claim: float) -> None:
    state = ClusterState(clock=lambda: 1000.0)
    fake = _claiming(load_machine("workstation-2x-rtx5090", node_name="aaa-fake"), claim)
    state.apply_snapshot(fake, incarnation=1, sequence=1)
    for i in range(3):
        state.apply_snapshot(
            load_machine("dgx-h100", node_name=f"h100-{i}"), incarnation=1, sequence=1
        )
    chosen = []
    for _ in range(3):
        result, _ = place(state.snapshot(), PAIR)
        assert result.placed
        chosen += [p.node for p in result.pods]
        state.reserve(result, ttl_s=60)
    assert "aaa-fake" not in chosen, chosen
