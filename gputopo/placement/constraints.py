"""Check a placement against every hard rule of its request, independently of any policy.

Policies decide; this module only checks, in the simplest way that is obviously right: one
pass over the pods. The cost-aware policy runs it on its own answer before handing it out (a
violation is a bug, reported as a failed placement rather than a wrong one), and the property
tests run it on every policy's answers.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.links import holds, span_of
from gputopo.placement.result import (
    PlacementResult,
    PodPlacement,
    Prediction,
    Rejection,
    RejectionCode,
)
from gputopo.request import PlacementRequest, Scope

__all__ = ["refusal", "violations"]


def violations(
    snapshot: ClusterSnapshot,
    request: PlacementRequest,
    pods: Sequence[PodPlacement],
    *,
    prediction: Prediction | None = None,
) -> list[str]:
    """Every broken hard rule, one sentence each (empty when the placement is valid).

    Rules: every pod of every replica placed once, with its GPU count, on one node; GPUs free
    and on placeable nodes; no GPU twice; node selectors; each replica inside one domain of its
    group's required scope, the whole request inside one of the request's; required spreads;
    and, when `prediction` is given, every edge's bandwidth need.
    """
    out: list[str] = []
    seen: set[tuple[str, int]] = set()
    by_replica: dict[tuple[str, int], list[PodPlacement]] = {}
    for p in pods:
        by_replica.setdefault((p.group, p.replica), []).append(p)
        state = snapshot.nodes.get(p.node)
        if state is None:
            out.append(f"{p.group}[{p.replica}] pod {p.pod}: unknown node {p.node}")
            continue
        if not state.placeable:
            out.append(f"{p.group}[{p.replica}] pod {p.pod}: node {p.node} is not placeable")
        for g in p.gpus:
            if (p.node, g) in seen:
                out.append(f"GPU {g} of {p.node} is handed out twice")
            seen.add((p.node, g))
            if g not in state.free:
                out.append(f"GPU {g} of {p.node} is not free")
        for sel in (request.node_selector, _group_selector(request, p.group)):
            for k, v in sel.items():
                if state.labels.get(k) != v:
                    out.append(f"{p.node} does not match selector {k}={v}")
    for group in request.groups:
        spread_domains: list[str | None] = []
        for r in range(group.replicas):
            placed = by_replica.get((group.name, r), [])
            if len(placed) != group.pods:
                out.append(f"{group.name}[{r}]: {len(placed)} pods placed, {group.pods} asked")
            for p in placed:
                if len(p.gpus) != group.gpus_per_pod:
                    out.append(f"{group.name}[{r}] pod {p.pod}: {len(p.gpus)} GPUs")
            nodes = sorted({p.node for p in placed if p.node in snapshot.nodes})
            required = group.scope.required
            if required is not None and nodes:
                out.extend(_scope_problems(snapshot, f"{group.name}[{r}]", required, placed))
            if group.spread is not None and group.spread.required and nodes:
                ids = {snapshot.domain_of(n, group.spread.across) for n in nodes}
                spread_domains.extend(ids)
        if group.spread is not None and group.spread.required:
            known = [d for d in spread_domains if d]
            if len(known) != len(set(known)):
                out.append(f"{group.name}: replicas share a {group.spread.across.name.lower()}")
    if request.scope.required is not None and pods:
        out.extend(_scope_problems(snapshot, "request", request.scope.required, pods))
    if prediction is not None:
        for e in prediction.edges:
            if not e.satisfied:
                out.append(f"edge {e.source}->{e.target} gets {e.gbps:.0f} GB/s, below its need")
    return out


def _group_selector(request: PlacementRequest, name: str) -> dict[str, str]:
    for g in request.groups:
        if g.name == name:
            return dict(g.node_selector)
    return {}


def _scope_problems(
    snapshot: ClusterSnapshot, what: str, scope: Scope, pods: Sequence[PodPlacement]
) -> list[str]:
    nodes = sorted({p.node for p in pods if p.node in snapshot.nodes})
    if not nodes:
        return []
    if scope is Scope.NVLINK and len(nodes) == 1:
        islands = snapshot.shape(nodes[0]).islands
        gpus = {g for p in pods for g in p.gpus}
        if len(gpus) > 1 and not any(gpus <= isl for isl in islands):
            return [f"{what}: GPUs {sorted(gpus)} of {nodes[0]} are not one NVLink island"]
        return []
    if not holds(snapshot, nodes, scope):
        span = span_of(snapshot, nodes)
        return [f"{what}: spans a {span.name.lower()}, requires one {scope.name.lower()}"]
    return []


def refusal(
    snapshot: ClusterSnapshot,
    request: PlacementRequest,
    pods: Sequence[PodPlacement],
    *,
    policy: str,
    why: str,
    code: RejectionCode,
    prediction: Prediction | None = None,
) -> PlacementResult | None:
    """A "not placed" answer naming the broken rules when `pods` break any (None when they do
    not): a policy hands this out instead of a placement the user ruled out."""
    broken = violations(snapshot, request, pods, prediction=prediction)
    if not broken:
        return None
    return PlacementResult(
        False,
        policy,
        reason=f"{why}: {broken[0]}",
        rejections=tuple(Rejection("placement", code, b) for b in broken[:10]),
    )
