"""Predict the communication performance of a placement, from per-node figures.

A replica is a sequence of `NodePart`s in rank order: the GPUs it holds on each node and that
node's figures (`intranode.NodeChoice`: best ring, weakest link, NIC shares, NVLink rate). The
same functions score candidate placements inside the engine (figures come from the cached
intra-node choices) and the final result (figures recomputed from the chosen GPUs), so what the
engine optimises is exactly what the answer reports. Per replica:

1. inside each node, the best ring through that node's GPUs of the replica gives the intra-node
   bandwidth;
2. across nodes, either the multi-node NVLink domain (all nodes in one) or the NICs: each GPU's
   share of its nearest NIC, the slowest GPU of the node counting;
3. every node is costed on its own GPU count and figures (`cost.NodeLoad`) and the slowest node
   sets the time: all-reduce is hierarchical (a node with few GPUs of the gang pushes a larger
   shard through its own NICs), all-to-all is bounded by the slower of local and remote traffic
   (a small node sends more of it off the node), pipeline by the slowest hop (inside a node:
   its ring's bottleneck; across nodes: the network); a group's figure is its slowest replica.

Edges sum the bandwidth of matched GPU shards between two replicas (shard i of the source sends
to shard i of the target) and report the worst pair of replicas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gputopo import bandwidth, cost
from gputopo.cluster import ClusterSnapshot
from gputopo.links import LinkKind
from gputopo.placement.intranode import NodeChoice, figures_of
from gputopo.placement.links import span_of
from gputopo.placement.result import EdgePrediction, GroupPrediction, PodPlacement, Prediction
from gputopo.request import Edge, Group, Pairing, Pattern, PlacementRequest, Scope

__all__ = [
    "NodePart",
    "ReplicaFigures",
    "collective",
    "collective_seconds",
    "edge_gbps",
    "edge_pairs",
    "node_floor_seconds",
    "parts_of",
    "predict",
    "replica_figures",
    "replicas_of",
]


@dataclass(frozen=True, slots=True)
class NodePart:
    """The GPUs a replica holds on one node, with that node's figures for them."""

    node: str
    choice: NodeChoice

    @property
    def gpus(self) -> tuple[int, ...]:
        """GPU indices in rank order."""
        return self.choice.gpus


# A replica's parts, in rank order.
Replica = tuple[NodePart, ...]


@dataclass(frozen=True, slots=True)
class ReplicaFigures:
    """Predicted collective of one replica."""

    bus_gbps: float
    seconds: float
    bottleneck: str
    span: Scope


def replicas_of(pods: Iterable[PodPlacement]) -> dict[tuple[str, int], list[PodPlacement]]:
    """Placed pods grouped by (group, replica), in rank order."""
    out: dict[tuple[str, int], list[PodPlacement]] = {}
    for p in pods:
        out.setdefault((p.group, p.replica), []).append(p)
    for items in out.values():
        items.sort(key=lambda p: p.rank)
    return out


def parts_of(snapshot: ClusterSnapshot, pods: Sequence[PodPlacement]) -> Replica:
    """A replica's parts from its pods (rank order; a node's GPUs gathered at first sight)."""
    by_node: dict[str, list[int]] = {}
    for p in pods:
        by_node.setdefault(p.node, []).extend(p.gpus)
    return tuple(
        NodePart(node, figures_of(snapshot.shape(node), gpus)) for node, gpus in by_node.items()
    )


def replica_figures(snapshot: ClusterSnapshot, group: Group, parts: Replica) -> ReplicaFigures:
    """Bus bandwidth, time of one collective, bottleneck and span of one replica."""
    span = span_of(snapshot, [p.node for p in parts])
    bus, seconds, bottleneck = collective(
        group,
        [(p.choice, 1) for p in parts],
        nodes=len(parts),
        nvlink=span is Scope.NVLINK,
        labels=[p.node for p in parts],
    )
    return ReplicaFigures(bus, seconds, bottleneck, span)


def collective_seconds(
    group: Group, parts: Sequence[tuple[NodeChoice, int]], *, nodes: int, nvlink: bool
) -> float:
    """Seconds of one collective (see `collective`)."""
    return collective(group, parts, nodes=nodes, nvlink=nvlink)[1]


def collective(
    group: Group,
    parts: Sequence[tuple[NodeChoice, int]],
    *,
    nodes: int,
    nvlink: bool,
    labels: Sequence[str] | None = None,
) -> tuple[float, float, str]:
    """(bus GB/s, seconds, bottleneck) of a replica's collective from per-node figures.

    `parts` lists distinct per-node figures with how many nodes have them (the engine estimates
    a gang of 64 identical nodes from one entry); `nodes` is how many nodes in all; `nvlink`
    says the nodes share one multi-node NVLink domain; `labels` names the nodes of `parts` (for
    the bottleneck text). Every node is costed on its own GPU count and figures
    (`cost.NodeLoad`), so a node holding few GPUs of a gang pays for pushing its share through
    its own NICs; the time is never below any node's own terms (`node_floor_seconds`).
    """
    n = sum(len(c.gpus) * k for c, k in parts)
    if n <= 1 or group.pattern is Pattern.NONE:
        return math.inf, 0.0, "none"
    intra_gbps, intra_kind = math.inf, LinkKind.NVLINK
    for c, _ in parts:
        if c.ring_gbps < intra_gbps:
            intra_gbps, intra_kind = c.ring_gbps, c.kind
    intra_latency = bandwidth.latency_us(intra_kind)
    size = group.message_bytes
    m = nodes
    g_max = max(len(c.gpus) for c, _ in parts)

    bottleneck = _kind_name(intra_kind)
    inter_latency = bandwidth.latency_us(LinkKind.NVLINK if nvlink else LinkKind.NET)
    loads = [cost.NodeLoad(len(c.gpus), c.ring_gbps, _net_gbps(c, m, nvlink), k) for c, k in parts]
    if m > 1:
        # the node whose GPUs push their shard slowest names the network bottleneck
        worst = min(range(len(parts)), key=lambda i: loads[i].gpus * loads[i].net_gbps_per_gpu)
        c, load = parts[worst][0], loads[worst]
        if nvlink:
            net_name = "multi-node NVLink"
        else:
            where = f" on {labels[worst]}" if labels else ""
            slow = min(
                zip(c.nic_gbps, c.nic_names, strict=True), key=lambda x: x[0], default=(0.0, "")
            )
            net_name = f"NIC {slow[1] or '(none)'}{where}"
        if load.net_gbps_per_gpu * load.gpus < intra_gbps or g_max == 1:
            bottleneck = net_name

    if group.pattern is Pattern.ALL_REDUCE:
        seconds = cost.uneven_allreduce_seconds(
            size_bytes=size,
            loads=loads,
            intra_latency_us=intra_latency,
            inter_latency_us=inter_latency,
        )
        bus = cost.allreduce_busbw_gbps(size_bytes=size, ranks=n, seconds=seconds)
    elif group.pattern is Pattern.ALL_TO_ALL:
        seconds = cost.uneven_alltoall_seconds(
            size_bytes=size,
            loads=loads,
            intra_latency_us=intra_latency,
            inter_latency_us=inter_latency,
            shared=nvlink,
        )
        bus = size * (n - 1) / n / seconds / 1e9 if seconds > 0 else math.inf
    else:  # PIPELINE: the slowest hop between consecutive ranks
        hop_gbps = min(_hop_gbps(x, m) for x in loads)
        latency = inter_latency if m > 1 else intra_latency
        seconds = cost.pipeline_seconds(
            size_bytes=size, neighbour_gbps=hop_gbps, hop_latency_us=latency
        )
        bus = hop_gbps
    return bus, seconds, bottleneck


def _net_gbps(choice: NodeChoice, nodes: int, nvlink: bool) -> float:
    """What each GPU of a node gets to the other nodes: the slowest GPU's NIC share, or its
    NVLink rate inside one multi-node NVLink domain (inf on a single node)."""
    if nodes <= 1:
        return math.inf
    return choice.nvlink_gbps if nvlink else choice.min_nic_gbps


def _hop_gbps(load: cost.NodeLoad, nodes: int) -> float:
    hops = [load.intra_gbps] if load.gpus > 1 else []
    if nodes > 1:
        hops.append(load.net_gbps_per_gpu)
    return min(hops, default=math.inf)


def node_floor_seconds(
    group: Group, choice: NodeChoice, *, ranks: int, nodes: int, nvlink: bool
) -> float:
    """A lower bound, under this model, on the collective of any replica of `ranks` GPUs over
    `nodes` nodes (or more) in which one node holds `choice`'s GPUs with at best its figures.

    The model's time is at least every node's own terms (its intra-node phase plus its network
    phase, each the slowest of all nodes in `collective`), and those terms only grow with more
    nodes, a slower ring or a smaller network share, so the engine may prune with this.
    """
    g = len(choice.gpus)
    if ranks <= 1 or group.pattern is Pattern.NONE or g == 0:
        return 0.0
    size = group.message_bytes
    load = cost.NodeLoad(g, choice.ring_gbps, _net_gbps(choice, nodes, nvlink))
    intra_latency = bandwidth.latency_us(choice.kind)
    inter_latency = bandwidth.latency_us(LinkKind.NVLINK if nvlink else LinkKind.NET)
    if group.pattern is Pattern.ALL_REDUCE:
        if nodes <= 1:
            return cost.uneven_allreduce_seconds(
                size_bytes=size, loads=[load], intra_latency_us=intra_latency
            )
        other = cost.NodeLoad(1, math.inf, math.inf, nodes - 1)
        return cost.uneven_allreduce_seconds(
            size_bytes=size,
            loads=[load, other],
            intra_latency_us=intra_latency,
            inter_latency_us=inter_latency,
        )
    if group.pattern is Pattern.ALL_TO_ALL:
        return cost.alltoall_seconds(
            size_bytes=size,
            ranks=ranks,
            gpus_per_node=g,
            intra_gbps=load.intra_gbps,
            inter_gbps_per_gpu=load.net_gbps_per_gpu,
            intra_latency_us=intra_latency,
            inter_latency_us=inter_latency,
            shared=nvlink,
        )
    latency = inter_latency if nodes > 1 else intra_latency
    return cost.pipeline_seconds(
        size_bytes=size, neighbour_gbps=_hop_gbps(load, nodes), hop_latency_us=latency
    )


def edge_gbps(snapshot: ClusterSnapshot, source: Replica, target: Replica) -> float:
    """Bandwidth from one source replica to one target replica, summed over matched shards.

    Shard i of the source pairs with shard i of the target. Shards on one node use the link
    between their GPUs; in one multi-node NVLink domain, NVLink; otherwise each side's share of
    its NIC (computed over that replica's GPUs on the node).
    """
    src = [(p, i) for p in source for i in range(len(p.gpus))]
    dst = [(p, i) for p in target for i in range(len(p.gpus))]
    shards = min(len(src), len(dst))
    if shards == 0:
        return 0.0
    total = 0.0
    # Per node pair, once (a part's shards all ask it): the two nodes' NVLink figures when they
    # share an NVLink domain, else None.
    nvlinked: dict[tuple[str, str], tuple[Sequence[float], Sequence[float]] | None] = {}
    for (pa, ia), (pb, ib) in zip(src[:shards], dst[:shards], strict=True):
        ga, gb = pa.gpus[ia], pb.gpus[ib]
        if pa.node == pb.node:
            total += snapshot.shape(pa.node).bw[ga][gb] if ga != gb else math.inf
            continue
        pair = (pa.node, pb.node)
        if pair in nvlinked:
            shared = nvlinked[pair]
        else:
            shared = nvlinked[pair] = (
                (snapshot.shape(pa.node).nvlink_gbps, snapshot.shape(pb.node).nvlink_gbps)
                if span_of(snapshot, list(pair)) is Scope.NVLINK
                else None
            )
        if shared is not None:
            total += min(shared[0][ga], shared[1][gb])
        else:
            total += min(pa.choice.nic_gbps[ia], pb.choice.nic_gbps[ib])
    return total


def edge_pairs(edge: Edge, sources: int, targets: int) -> Iterable[tuple[int, int]]:
    """The (source replica, target replica) pairs an edge joins."""
    if edge.pairing is Pairing.ONE_TO_ONE:
        return ((i, i) for i in range(min(sources, targets)))
    return ((i, j) for i in range(sources) for j in range(targets))


def predict(
    snapshot: ClusterSnapshot, request: PlacementRequest, pods: Sequence[PodPlacement]
) -> Prediction:
    """The prediction for a whole placement (every group and edge)."""
    replicas = {key: parts_of(snapshot, ps) for key, ps in replicas_of(pods).items()}
    groups: list[GroupPrediction] = []
    total = 0.0
    for group in request.groups:
        worst: ReplicaFigures | None = None
        for r in range(group.replicas):
            parts = replicas.get((group.name, r))
            if parts is None:
                continue
            figures = replica_figures(snapshot, group, parts)
            if worst is None or figures.seconds > worst.seconds:
                worst = figures
        if worst is None:
            continue
        total += worst.seconds
        groups.append(
            GroupPrediction(
                group.name,
                worst.bus_gbps,
                worst.seconds,
                worst.bottleneck,
                worst.span,
                group.message_bytes,
            )
        )
    edges: list[EdgePrediction] = []
    for edge in request.edges:
        src, dst = request.group(edge.source), request.group(edge.target)
        worst_gbps = math.inf
        for i, j in edge_pairs(edge, src.replicas, dst.replicas):
            a, b = replicas.get((src.name, i)), replicas.get((dst.name, j))
            if a is None or b is None:
                continue
            worst_gbps = min(worst_gbps, edge_gbps(snapshot, a, b))
        size = edge.transfer_bytes
        seconds = cost.transfer_seconds(size_bytes=size, gbps=worst_gbps) if size else 0.0
        total += seconds
        edges.append(
            EdgePrediction(
                edge.source, edge.target, worst_gbps, seconds, worst_gbps >= edge.required_gbps
            )
        )
    bottleneck_gbps = min((g.bus_gbps for g in groups), default=math.inf)
    return Prediction(tuple(groups), tuple(edges), total, bottleneck_gbps)


def _kind_name(kind: LinkKind) -> str:
    return "NVLink" if kind is LinkKind.NVLINK else f"PCIe {kind.name}"
