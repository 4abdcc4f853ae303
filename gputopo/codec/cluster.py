"""Cluster messages (topology.proto's NodeState and ClusterTopology) from a snapshot.

What GetTopology and `/api/v1/topology` answer. The snapshot gives nodes, free GPUs and domains;
what only the aggregator knows (a node's generation and last report, which held GPUs are still
pending) comes in as plain values, so this module needs no aggregator. Domain levels and ids
are `gputopo.domains`' (every fabric tier, not only the three a request can name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.codec._base import timestamp
from gputopo.codec.topology import topology_to_proto
from gputopo.domains import NVLINK, ZONE, Level, tier_level, tier_path
from gputopo.request import Scope
from gputopo.v1 import topology_pb2 as tpb

__all__ = ["NodeFacts", "cluster_to_proto", "node_state_to_proto"]

# (node generation, unix seconds of its last report or None) by node name.
NodeFacts = Callable[[str], tuple[int, float | None]]


def node_state_to_proto(
    state: NodeState,
    *,
    generation: int = 0,
    last_report: float | None = None,
    reserved: Iterable[int] = (),
    include_links: bool = True,
    with_topology: bool = True,
) -> tpb.NodeState:
    """A node in a snapshot as a message. GPUs not free and not reserved are allocated.
    `with_topology=False` leaves the topology out (a caller that encodes it once and reuses it,
    as the aggregator's topology dump does: it is the bulk, and changes far less often)."""
    topo = None
    if with_topology:
        topo = topology_to_proto(state.topology)
        if not include_links:
            del topo.links[:]
    reserved_set = set(reserved)
    allocated = [
        g for g in range(state.topology.gpu_count) if g not in state.free and g not in reserved_set
    ]
    msg = tpb.NodeState(
        topology=topo,
        stale=not state.placeable and state.reason == "stale",
        placeable=state.placeable,
        free_gpus=sorted(state.free),
        reserved_gpus=sorted(reserved_set),
        allocated_gpus=allocated,
        generation=generation,
        labels=dict(state.labels),
    )
    if last_report is not None:
        msg.last_report.CopyFrom(timestamp(last_report))
    return msg


def cluster_to_proto(
    snapshot: ClusterSnapshot,
    *,
    facts: NodeFacts,
    reserved: Mapping[str, Iterable[int]],
    nodes: Iterable[str] | None = None,
    include_links: bool = True,
    as_of: float | None = None,
    with_nodes: bool = True,
) -> tpb.ClusterTopology:
    """The cluster as a ClusterTopology message: every node (or those named; none without
    `with_nodes`) and every multi-node domain. `reserved`: GPUs held by reservations not yet
    committed, per node."""
    wanted = set(nodes) if nodes else None
    msg = tpb.ClusterTopology(generation=snapshot.generation)
    for name, node in snapshot.nodes.items() if with_nodes else ():
        if wanted is not None and name not in wanted:
            continue
        generation, last_report = facts(name)
        msg.nodes.append(
            node_state_to_proto(
                node,
                generation=generation,
                last_report=last_report,
                reserved=sorted(reserved.get(name, ())),
                include_links=include_links,
            )
        )
    for level, domain, members, parent in _domains(snapshot):
        msg.domains.append(
            tpb.Domain(
                id=domain,
                level=level,
                nodes=list(members),
                parent=parent,
                total_gpus=sum(snapshot.node(n).topology.gpu_count for n in members),
                free_gpus=snapshot.free_in(members),
            )
        )
    if as_of is not None:
        msg.as_of.CopyFrom(timestamp(as_of))
    return msg


def _domains(
    snapshot: ClusterSnapshot,
) -> Iterator[tuple[Level, str, tuple[str, ...], str]]:
    """(level, id, nodes, parent id) of every multi-node domain: NVLink domains, every fabric
    tier the nodes report (not only the three a request can name), zones; ids sorted."""
    for domain, members in snapshot.domains(Scope.NVLINK).items():
        yield NVLINK, domain, members, ""
    tiers: dict[int, dict[str, list[str]]] = {}
    parents: dict[tuple[int, str], str] = {}
    for name, node in snapshot.nodes.items():
        path = node.topology.fabric.tiers
        for tier in range(len(path)):
            domain = tier_path(path, tier)
            tiers.setdefault(tier, {}).setdefault(domain, []).append(name)
            if tier + 1 < len(path):
                parents[(tier, domain)] = tier_path(path, tier + 1)
    for tier in sorted(tiers):
        for domain, names in sorted(tiers[tier].items()):
            parent = parents.get((tier, domain), "")
            yield tier_level(tier), domain, tuple(sorted(names)), parent
    for domain, members in snapshot.domains(Scope.ZONE).items():
        yield ZONE, domain, members, ""
