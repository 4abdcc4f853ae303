"""Predict the communication performance of a concrete placement.

Per replica of each group, the GPUs are split by node; the collective's time then comes from the
cost model with the bandwidths of `gputopo.placement.links`:

1. inside each node, the best ring through that node's GPUs of the replica gives the intra-node
   bandwidth (the slowest node counts);
2. across nodes, either the multi-node NVLink domain (all nodes in one) or the NICs: each GPU's
   share of its nearest NIC, the slowest GPU counting;
3. all-reduce is hierarchical, all-to-all is bounded by the slower of local and remote traffic,
   pipeline by the slowest neighbour hop; a group's figure is its slowest replica.

Edges sum the bandwidth of matched GPU shards between two replicas (shard i of the source sends
to shard i of the target) and report the worst pair of replicas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from gputopo import bandwidth, cost
from gputopo.cluster import ClusterSnapshot
from gputopo.links import LinkKind
from gputopo.placement.links import (
    best_ring,
    gpu_nvlink_gbps,
    nic_share_gbps,
    pair_gbps,
    pair_kind,
    span_of,
)
from gputopo.placement.result import EdgePrediction, GroupPrediction, PodPlacement, Prediction
from gputopo.request import Edge, Group, Pairing, Pattern, PlacementRequest, Scope
from gputopo.topology import NodeTopology

__all__ = ["Replica", "predict", "predict_edge", "predict_replica"]

# A replica's GPUs in rank order: (node, gpu index) pairs.
Replica = tuple[tuple[str, int], ...]


def replicas_of(pods: Iterable[PodPlacement]) -> dict[tuple[str, int], Replica]:
    """Group placed pods into replicas keyed by (group, replica), GPUs in rank order."""
    acc: dict[tuple[str, int], list[tuple[int, str, tuple[int, ...]]]] = {}
    for p in pods:
        acc.setdefault((p.group, p.replica), []).append((p.rank, p.node, p.gpus))
    out: dict[tuple[str, int], Replica] = {}
    for key, items in acc.items():
        items.sort()
        out[key] = tuple((node, g) for _, node, gpus in items for g in gpus)
    return out


def predict_replica(
    snapshot: ClusterSnapshot, group: Group, replica: Replica
) -> tuple[float, float, str, Scope]:
    """(bus GB/s, collective seconds, bottleneck description, span) of one replica."""
    by_node: dict[str, list[int]] = {}
    for node, g in replica:
        by_node.setdefault(node, []).append(g)
    span = span_of(snapshot, list(by_node))
    if len(replica) <= 1 or group.pattern is Pattern.NONE:
        return math.inf, 0.0, "none", span

    intra_gbps, intra_kind = math.inf, LinkKind.NVLINK
    for node, gpus in by_node.items():
        topo = snapshot.node(node).topology
        _, ring = best_ring(topo, gpus)
        if ring < intra_gbps:
            intra_gbps = ring
            intra_kind = _weakest_kind(topo, gpus)
    intra_latency = bandwidth.latency_us(intra_kind)
    size = group.message_bytes
    n, m = len(replica), len(by_node)
    g_max = max(len(v) for v in by_node.values())

    inter_gbps, bottleneck = math.inf, _kind_name(intra_kind)
    inter_latency = bandwidth.latency_us(LinkKind.NET)
    if m > 1:
        if span is Scope.NVLINK:
            inter_gbps = min(
                gpu_nvlink_gbps(snapshot.node(node).topology, g) for node, g in replica
            )
            inter_latency = bandwidth.latency_us(LinkKind.NVLINK)
            net_name = "multi-node NVLink"
        else:
            inter_gbps, net_name = math.inf, "NIC"
            for node, gpus in by_node.items():
                for gbps, nic in nic_share_gbps(snapshot.node(node).topology, gpus).values():
                    if gbps < inter_gbps:
                        inter_gbps, net_name = gbps, f"NIC {nic} on {node}"
        if inter_gbps * g_max < intra_gbps or g_max == 1:
            bottleneck = net_name

    if group.pattern is Pattern.ALL_REDUCE:
        seconds = cost.hierarchical_allreduce_seconds(
            size_bytes=size,
            gpus_per_node=g_max,
            nodes=m,
            intra_gbps=intra_gbps if g_max > 1 else math.inf,
            inter_gbps_per_gpu=inter_gbps,
            intra_latency_us=intra_latency,
            inter_latency_us=inter_latency,
        )
        bus = cost.allreduce_busbw_gbps(size_bytes=size, ranks=n, seconds=seconds)
    elif group.pattern is Pattern.ALL_TO_ALL:
        seconds = cost.alltoall_seconds(
            size_bytes=size,
            ranks=n,
            gpus_per_node=g_max,
            intra_gbps=intra_gbps if g_max > 1 else math.inf,
            inter_gbps_per_gpu=inter_gbps,
            intra_latency_us=intra_latency,
            inter_latency_us=inter_latency,
        )
        bus = size * (n - 1) / n / seconds / 1e9 if seconds > 0 else math.inf
    else:  # PIPELINE: the slowest neighbour hop in rank order
        hop_gbps = math.inf
        for (na, ga), (nb, gb) in itertools.pairwise(replica):
            hop_gbps = min(hop_gbps, _pair_between(snapshot, na, ga, nb, gb))
        seconds = cost.pipeline_seconds(
            size_bytes=size, neighbour_gbps=hop_gbps, hop_latency_us=intra_latency
        )
        bus = hop_gbps
    return bus, seconds, bottleneck, span


def _pair_between(snapshot: ClusterSnapshot, na: str, ga: int, nb: str, gb: int) -> float:
    """Bandwidth between two single GPUs anywhere in the cluster."""
    if na == nb:
        return pair_gbps(snapshot.node(na).topology, ga, gb)
    ta, tb = snapshot.node(na).topology, snapshot.node(nb).topology
    if span_of(snapshot, [na, nb]) is Scope.NVLINK:
        return min(gpu_nvlink_gbps(ta, ga), gpu_nvlink_gbps(tb, gb))
    return min(nic_share_gbps(ta, [ga])[ga][0], nic_share_gbps(tb, [gb])[gb][0])


def predict_edge(snapshot: ClusterSnapshot, source: Replica, target: Replica) -> float:
    """Bandwidth from one source replica to one target replica, summed over matched shards.

    Shard i of the source pairs with shard i of the target. Shards that leave a node share the
    NICs they use: each GPU's NIC share is computed over all of that replica's GPUs on the node.
    """
    shards = min(len(source), len(target))
    if shards == 0:
        return 0.0
    src_nic = _nic_shares(snapshot, source)
    dst_nic = _nic_shares(snapshot, target)
    total = 0.0
    for (na, ga), (nb, gb) in zip(source[:shards], target[:shards], strict=True):
        if na == nb:
            total += pair_gbps(snapshot.node(na).topology, ga, gb) if ga != gb else math.inf
        elif span_of(snapshot, [na, nb]) is Scope.NVLINK:
            total += min(
                gpu_nvlink_gbps(snapshot.node(na).topology, ga),
                gpu_nvlink_gbps(snapshot.node(nb).topology, gb),
            )
        else:
            total += min(src_nic[(na, ga)], dst_nic[(nb, gb)])
    return total


def _nic_shares(snapshot: ClusterSnapshot, replica: Replica) -> dict[tuple[str, int], float]:
    by_node: dict[str, list[int]] = {}
    for node, g in replica:
        by_node.setdefault(node, []).append(g)
    out: dict[tuple[str, int], float] = {}
    for node, gpus in by_node.items():
        for g, (gbps, _) in nic_share_gbps(snapshot.node(node).topology, gpus).items():
            out[(node, g)] = gbps
    return out


def predict(
    snapshot: ClusterSnapshot, request: PlacementRequest, pods: Sequence[PodPlacement]
) -> Prediction:
    """The prediction for a whole placement (every group and edge)."""
    replicas = replicas_of(pods)
    groups: list[GroupPrediction] = []
    total = 0.0
    for group in request.groups:
        worst: tuple[float, float, str, Scope] | None = None
        for r in range(group.replicas):
            rep = replicas.get((group.name, r))
            if rep is None:
                continue
            figures = predict_replica(snapshot, group, rep)
            if worst is None or figures[1] > worst[1]:
                worst = figures
        if worst is None:
            continue
        bus, seconds, bottleneck, span = worst
        total += seconds
        groups.append(
            GroupPrediction(group.name, bus, seconds, bottleneck, span, group.message_bytes)
        )
    edges: list[EdgePrediction] = []
    for edge in request.edges:
        src, dst = request.group(edge.source), request.group(edge.target)
        worst_gbps = math.inf
        for i, j in _edge_pairs(edge, src.replicas, dst.replicas):
            a, b = replicas.get((src.name, i)), replicas.get((dst.name, j))
            if a is None or b is None:
                continue
            worst_gbps = min(worst_gbps, predict_edge(snapshot, a, b))
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


def _edge_pairs(edge: Edge, sources: int, targets: int) -> Iterable[tuple[int, int]]:
    if edge.pairing is Pairing.ONE_TO_ONE:
        return ((i, i) for i in range(min(sources, targets)))
    return ((i, j) for i in range(sources) for j in range(targets))


def _weakest_kind(topology: NodeTopology, gpus: Sequence[int]) -> LinkKind:
    kinds = [pair_kind(topology, a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    return max(kinds, default=LinkKind.NVLINK)


def _kind_name(kind: LinkKind) -> str:
    return "NVLink" if kind is LinkKind.NVLINK else f"PCIe {kind.name}"
