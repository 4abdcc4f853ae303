"""The incremental topology JSON is the protobuf JSON of the whole message, and reuses its bulk."""

from __future__ import annotations

import json

import pytest

from aggregator.dumps import TopologyJson, message_json
from aggregator.service import cluster_message, dump_facts
from aggregator.state import ClusterState
from gputopo.placement import place
from gputopo.request import request_from_mapping
from tests.builders import fabric_cluster


def _state() -> ClusterState:
    state = ClusterState(clock=lambda: 1000.0)
    for topo in fabric_cluster(spines=1, leaves_per_spine=2, nodes_per_leaf=3, gpus=8):
        state.add_static(topo)
    return state


def _encode(encoder: TopologyJson, state: ClusterState, *, links: bool) -> dict[str, object]:
    snapshot = state.snapshot()
    facts, reserved = dump_facts(snapshot, state)
    body = encoder.encode(
        snapshot,
        facts=facts,
        reserved=reserved,
        names=list(snapshot.nodes),
        include_links=links,
        as_of=1000.0,
    )
    return dict(json.loads(body))


@pytest.mark.parametrize("links", [True, False])
def test_the_spliced_json_is_the_messages_json(links: bool) -> None:
    state = _state()
    result, _ = place(
        state.snapshot(),
        request_from_mapping({"job": "j", "groups": [{"name": "g", "pods": 1, "gpus_per_pod": 4}]}),
    )
    state.reserve(result, ttl_s=60)  # some GPUs reserved: the small parts differ per node
    want = message_json(cluster_message(state.snapshot(), state, include_links=links, as_of=1000.0))
    assert _encode(TopologyJson(), state, links=links) == want


def test_a_nodes_topology_is_encoded_once_until_it_changes() -> None:
    state = _state()
    encoder = TopologyJson()
    _encode(encoder, state, links=True)
    assert encoder.encoded == 6
    result, _ = place(
        state.snapshot(),
        request_from_mapping({"job": "j", "groups": [{"name": "g", "pods": 1, "gpus_per_pod": 8}]}),
    )
    state.reserve(result, ttl_s=60)  # free GPUs move; topologies do not
    after = _encode(encoder, state, links=True)
    assert encoder.encoded == 6
    assert sum(len(n["free_gpus"]) for n in after["nodes"]) == 40  # type: ignore[index, union-attr, arg-type]
    state.add_static(fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=1, prefix="x")[0])
    _encode(encoder, state, links=True)
    assert encoder.encoded == 7  # only the new node's
