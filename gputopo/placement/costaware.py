"""The `gputopo` policy: place a communication graph where it will communicate fastest.

Objective, in order (DESIGN.md): satisfy the required constraints; then the preferred scope; then
minimise the predicted communication time (bucketed, so near-equal choices tie); then keep large
free domains whole (best fit); then the narrower scope; then names, for determinism.

Phases:
1. Split the request into connected components of its edge graph: groups joined by an edge must
   be placed together, because the edge's bandwidth depends on where both ends land.
2. For each component (largest first), list candidate domains at every scope the request allows:
   each node, each multi-node NVLink domain, each leaf, spine, core and zone, and the cluster.
3. In each candidate with enough free GPUs, fill the component (best nodes, best GPUs inside a
   node), predict its communication, check its edges, and score it; keep the best. Every
   rejected candidate is recorded with a reason.
4. Commit the component to a working copy of the snapshot and go on with the next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gputopo import cost
from gputopo.cluster import ClusterSnapshot, nvlink_islands
from gputopo.placement.fill import FillFailure, Strategy, fill, matches
from gputopo.placement.intranode import choose_gpus
from gputopo.placement.links import span_of
from gputopo.placement.predict import predict, predict_replica, replicas_of
from gputopo.placement.result import PlacementResult, PodPlacement, Prediction, Rejection
from gputopo.request import Group, PlacementRequest, Scope

__all__ = ["CostAwarePolicy", "components"]

_CANDIDATE_SCOPES = (
    Scope.NODE,
    Scope.NVLINK,
    Scope.LEAF,
    Scope.SPINE,
    Scope.CORE,
    Scope.ZONE,
    Scope.CLUSTER,
)
# How wide each scope is when comparing against a required scope. Multi-node NVLink domains
# (NVL72 racks) sit between a node and a leaf.
_WIDTH = {
    Scope.NODE: 0,
    Scope.NVLINK: 1,
    Scope.LEAF: 2,
    Scope.SPINE: 3,
    Scope.CORE: 4,
    Scope.ZONE: 5,
    Scope.CLUSTER: 6,
}
# At most this many rejections are reported per decision; the rest are counted.
_MAX_REJECTIONS = 50


def components(request: PlacementRequest) -> list[tuple[Group, ...]]:
    """Groups joined (transitively) by edges, largest component first."""
    parent = {g.name: g.name for g in request.groups}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for e in request.edges:
        a, b = find(e.source), find(e.target)
        if a != b:
            parent[max(a, b)] = min(a, b)
    comps: dict[str, list[Group]] = {}
    for g in request.groups:
        comps.setdefault(find(g.name), []).append(g)
    return sorted(
        (tuple(c) for c in comps.values()), key=lambda c: (-sum(g.total_gpus for g in c), c[0].name)
    )


def _node_order(
    snapshot: ClusterSnapshot,
    nodes: Sequence[str],
    free: Mapping[str, frozenset[int]],
    per_pod: int,
) -> list[str]:
    """Nodes that hold the most pods first (fewest nodes per replica), then the tightest fit."""

    def key(n: str) -> tuple[int, int, str]:
        pods = len(free[n]) // per_pod if per_pod else 0
        return (-pods, len(free[n]) - pods * per_pod, n)

    return sorted(nodes, key=key)


def _gpu_choice(
    snapshot: ClusterSnapshot, node: str, free: frozenset[int], count: int, leaves: bool
) -> tuple[int, ...] | None:
    return choose_gpus(snapshot.node(node).topology, free, count, leaves_node=leaves)


def _replica_score(
    snapshot: ClusterSnapshot, group: Group, pods: Sequence[PodPlacement]
) -> tuple[object, ...]:
    replica = next(iter(replicas_of(pods).values()))
    _, seconds, _, _ = predict_replica(snapshot, group, replica)
    nodes = sorted({p.node for p in pods})
    leftover = sum(snapshot.node(n).free_count for n in nodes) - len(replica)
    return (cost.time_bucket(seconds), leftover, nodes)


STRATEGY = Strategy(node_order=_node_order, gpu_choice=_gpu_choice, replica_score=_replica_score)


@dataclass(frozen=True, slots=True)
class _Candidate:
    scope: Scope
    domain: str
    nodes: tuple[str, ...]
    gpus: frozenset[int] | None = None  # an NVLink island: only these GPUs of its one node

    @property
    def label(self) -> str:
        return f"{self.scope.name.lower()}/{self.domain}"


@dataclass(frozen=True, slots=True)
class _Trial:
    candidate: _Candidate
    pods: tuple[PodPlacement, ...]
    prediction: Prediction
    score: tuple[object, ...]


class CostAwarePolicy:
    """The cost-aware policy (see the module docstring)."""

    name = "gputopo"

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        """Place the whole request or nothing."""
        working = snapshot
        pods: list[PodPlacement] = []
        for comp in components(request):
            outcome = self._place_component(working, request, comp)
            if isinstance(outcome, PlacementResult):
                return outcome
            pods.extend(outcome.pods)
            taken: dict[str, set[int]] = {}
            for pod in outcome.pods:
                taken.setdefault(pod.node, set()).update(pod.gpus)
            working = working.with_free(
                {n: working.node(n).free - frozenset(g) for n, g in taken.items()}
            )
        return PlacementResult(True, self.name, tuple(pods), predict(snapshot, request, pods))

    def _place_component(
        self, snapshot: ClusterSnapshot, request: PlacementRequest, groups: tuple[Group, ...]
    ) -> _Trial | PlacementResult:
        need = sum(g.total_gpus for g in groups)
        names = {g.name for g in groups}
        sub = PlacementRequest(
            groups=groups,
            edges=tuple(e for e in request.edges if e.source in names),
            scope=request.scope,
            node_selector=request.node_selector,
        )
        rejections: list[Rejection] = []
        best: _Trial | None = None
        limit = request.scope.required
        for cand in self._candidates(snapshot, request, need):
            view = snapshot
            if cand.gpus is not None:
                node = cand.nodes[0]
                view = snapshot.with_free({node: snapshot.node(node).free & cand.gpus})
            free = view.free_in(cand.nodes)
            if free < need:
                if cand.scope is not Scope.NODE:
                    rejections.append(
                        Rejection(
                            cand.label, "insufficient_gpus", f"{free} free GPUs, {need} needed"
                        )
                    )
                continue
            pods = fill(view, sub, groups, cand.nodes, STRATEGY)
            if isinstance(pods, FillFailure):
                rejections.append(Rejection(cand.label, pods.code, pods.message))
                continue
            span = span_of(snapshot, sorted({p.node for p in pods}))
            if limit is not None and limit is not Scope.NVLINK and _WIDTH[span] > _WIDTH[limit]:
                rejections.append(
                    Rejection(
                        cand.label,
                        "scope",
                        f"spans a {span.name.lower()}, the request requires "
                        f"one {limit.name.lower()}",
                    )
                )
                continue
            prediction = predict(snapshot, sub, pods)
            unmet = [e for e in prediction.edges if not e.satisfied]
            if unmet:
                e = unmet[0]
                want = sub_edge_need(sub, e.source, e.target)
                rejections.append(
                    Rejection(
                        cand.label,
                        "bandwidth",
                        f"edge {e.source}->{e.target} gets {e.gbps:.0f} GB/s, needs {want:.0f}",
                    )
                )
                continue
            trial = _Trial(
                cand,
                tuple(pods),
                prediction,
                self._score(snapshot, request, cand, pods, prediction),
            )
            if best is None or trial.score < best.score:
                best = trial
        if best is not None:
            return best
        return self._failure(snapshot, request, groups, need, rejections)

    def _candidates(
        self, snapshot: ClusterSnapshot, request: PlacementRequest, need: int
    ) -> list[_Candidate]:
        """Every domain the request may land in, narrowest scopes first."""
        limit = request.scope.required
        out: list[_Candidate] = []
        if limit is Scope.NVLINK:
            out.extend(
                _Candidate(Scope.NVLINK, d, m) for d, m in snapshot.domains(Scope.NVLINK).items()
            )
            for n, state in snapshot.nodes.items():
                if snapshot.domain_of(n, Scope.NVLINK) or not matches(state, request.node_selector):
                    continue
                for i, island in enumerate(nvlink_islands(state.topology)):
                    if len(island & state.free) >= need:
                        out.append(_Candidate(Scope.NVLINK, f"{n}/island-{i}", (n,), island))
            return out
        for scope in _CANDIDATE_SCOPES:
            if limit is not None and _WIDTH[scope] > _WIDTH[limit]:
                continue
            if scope is Scope.NODE:
                out.extend(
                    _Candidate(scope, n, (n,))
                    for n, s in snapshot.nodes.items()
                    if s.free_count >= need and matches(s, request.node_selector)
                )
            else:
                out.extend(_Candidate(scope, d, m) for d, m in snapshot.domains(scope).items())
        return out

    def _score(
        self,
        snapshot: ClusterSnapshot,
        request: PlacementRequest,
        cand: _Candidate,
        pods: Sequence[PodPlacement],
        prediction: Prediction,
    ) -> tuple[object, ...]:
        nodes = sorted({p.node for p in pods})
        span = span_of(snapshot, nodes)
        preferred = request.scope.preferred
        missed_preference = preferred is not None and span > preferred
        taken = sum(len(p.gpus) for p in pods)
        # Best fit: the candidate domain with the fewest GPUs left free after this placement,
        # and whole free nodes broken only when needed.
        left_in_domain = snapshot.free_in(cand.nodes) - taken
        broken_whole = sum(
            1
            for n in nodes
            if snapshot.node(n).free_count == snapshot.node(n).topology.gpu_count
            and sum(len(p.gpus) for p in pods if p.node == n) < snapshot.node(n).free_count
        )
        seconds = prediction.communication_seconds
        return (
            missed_preference,
            cost.time_bucket(seconds) if math.isfinite(seconds) else 10**9,
            broken_whole,
            left_in_domain,
            cand.scope,
            cand.domain,
        )

    def _failure(
        self,
        snapshot: ClusterSnapshot,
        request: PlacementRequest,
        groups: tuple[Group, ...],
        need: int,
        rejections: list[Rejection],
    ) -> PlacementResult:
        scope = request.scope.required.name.lower() if request.scope.required else "cluster"
        names = ", ".join(g.name for g in groups)
        if snapshot.free_gpus < need:
            reason = (
                f"{need} GPUs needed for {names}, only {snapshot.free_gpus} free in the cluster"
            )
        elif rejections:
            codes = sorted({r.code for r in rejections})
            reason = (
                f"no {scope} domain can hold {names} ({need} GPUs): "
                f"{len(rejections)} candidate(s) rejected ({', '.join(codes)})"
            )
        else:
            reason = f"no {scope} domain has {need} free GPUs for {names}"
        kept = tuple(rejections[:_MAX_REJECTIONS])
        if len(rejections) > _MAX_REJECTIONS:
            kept += (Rejection("...", "more", f"{len(rejections) - _MAX_REJECTIONS} more"),)
        return PlacementResult(False, self.name, reason=reason, rejections=kept)


def sub_edge_need(request: PlacementRequest, source: str, target: str) -> float:
    """The bandwidth an edge of the request needs."""
    for e in request.edges:
        if e.source == source and e.target == target:
            return e.required_gbps
    return 0.0
