"""The topology dump as JSON, built incrementally: the bulk is encoded once and reused.

`/api/v1/topology` is what dashboards poll. Encoding every node's topology (GPUs, NICs, every
link with its measurement) through protobuf's JSON mapping took over a second of CPU at 500
nodes, and in a Python process any CPU is the GIL, which Place needs too. But a node's topology
changes far less often than its free GPUs or its last report: here each node's topology is
encoded once per topology object (the snapshot keeps the same object until a report changes
it) and spliced, as bytes, between the small parts that change every time. The output is the
same JSON as `json_format.MessageToDict` of the whole `ClusterTopology` (`.proto` field
names, fields without presence printed), key order aside.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from gputopo.cluster import ClusterSnapshot
from gputopo.codec import cluster_to_proto, node_state_to_proto
from gputopo.codec.topology import topology_to_proto
from gputopo.topology import NodeTopology

__all__ = ["TopologyJson", "message_json"]


def message_json(message: Message) -> dict[str, Any]:
    """protobuf's JSON mapping as the HTTP API speaks it."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


class TopologyJson:
    """Encodes ClusterTopology JSON, keeping each node's encoded topology (see the module
    docstring). Safe to call from worker threads: the store only grows by whole entries."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, bool], tuple[NodeTopology, bytes]] = {}
        # the small rest of each node (free GPUs, last report...), by what it is made of
        self._small: dict[tuple[str, bool], tuple[tuple[Any, ...], bytes]] = {}
        self.encoded = 0  # topologies encoded (not reused), for tests and metrics

    def encode(
        self,
        snapshot: ClusterSnapshot,
        *,
        facts: Callable[[str], tuple[int, float | None]],
        reserved: Mapping[str, Iterable[int]],
        names: Sequence[str],
        include_links: bool,
        as_of: float | None,
        extra: Mapping[str, Any] | None = None,
    ) -> bytes:
        """The JSON bytes of the cluster with the nodes `names` (in that order)."""
        nodes = [self._node(snapshot, n, facts, reserved, include_links) for n in names]
        head = cluster_to_proto(
            snapshot, facts=facts, reserved=reserved, as_of=as_of, with_nodes=False
        )
        outer = message_json(head) | dict(extra or {})
        outer["nodes"] = []
        text = json.dumps(outer).encode()
        # splice the nodes into the empty list the outer object carries
        marker = b'"nodes": []'
        at = text.index(marker)
        self._prune(snapshot)
        return b"".join(
            (text[:at], b'"nodes": [', b", ".join(nodes), b"]", text[at + len(marker) :])
        )

    def _node(
        self,
        snapshot: ClusterSnapshot,
        name: str,
        facts: Callable[[str], tuple[int, float | None]],
        reserved: Mapping[str, Iterable[int]],
        include_links: bool,
    ) -> bytes:
        node = snapshot.node(name)
        key = (name, include_links)
        held = self._parts.get(key)
        if held is None or held[0] is not node.topology:
            topo = topology_to_proto(node.topology)
            if not include_links:
                del topo.links[:]
            held = (node.topology, json.dumps(message_json(topo)).encode())
            self._parts[key] = held
            self.encoded += 1
        generation, last_report = facts(name)
        mine = tuple(sorted(reserved.get(name, ())))
        small = (node.free, node.placeable, node.reason, generation, last_report, mine, node.labels)
        done = self._small.get(key)
        if done is None or done[0] != small:
            light = node_state_to_proto(
                node,
                generation=generation,
                last_report=last_report,
                reserved=mine,
                with_topology=False,
            )
            rest = json.dumps(message_json(light)).encode()
            done = (small, b", " + rest[1:] if rest != b"{}" else b"}")
            self._small[key] = done
        return b'{"topology": ' + held[1] + done[1]

    def _prune(self, snapshot: ClusterSnapshot) -> None:
        """Forget nodes the cluster no longer has (only when there are clearly too many)."""
        if len(self._parts) > 2 * len(snapshot.nodes) + 64:
            for key in [k for k in self._parts if k[0] not in snapshot.nodes]:
                self._parts.pop(key, None)
                self._small.pop(key, None)
