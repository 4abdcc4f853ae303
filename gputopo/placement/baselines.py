"""Baseline policies: what Kubernetes does today, implemented honestly behind the same interface.

- `first-fit`: nodes and GPUs in name/index order; the first domain that fits wins.
- `default`: kube-scheduler's count-only view: NodeResourcesFit with LeastAllocated scoring
  (the node with the most free GPUs first, which spreads), gang-atomic like the coscheduling
  plugin, and inside a node the NVIDIA device plugin's preferred allocation (go-gpuallocator's
  best-effort pair scores).

Both honour required scopes (kube-scheduler can express them with required pod affinity on a
topology key) and node selectors; neither looks at bandwidth, so neither can honour an edge's
bandwidth need: their placements are reported with the edge marked unsatisfied.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from gputopo.cluster import ClusterSnapshot
from gputopo.links import LinkKind
from gputopo.placement.constraints import violations
from gputopo.placement.fill import FillFailure, Strategy, fill
from gputopo.placement.predict import predict
from gputopo.placement.result import PlacementResult, Rejection, RejectionCode
from gputopo.request import PlacementRequest, Scope
from gputopo.topology import NodeTopology

__all__ = ["DefaultPolicy", "FirstFitPolicy", "gpuallocator_choice"]

# go-gpuallocator calculateGPUPairScore: PCIe classes score 10..60, NVLink 100 per link.
_PAIR_SCORE = {
    LinkKind.SYS: 10,
    LinkKind.NODE: 20,
    LinkKind.PHB: 30,
    LinkKind.PXB: 40,
    LinkKind.PIX: 50,
    LinkKind.C2C: 60,
}


def _pair_score(topology: NodeTopology, a: int, b: int) -> int:
    link = topology.gpu_link(a, b)
    if link is None:
        return _PAIR_SCORE[LinkKind.SYS]
    if link.kind is LinkKind.NVLINK:
        if link.via_switch:
            # go-gpuallocator counts a GPU-GPU NVLink only when the link's remote PCI device is
            # the peer GPU; through an NVSwitch it is the switch (its TODO(klueska)), so the
            # pair scores as the PCIe path it has, which we approximate by socket.
            na, nb = topology.gpus[a].numa_node, topology.gpus[b].numa_node
            return _PAIR_SCORE[LinkKind.NODE if na == nb else LinkKind.SYS]
        return 100 * link.lanes
    return _PAIR_SCORE.get(link.kind, 10)


def gpuallocator_choice(
    topology: NodeTopology, free: frozenset[int], count: int
) -> tuple[int, ...] | None:
    """The `count` free GPUs with the highest sum of pair scores (lowest indices on ties)."""
    if count > len(free):
        return None
    pool = sorted(free)
    if count == len(pool) or count <= 1:
        return tuple(pool[:count])
    if math.comb(len(pool), count) > 4096:
        return tuple(pool[:count])
    best = max(
        itertools.combinations(pool, count),
        key=lambda s: (
            sum(_pair_score(topology, a, b) for a, b in itertools.combinations(s, 2)),
            [-g for g in s],
        ),
    )
    return tuple(best)


def _by_name(
    snapshot: ClusterSnapshot, nodes: Sequence[str], free: Mapping[str, frozenset[int]], per: int
) -> list[str]:
    return sorted(nodes)


def _least_allocated(
    snapshot: ClusterSnapshot, nodes: Sequence[str], free: Mapping[str, frozenset[int]], per: int
) -> list[str]:
    def key(n: str) -> tuple[float, str]:
        total = snapshot.node(n).topology.gpu_count or 1
        return (-len(free[n]) / total, n)

    return sorted(nodes, key=key)


def _lowest_indices(
    snapshot: ClusterSnapshot, node: str, free: frozenset[int], count: int, leaves: bool
) -> tuple[int, ...] | None:
    return tuple(sorted(free)[:count]) if count <= len(free) else None


def _device_plugin(
    snapshot: ClusterSnapshot, node: str, free: frozenset[int], count: int, leaves: bool
) -> tuple[int, ...] | None:
    return gpuallocator_choice(snapshot.node(node).topology, free, count)


class _CountOnlyPolicy:
    """Shared shape of the count-only baselines: domains in some order, first fit wins."""

    name = "count-only"
    strategy: Strategy

    def _domain_order(
        self, snapshot: ClusterSnapshot, domains: Mapping[str, tuple[str, ...]]
    ) -> list[tuple[str, tuple[str, ...]]]:
        return sorted(domains.items())

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        """Fill the whole request into the first domain (of the required scope) that fits."""
        scope = request.scope.required
        if scope is None or scope is Scope.CLUSTER:
            domains: Mapping[str, tuple[str, ...]] = {"cluster": tuple(snapshot.nodes)}
        elif scope is Scope.NODE:
            domains = {n: (n,) for n in snapshot.nodes}
        else:
            domains = dict(snapshot.domains(scope))
            if scope is Scope.NVLINK:
                domains.update(
                    {n: (n,) for n in snapshot.nodes if not snapshot.domain_of(n, Scope.NVLINK)}
                )
        rejections: list[Rejection] = []
        need = request.total_gpus
        for domain, nodes in self._domain_order(snapshot, domains):
            if snapshot.free_in(nodes) < need:
                continue
            pods = fill(snapshot, request, request.groups, nodes, self.strategy)
            if isinstance(pods, FillFailure):
                rejections.append(Rejection(domain, pods.code, pods.message))
                continue
            broken = violations(snapshot, request, pods)
            if broken:
                rejections.append(Rejection(domain, RejectionCode.UNSUPPORTED, broken[0]))
                continue
            return PlacementResult(True, self.name, tuple(pods), predict(snapshot, request, pods))
        label = scope.name.lower() if scope else "cluster"
        return PlacementResult(
            False,
            self.name,
            reason=f"no {label} domain can hold the request ({need} GPUs)",
            rejections=tuple(rejections[:50]),
        )


class FirstFitPolicy(_CountOnlyPolicy):
    """Nodes and GPUs in order; the first domain that fits wins."""

    name = "first-fit"
    strategy = Strategy(node_order=_by_name, gpu_choice=_lowest_indices)


class DefaultPolicy(_CountOnlyPolicy):
    """kube-scheduler LeastAllocated + gang atomicity + the device plugin's GPU choice."""

    name = "default"
    strategy = Strategy(node_order=_least_allocated, gpu_choice=_device_plugin)

    def _domain_order(
        self, snapshot: ClusterSnapshot, domains: Mapping[str, tuple[str, ...]]
    ) -> list[tuple[str, tuple[str, ...]]]:
        return sorted(domains.items(), key=lambda kv: (-snapshot.free_in(kv[1]), kv[0]))
