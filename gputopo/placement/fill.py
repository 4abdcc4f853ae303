"""Fill the groups of a request into a set of candidate nodes: the shared mechanics of policies.

Policies differ in which nodes they try first and which GPUs they take inside a node; the rest is
the same bookkeeping: a pod's GPUs are on one node, replicas honour their group's required scope
and spread, node selectors filter nodes, and a GPU is never handed out twice. `fill` does that
bookkeeping and asks its `Strategy` for the two choices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gputopo.cluster import ClusterSnapshot, NodeState, nvlink_islands
from gputopo.placement.result import PodPlacement, RejectionCode
from gputopo.request import Group, PlacementRequest, Scope

__all__ = ["FillFailure", "Strategy", "fill", "matches", "replica_domains"]


@dataclass(frozen=True, slots=True)
class FillFailure:
    """Why the groups did not fit: a code and a sentence."""

    code: RejectionCode
    message: str


# (snapshot, candidate node names, free GPUs per node, GPUs wanted per node) -> node order
NodeOrder = Callable[[ClusterSnapshot, Sequence[str], Mapping[str, frozenset[int]], int], list[str]]
# (snapshot, node, free GPUs, count, job leaves the node) -> GPUs in rank order, or None
GpuChoice = Callable[[ClusterSnapshot, str, frozenset[int], int, bool], tuple[int, ...] | None]


@dataclass(frozen=True, slots=True)
class Strategy:
    """The two choices a policy makes."""

    node_order: NodeOrder
    gpu_choice: GpuChoice
    # Try a replica in each of its required-scope domains and keep the best by this score
    # (lower is better); None means take the first domain that fits, in node order.
    replica_score: (
        Callable[[ClusterSnapshot, Group, Sequence[PodPlacement]], tuple[object, ...]] | None
    ) = None


def matches(state: NodeState, *selectors: Mapping[str, str]) -> bool:
    """True when the node's labels carry every key/value of every selector."""
    return all(state.labels.get(k) == v for sel in selectors for k, v in sel.items())


def replica_domains(
    snapshot: ClusterSnapshot, nodes: Sequence[str], scope: Scope | None
) -> list[tuple[str, ...]]:
    """Partition candidate nodes into the domains one replica must stay inside.

    NODE (and NVLINK for nodes without a multi-node NVLink domain) gives one node per domain;
    LEAF..ZONE group by the node's domain id and drop nodes without one; None or CLUSTER keep
    all nodes together.
    """
    if scope is None or scope is Scope.CLUSTER:
        return [tuple(nodes)]
    if scope is Scope.NODE:
        return [(n,) for n in nodes]
    groups: dict[str, list[str]] = {}
    singles: list[tuple[str, ...]] = []
    for n in nodes:
        domain = snapshot.domain_of(n, scope)
        if scope is Scope.NVLINK and not domain:
            singles.append((n,))
        elif domain:
            groups.setdefault(domain, []).append(n)
    return [tuple(v) for _, v in sorted(groups.items())] + singles


def fill(
    snapshot: ClusterSnapshot,
    request: PlacementRequest,
    groups: Sequence[Group],
    nodes: Sequence[str],
    strategy: Strategy,
) -> list[PodPlacement] | FillFailure:
    """Place every replica of `groups` on `nodes`, or say why not.

    Groups go largest replica first (the hardest to fit), replicas in order. A replica tries the
    domains of its group's required scope; within one, pods go to nodes in the strategy's order.
    """
    eligible = [
        n
        for n in nodes
        if snapshot.node(n).placeable and matches(snapshot.node(n), request.node_selector)
    ]
    free = {n: frozenset(snapshot.node(n).free) for n in eligible}
    placed: list[PodPlacement] = []
    for group in sorted(groups, key=lambda g: (-g.gpus_per_replica, g.name)):
        group_nodes = [n for n in eligible if matches(snapshot.node(n), group.node_selector)]
        if not group_nodes:
            return FillFailure(
                RejectionCode.SELECTOR, f"no node matches the selectors of group {group.name}"
            )
        used_spread: set[str] = set()
        for replica in range(group.replicas):
            pods = _place_replica(
                snapshot,
                group,
                replica,
                nodes=group_nodes,
                free=free,
                strategy=strategy,
                used_spread=used_spread,
            )
            if isinstance(pods, FillFailure):
                return pods
            for pod in pods:
                free[pod.node] = free[pod.node] - set(pod.gpus)
            if group.spread is not None:
                for pod in pods:
                    domain = snapshot.domain_of(pod.node, group.spread.across)
                    if domain:
                        used_spread.add(domain)
            placed.extend(pods)
    return placed


def _place_replica(
    snapshot: ClusterSnapshot,
    group: Group,
    replica: int,
    *,
    nodes: Sequence[str],
    free: dict[str, frozenset[int]],
    strategy: Strategy,
    used_spread: set[str],
) -> list[PodPlacement] | FillFailure:
    candidates = list(nodes)
    if group.spread is not None and used_spread:
        away = [
            n for n in candidates if snapshot.domain_of(n, group.spread.across) not in used_spread
        ]
        if group.spread.required:
            candidates = away
        else:  # preferred: fresh domains first, the rest after
            candidates = away + [n for n in candidates if n not in away]
    domains = replica_domains(snapshot, candidates, group.scope.required)
    need = group.gpus_per_replica
    best: list[PodPlacement] | None = None
    best_score: tuple[object, ...] | None = None
    saw_room = False
    for domain in domains:
        if sum(len(free[n]) for n in domain) < need:
            continue
        saw_room = True
        pods = _place_in(snapshot, group, replica, domain=domain, free=free, strategy=strategy)
        if pods is None:
            continue
        if strategy.replica_score is None:
            return pods
        score = strategy.replica_score(snapshot, group, pods)
        if best_score is None or score < best_score:
            best, best_score = pods, score
    if best is not None:
        return best
    scope = group.scope.required.name.lower() if group.scope.required else "cluster"
    if not saw_room:
        return FillFailure(
            RejectionCode.INSUFFICIENT_GPUS,
            f"group {group.name} replica {replica} needs {need} GPUs in one {scope} domain; "
            "none has that many free",
        )
    return FillFailure(
        RejectionCode.FRAGMENTED,
        f"group {group.name} replica {replica}: enough free GPUs in a {scope} domain, but not "
        f"{group.pods} pod(s) of {group.gpus_per_pod} GPUs each on single nodes"
        + (" inside one NVLink domain" if group.scope.required is Scope.NVLINK else ""),
    )


def _place_in(
    snapshot: ClusterSnapshot,
    group: Group,
    replica: int,
    *,
    domain: Sequence[str],
    free: Mapping[str, frozenset[int]],
    strategy: Strategy,
) -> list[PodPlacement] | None:
    """Pods of one replica inside one domain, or None when they do not fit."""
    per_pod = group.gpus_per_pod
    single_node_nvlink = group.scope.required is Scope.NVLINK and len(domain) == 1
    order = strategy.node_order(snapshot, domain, free, per_pod)
    remaining = group.pods
    takes: list[tuple[str, int]] = []
    for node in order:
        if remaining == 0:
            break
        fits = len(free[node]) // per_pod
        if fits <= 0:
            continue
        k = min(fits, remaining)
        takes.append((node, k))
        remaining -= k
    if remaining:
        return None
    leaves = len(takes) > 1
    pods: list[PodPlacement] = []
    rank = 0
    pod_index = 0
    for node, k in takes:
        pool = free[node]
        if single_node_nvlink:
            gpus = _within_island(snapshot, strategy, node, pool, k * per_pod)
        else:
            gpus = strategy.gpu_choice(snapshot, node, pool, k * per_pod, leaves)
        if gpus is None:
            return None
        for i in range(k):
            chunk = gpus[i * per_pod : (i + 1) * per_pod]
            pods.append(PodPlacement(group.name, replica, pod_index, rank, node, tuple(chunk)))
            pod_index += 1
            rank += per_pod
    return pods


def _within_island(
    snapshot: ClusterSnapshot, strategy: Strategy, node: str, pool: frozenset[int], count: int
) -> tuple[int, ...] | None:
    """GPUs from a single NVLink island of a node (for a required NVLink scope)."""
    state = snapshot.node(node)
    if snapshot.domain_of(node, Scope.NVLINK):
        return strategy.gpu_choice(snapshot, node, pool, count, False)
    for island in sorted(nvlink_islands(state.topology), key=lambda s: (len(s & pool), min(s))):
        avail = frozenset(island & pool)
        if len(avail) >= count and (count == 1 or len(island) > 1):
            chosen = strategy.gpu_choice(snapshot, node, avail, count, False)
            if chosen is not None:
                return chosen
    return None
