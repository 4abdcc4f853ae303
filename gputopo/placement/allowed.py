"""Nodes the caller allows: a group's pods run only on its `allowed_nodes`, whatever policy
places them.

The aggregator knows GPUs and links; only the caller knows which nodes the pods may run on
at all (the gang binder computes it with kube-scheduler's filters, `gputopo.fitness`). The
restriction is applied to the snapshot, before any policy runs, so every policy keeps it
without knowing of it:

1. A node no group allows shows no free GPU (an incremental change of the snapshot's index).
2. When groups allow different nodes, each such group also gets a private node label on the
   nodes it allows, and a node selector on that label (every policy already honours selectors).
3. After the policy ran, every pod is checked against its group's set (a policy that broke it
   is a bug: INTERNAL), and a refusal says how many nodes the caller excluded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.result import PlacementResult, Rejection, RejectionCode
from gputopo.request import PlacementRequest, RequestError

__all__ = ["Restriction", "check", "restrict"]

_LABEL = "allowed.gputopo.io/{group}"
_SHOWN = 5


@dataclasses.dataclass(frozen=True, slots=True)
class Restriction:
    """What `restrict` did: each restricted group's set, and how many nodes none allows."""

    allowed: Mapping[str, frozenset[str]]
    excluded: int
    total: int


def restrict(
    snapshot: ClusterSnapshot, request: PlacementRequest
) -> tuple[ClusterSnapshot, PlacementRequest, Restriction | None]:
    """The snapshot and request a policy sees (see the module docstring); raises
    `RequestError` naming the group when its set holds no node the snapshot knows."""
    allowed = {g.name: g.allowed_nodes for g in request.groups if g.allowed_nodes is not None}
    if not allowed:
        return snapshot, request, None
    known = snapshot.nodes.keys()
    for i, g in enumerate(request.groups):
        if g.allowed_nodes is not None and not g.allowed_nodes & known:
            names = sorted(g.allowed_nodes)
            shown = ", ".join(names[:_SHOWN]) + (" ..." if len(names) > _SHOWN else "")
            raise RequestError(
                f"groups[{i}].allowed_nodes", f"names no node the aggregator knows ({shown})"
            )
    sets = {g.allowed_nodes for g in request.groups}
    union: frozenset[str] | None = None
    if None not in sets:
        union = frozenset().union(*(s for s in sets if s is not None))
    per_group = len(sets) > 1
    states = []
    for name, given in snapshot.nodes.items():
        state = given
        if union is not None and name not in union:
            state = dataclasses.replace(state, free=frozenset())
        if per_group:
            extra = {
                _LABEL.format(group=group): "true"
                for group, nodes in allowed.items()
                if name in nodes
            }
            if extra:
                state = dataclasses.replace(
                    state, labels=MappingProxyType({**state.labels, **extra})
                )
        states.append(state)
    restricted = ClusterSnapshot(
        states, generation=snapshot.generation, previous=snapshot, now=snapshot.now
    )
    if per_group:
        groups = tuple(
            dataclasses.replace(
                g,
                node_selector=MappingProxyType(
                    {**g.node_selector, _LABEL.format(group=g.name): "true"}
                ),
            )
            if g.name in allowed
            else g
            for g in request.groups
        )
        request = dataclasses.replace(request, groups=groups)
    excluded = 0 if union is None else len(known - union)
    return restricted, request, Restriction(MappingProxyType(allowed), excluded, len(known))


def check(result: PlacementResult, restriction: Restriction | None) -> PlacementResult:
    """Hold the result to the caller's sets: a pod outside its group's set voids the result
    (INTERNAL); a refusal names the nodes the caller excluded."""
    if restriction is None:
        return result
    if result.placed:
        outside = [
            f"{p.group} pod {p.pod} on {p.node}"
            for p in result.pods
            if p.group in restriction.allowed and p.node not in restriction.allowed[p.group]
        ]
        if not outside:
            return result
        return PlacementResult(
            placed=False,
            policy=result.policy,
            reason="the policy placed pods outside the caller's allowed nodes",
            rejections=(
                Rejection("placement", RejectionCode.INTERNAL, "; ".join(outside[:_SHOWN])),
            ),
        )
    sizes = ", ".join(f"{g}: {len(s)}" for g, s in sorted(restriction.allowed.items()))
    note = Rejection(
        "allowed_nodes",
        RejectionCode.SELECTOR,
        f"{restriction.excluded} of {restriction.total} nodes excluded by the caller"
        f" (allowed nodes per group: {sizes})",
    )
    return dataclasses.replace(result, rejections=(note, *result.rejections))
