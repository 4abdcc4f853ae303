"""Where one replica goes: the bounded search behind the `gputopo` policy.

The search never enumerates nodes or GPUs; it works on node *classes* (shape + free mask, see
`gputopo.cluster`) and domains, from the snapshot's indexes:

1. One node (here). For every class that has room, the best GPUs inside such a node are one
   cached answer (`intranode.choose`), so the predicted time per class is exact. Among the
   classes with the best time, the node is chosen by damage (`plans.best_node`).
2. Several nodes (`gang.several_nodes`), for a replica of several pods: candidate domains
   estimated from their class counts, only the best turned into concrete nodes, wider scopes
   skipped once nothing wider can be faster.

Cost therefore grows with the number of classes and candidate domains, not with GPUs or nodes.
Every domain turned down is remembered with a reason for `Explain`. The vocabulary (`Slot`,
`Plan`, `Tried`, ...) lives in `plans` and is re-exported here for the policy and bundles.
"""

from __future__ import annotations

from gputopo.cluster import NodeClass
from gputopo.placement.gang import EXACT_PER_SCOPE, optimistic_seconds, several_nodes
from gputopo.placement.intranode import NodeChoice, choose, ring_alternatives
from gputopo.placement.objective import WIDTH, width
from gputopo.placement.plans import (
    ALTERNATIVE_BUCKETS,
    Plan,
    Slot,
    Tried,
    best_node,
    label,
    missed_preferences,
    node_plan,
    pods_on,
    slower_node_plans,
)
from gputopo.placement.predict import collective_seconds
from gputopo.placement.result import RejectionCode
from gputopo.placement.view import View
from gputopo.request import Scope

__all__ = [
    "ALTERNATIVE_BUCKETS",
    "EXACT_PER_SCOPE",
    "Plan",
    "Slot",
    "Tried",
    "best_node",
    "label",
    "missed_preferences",
    "node_plan",
    "optimistic_seconds",
    "pods_on",
    "search_slot",
    "slower_node_plans",
]


def _one_node(
    view: View,
    slot: Slot,
    *,
    island: bool,
    preferred: Scope | None,
    tried: Tried,
) -> Plan | None:
    group = slot.group
    need = slot.need
    scope, domain = view.root()
    times: dict[NodeClass, tuple[float, NodeChoice]] = {}
    most = 0
    for cls in view.classes(scope, domain):
        shape, mask = cls
        most = max(most, mask.bit_count())
        if mask.bit_count() < need:
            continue
        found = choose(shape, mask, need, island=island)
        if found is None:
            continue
        seconds = collective_seconds(group, ((found, 1),), nodes=1, nvlink=False)
        times[cls] = (seconds, found)
    if not times:
        if most >= need and island:
            tried.add(
                Scope.NODE,
                "*",
                RejectionCode.SCOPE,
                "no node has {} free GPUs in one NVLink island",
                need,
            )
        else:
            tried.add(
                Scope.NODE,
                "*",
                RejectionCode.INSUFFICIENT_GPUS,
                "no node has {} free GPUs (at most {})",
                need,
                most,
            )
        return None
    options = {c: (t, (f,)) for c, (t, f) in times.items()}
    plan = node_plan(view, [slot], options, preferred)
    if tried.alternatives:
        slower_node_plans(view, [slot], options, preferred, tried)
        if plan is not None:
            _other_gpus(view, slot, plan, island=island, preferred=preferred, tried=tried)
    return plan


def _other_gpus(
    view: View, slot: Slot, plan: Plan, *, island: bool, preferred: Scope | None, tried: Tried
) -> None:
    """Add plans on the same node with other GPUs (`intranode.ring_alternatives`): on a node
    with uneven links, the best pair for this replica can leave only a poor pair for the next
    replica of the request, where a slightly slower pair leaves a good one."""
    node = plan.pods[0].node
    cls = view.snapshot.node_class(node)
    for choice in ring_alternatives(cls[0], cls[1], slot.need, island=island):
        seconds = collective_seconds(slot.group, ((choice, 1),), nodes=1, nvlink=False)
        other = node_plan(view, [slot], {cls: (seconds, (choice,))}, preferred)
        if other is not None:
            tried.plans.append(other)


def search_slot(
    view: View,
    slot: Slot,
    *,
    limit: Scope | None,
    preferred: Scope | None,
    tried: Tried,
    nvlink: bool = False,
) -> Plan | None:
    """The best placement of one replica in the view, or None (reasons in `tried`).

    `limit` is the widest scope the replica may span (its group's required scope, narrowed by
    the request's when the replica is the whole request); `preferred` the request's preference;
    `nvlink` says an NVLink scope is required besides `limit` (a request that must stay in one
    NVLink domain with a group that must stay on one node): on one node, one NVLink island.
    """
    island = limit is Scope.NVLINK or slot.group.scope.required is Scope.NVLINK or nvlink
    best = _one_node(view, slot, island=island, preferred=preferred, tried=tried)
    if best is not None:
        tried.plans.append(best)
    if slot.group.pods > 1 and width(limit) >= WIDTH[Scope.NVLINK]:
        best = several_nodes(view, slot, limit, preferred=preferred, best=best, tried=tried)
    return best
