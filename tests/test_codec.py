"""Codecs: domain values survive the wire, and invalid messages name the field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputopo.codec import (
    CodecError,
    delta_from_proto,
    delta_to_proto,
    request_from_proto,
    request_to_proto,
    result_from_proto,
    result_to_proto,
    topology_from_proto,
    topology_to_proto,
)
from gputopo.codec.report import peer_probe_from_proto
from gputopo.delta import diff_topology
from gputopo.links import LinkHealth
from gputopo.placement import place
from gputopo.request import request_from_mapping
from gputopo.topology import FabricState, GpuFabric, Measurement
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import topology_pb2 as tpb
from tests.builders import nvswitch_node, pcie_node, snapshot


def test_topology_round_trip() -> None:
    topo = nvswitch_node("n", gpus=4, nics=2, tiers=("leaf", "spine"), domain="nvl-1")
    fabric = GpuFabric("9277d399-0674-44a9-b64e-d85bb19ce2b0", 7, FabricState.COMPLETED)
    topo = replace(
        topo,
        gpus=(replace(topo.gpus[0], fabric=fabric), *topo.gpus[1:]),
        links=(
            replace(
                topo.links[0],
                measured=Measurement(401.5, "cuda", 1 << 28, 0.1, 12.0, latency_us=2.5),
                health=LinkHealth.DEGRADED,
                health_reason="lane 3 down",
            ),
            *topo.links[1:],
        ),
        problems=("nothing",),
    )
    assert topology_from_proto(topology_to_proto(topo)) == topo


def test_pcie_topology_round_trip() -> None:
    topo = pcie_node("p", bridged_pairs=[(0, 1)])
    assert topology_from_proto(topology_to_proto(topo)) == topo


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(lambda m: m.ClearField("name"), "topology.name", id="a nameless node"),
        pytest.param(
            lambda m: setattr(m.gpus[1], "index", 5),
            "topology.gpus[1].index",
            id="GPUs out of order",
        ),
        pytest.param(
            lambda m: setattr(m.links[0].b, "index", 99),
            "topology.links[0].b",
            id="a link to a GPU that does not exist",
        ),
        pytest.param(
            lambda m: setattr(m.links[0], "kind", 0),
            "topology.links[0].kind",
            id="a link without a kind",
        ),
        pytest.param(
            lambda m: setattr(m.links[0], "nominal_gbps", float("nan")),
            "topology.links[0].nominal_gbps",
            id="a NaN bandwidth",
        ),
        pytest.param(
            lambda m: m.links[0].b.CopyFrom(m.links[0].a),
            "topology.links[0]",
            id="a link from a device to itself",
        ),
        pytest.param(
            lambda m: setattr(m, "machine", "x" * 2000),
            "topology.machine",
            id="a 2,000-character machine name",
        ),
        pytest.param(
            lambda m: setattr(m, "profile", "x" * 2000),
            "topology.profile",
            id="a 2,000-character profile",
        ),
        pytest.param(
            lambda m: m.problems.extend(["fine", "x" * 2000]),
            "topology.problems[1]",
            id="a 2,000-character problem",
        ),
        pytest.param(
            lambda m: setattr(m.nvml, "reason", "x" * 2000),
            "topology.nvml.reason",
            id="a 2,000-character NVML reason",
        ),
    ],
)
def test_invalid_topologies_name_the_field(mutate: object, field: str) -> None:
    msg = topology_to_proto(nvswitch_node("n", gpus=2, nics=1))
    assert callable(mutate)
    mutate(msg)
    with pytest.raises(CodecError) as info:
        topology_from_proto(msg)
    assert info.value.field == field


def test_delta_round_trip() -> None:
    old = nvswitch_node("n", gpus=4, nics=2)
    new = replace(
        old, links=(*old.links[1:], replace(old.links[0], health=LinkHealth.DOWN)), problems=("x",)
    )
    delta = diff_topology(old, new)
    assert delta is not None
    assert delta_from_proto(delta_to_proto(delta)) == delta


def test_request_round_trip() -> None:
    req = request_from_mapping(
        {
            "job": "j",
            "scope": {"required": "spine", "preferred": "leaf"},
            "groups": [
                {
                    "name": "p",
                    "replicas": 2,
                    "gpus_per_pod": 4,
                    "pattern": "pipeline",
                    "spread": {"across": "node"},
                    "node_selector": {"a": "b"},
                },
                {"name": "d", "replicas": 2, "gpus_per_pod": 4},
            ],
            "edges": [{"from": "p", "to": "d", "min_gbps": 300, "pairing": "one_to_one"}],
        }
    )
    assert request_from_proto(request_to_proto(req)) == req


def test_result_round_trip() -> None:
    snap = snapshot([nvswitch_node("a", tiers=("l",)), nvswitch_node("b", tiers=("l",))])
    req = request_from_mapping({"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 8}]})
    result, _ = place(snap, req)
    back = result_from_proto(result_to_proto(result))
    assert back.pods == result.pods
    assert back.prediction is not None
    assert result.prediction is not None
    assert back.prediction.groups[0].bus_gbps == pytest.approx(result.prediction.groups[0].bus_gbps)


def test_unknown_enum_values_are_rejected() -> None:
    msg = topology_to_proto(nvswitch_node("n", gpus=2, nics=1))
    msg.links[0].a.kind = 9
    with pytest.raises(CodecError, match="device kind"):
        topology_from_proto(msg)
    assert tpb.DEVICE_KIND_GPU == 1


def test_over_long_report_strings_are_refused_by_name() -> None:
    """A delta's problems and a probe's peer name are stored too, so they are bounded alike."""
    delta = rpb.Delta(problems=["x" * 2000], problems_changed=True)
    with pytest.raises(CodecError) as info:
        delta_from_proto(delta)
    assert info.value.field == "delta.problems[0]"
    with pytest.raises(CodecError) as info:
        peer_probe_from_proto(rpb.PeerProbe(peer="n" * 2000))
    assert info.value.field == "peer_probe.peer"
    # A name at the limit is still a name.
    assert peer_probe_from_proto(rpb.PeerProbe(peer="n" * 253))[0] == "n" * 253
