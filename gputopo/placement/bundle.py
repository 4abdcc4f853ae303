"""Bundles: replicas joined by bandwidth edges (a prefill and its decode) placed as one unit.

An edge's bandwidth depends on where both ends land, so the replicas it joins are decided
together:

1. On one node: the GPUs of the node are split between the replicas (`split`: every way to cut
   the free GPUs into the replicas' sizes, scored on unmet edges, then predicted time, then what
   stays free; cached per node shape, free mask and bundle shape), and the node is chosen by
   damage among the equally fast classes, as for a single replica. On a PCIe server this keeps a
   prefill and its decode under one root complex, and the two prefills on different ones.
2. Across nodes: in each candidate domain (NVLink domains first, then leaves, ...), the replicas
   are placed one after another by the single-replica search restricted to that domain, and the
   edges are checked on the result. A replica joined to one already placed also tries its
   candidate nodes with GPUs spread over more NICs (`intranode.network_front`): a split over
   two nodes can then meet a KV need that only a same-node split met before. At most
   `search.EXACT_PER_SCOPE` domains per scope are tried, tightest fit first; wider scopes only
   while they could still be faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gputopo import cost
from gputopo.cluster import ClusterSnapshot, NodeClass, NodeShape
from gputopo.placement.intranode import (
    NodeChoice,
    candidate_subsets,
    choose,
    figures_of,
    network_front,
)
from gputopo.placement.links import holds, span_of
from gputopo.placement.objective import WIDTH, damage, key, width
from gputopo.placement.predict import NodePart, collective_seconds, edge_gbps, parts_of
from gputopo.placement.result import RejectionCode
from gputopo.placement.search import (
    EXACT_PER_SCOPE,
    Plan,
    Slot,
    Tried,
    label,
    missed_preferences,
    node_plan,
    pods_on,
    search_slot,
    slower_node_plans,
)
from gputopo.placement.view import View
from gputopo.request import Group, Pattern, Scope

__all__ = ["BundleEdge", "fastest_pair_gbps", "search_bundle", "single_node_seconds", "split"]

# Per slot, at most this many GPU subsets are tried when splitting a node (the best by ring).
_SUBSETS_PER_SLOT = 24
# Inside a domain, replicas that do not fit after the others are retried first this many times.
_REORDERS = 2
# Inside a domain, how many of the first replica's best plans each start a pass.
_STARTS = 3
# Per scope, how many more domains are tried once one holds the bundle.
_AFTER_FIRST = 2


@dataclass(frozen=True, slots=True)
class BundleEdge:
    """An edge between two slots of a bundle (indices into the bundle's slots)."""

    source: int
    target: int
    need_gbps: float
    transfer_bytes: int


# What `split` needs to know of a slot: (pattern, message bytes, pods, GPUs per pod, island).
_SlotSig = tuple[Pattern, int, int, int, bool]


def _group_of(sig: _SlotSig) -> Group:
    pattern, message, pods, per_pod, _ = sig
    return Group("x", pods=pods, gpus_per_pod=per_pod, pattern=pattern, message_bytes=message)


def split(
    shape: NodeShape,
    mask: int,
    slots: tuple[_SlotSig, ...],
    edges: tuple[BundleEdge, ...],
) -> tuple[tuple[NodeChoice, ...], float] | None:
    """The best way to give each slot its GPUs on one node, and the predicted seconds; None when
    the node cannot hold the bundle with every edge met."""
    if mask.bit_count() < sum(s[2] * s[3] for s in slots):
        return None
    return _split(shape, mask, slots, edges)


@lru_cache(maxsize=1 << 14)
def _split(
    shape: NodeShape,
    mask: int,
    slots: tuple[_SlotSig, ...],
    edges: tuple[BundleEdge, ...],
) -> tuple[tuple[NodeChoice, ...], float] | None:
    free = tuple(g for g in range(shape.gpu_count) if mask >> g & 1)
    groups = [_group_of(s) for s in slots]
    best: tuple[tuple[object, ...], tuple[NodeChoice, ...], float] | None = None
    for assignment in _assignments(shape, free, slots):
        choices = tuple(figures_of(shape, gpus) for gpus in assignment)
        seconds = sum(
            collective_seconds(g, ((c, 1),), nodes=1, nvlink=False)
            for g, c in zip(groups, choices, strict=True)
        )
        unmet = 0
        for e in edges:
            a, b = choices[e.source].gpus, choices[e.target].gpus
            gbps = sum(shape.bw[x][y] for x, y in zip(a[: len(b)], b[: len(a)], strict=True))
            if gbps < e.need_gbps:
                unmet += 1
            if e.transfer_bytes:
                seconds += cost.transfer_seconds(size_bytes=e.transfer_bytes, gbps=gbps)
        if unmet:
            continue
        used = {g for gpus in assignment for g in gpus}
        rest = tuple(g for g in free if g not in used)
        rest_ring = figures_of(shape, rest).ring_gbps if len(rest) > 1 else math.inf
        score = (
            cost.time_bucket(seconds),
            cost.time_bucket(1 / rest_ring) if 0 < rest_ring < math.inf else 0,
            assignment,
        )
        if best is None or score < best[0]:
            best = (score, choices, seconds)
    return None if best is None else (best[1], best[2])


def _assignments(
    shape: NodeShape, free: tuple[int, ...], slots: tuple[_SlotSig, ...]
) -> list[tuple[tuple[int, ...], ...]]:
    out: list[tuple[tuple[int, ...], ...]] = []

    def walk(i: int, left: tuple[int, ...], acc: tuple[tuple[int, ...], ...]) -> None:
        if i == len(slots):
            out.append(acc)
            return
        _, _, pods, per_pod, island = slots[i]
        count = pods * per_pod
        subsets = candidate_subsets(shape, left, count)
        if island:
            subsets = [s for s in subsets if any(set(s) <= isl for isl in shape.islands)]
        if len(subsets) > _SUBSETS_PER_SLOT:
            subsets.sort(key=lambda s: (-figures_of(shape, s).ring_gbps, s))
            subsets = subsets[:_SUBSETS_PER_SLOT]
        for s in subsets:
            walk(i + 1, tuple(g for g in left if g not in s), (*acc, s))

    walk(0, free, ())
    return out


def _signature(slot: Slot) -> _SlotSig:
    g = slot.group
    return (
        g.pattern,
        g.message_bytes,
        g.pods,
        g.gpus_per_pod,
        g.scope.required is Scope.NVLINK,
    )


def _one_node(
    view: View,
    slots: Sequence[Slot],
    edges: tuple[BundleEdge, ...],
    *,
    preferred: Scope | None,
    tried: Tried,
) -> Plan | None:
    spread = [s.group.name for s in slots if s.group.spread is not None and s.group.spread.required]
    if len(spread) != len(set(spread)):
        tried.add(
            Scope.NODE, "*", RejectionCode.SPREAD, "replicas of one group must not share a node"
        )
        return None
    sigs = tuple(_signature(s) for s in slots)
    need = sum(s.need for s in slots)
    scope, domain = view.root()
    found: dict[NodeClass, tuple[float, tuple[NodeChoice, ...]]] = {}
    roomy = 0
    for cls in view.classes(scope, domain):
        shape, mask = cls
        if mask.bit_count() < need:
            continue
        roomy += 1
        got = split(shape, mask, sigs, edges)
        if got is not None:
            found[cls] = (got[1], got[0])
    if not found:
        if roomy:
            tried.add(
                Scope.NODE,
                "*",
                RejectionCode.BANDWIDTH,
                "no node with {} free GPUs meets the bundle's edges",
                need,
            )
        else:
            tried.add(
                Scope.NODE, "*", RejectionCode.INSUFFICIENT_GPUS, "no node has {} free GPUs", need
            )
        return None
    if tried.alternatives:
        slower_node_plans(view, slots, found, preferred, tried)
    return node_plan(view, slots, found, preferred)


def _in_domain(
    view: View,
    scope: Scope,
    domain: str,
    slots: Sequence[Slot],
    edges: tuple[BundleEdge, ...],
    *,
    preferred: Scope | None,
    tried: Tried,
) -> Plan | None:
    """The bundle's replicas one after another inside one domain, edges checked on the result.

    The first replica's few best plans each start a pass (what suits it best can leave the
    others worse off); a replica that finds no room is moved to the front and the passes rerun.
    """
    order = sorted(range(len(slots)), key=lambda i: (-slots[i].need, i))
    best: Plan | None = None
    why = "room"
    for _ in range(_REORDERS + 1):
        failed: int | None = None
        for start in _starts(view, scope, domain, slots[order[0]]):
            placed, missing, reason = _sequentially(
                view, scope, domain, slots, order=order, start=start, edges=edges
            )
            if missing is not None:
                if failed is None:
                    failed, why = missing, reason
                continue
            plan = _checked(
                view,
                scope,
                domain,
                slots,
                edges=edges,
                placed=placed,
                preferred=preferred,
                tried=tried,
            )
            if plan is not None and (best is None or plan.key < best.key):
                best = plan
        if best is not None:
            return best
        if failed is None:
            failed = order[0]
        # An earlier replica took the room this one needed: let this one's group go first.
        group = slots[failed].group.name
        first = [i for i in order if slots[i].group.name == group]
        again = first + [i for i in order if i not in first]
        if again == order:
            break
        order = again
    if why == "bandwidth":
        tried.add(
            scope,
            domain,
            RejectionCode.BANDWIDTH,
            "no placement of the bundle here meets its edges",
        )
    else:
        tried.add(
            scope, domain, RejectionCode.FRAGMENTED, "the bundle's replicas do not fit side by side"
        )
    return None


def _starts(view: View, scope: Scope, domain: str, slot: Slot) -> list[Plan]:
    """The first replica's best plans in the domain, distinct node sets, best first."""
    pool = Tried(alternatives=True)
    sub = view.for_group(slot.group.name, within=(scope, domain))
    search_slot(sub, slot, limit=slot.group.scope.required, preferred=None, tried=pool)
    return pool.distinct_plans(_STARTS)


def _checked(
    view: View,
    scope: Scope,
    domain: str,
    slots: Sequence[Slot],
    *,
    edges: tuple[BundleEdge, ...],
    placed: dict[int, Plan],
    preferred: Scope | None,
    tried: Tried,
) -> Plan | None:
    """The bundle's plan from its replicas' plans, or None when an edge misses its need."""
    snapshot = view.snapshot
    parts: dict[int, tuple[NodePart, ...]] = {
        i: parts_of(snapshot, p.pods) for i, p in placed.items()
    }
    seconds = sum(p.seconds for p in placed.values())
    for e in edges:
        gbps = edge_gbps(snapshot, parts[e.source], parts[e.target])
        if gbps < e.need_gbps:
            tried.add(
                scope,
                domain,
                RejectionCode.BANDWIDTH,
                "edge {}->{} gets {:.0f} GB/s, needs {:.0f}",
                slots[e.source].label,
                slots[e.target].label,
                gbps,
                e.need_gbps,
            )
            return None
        if e.transfer_bytes:
            seconds += cost.transfer_seconds(size_bytes=e.transfer_bytes, gbps=gbps)
    pods = tuple(p for i in sorted(placed) for p in placed[i].pods)
    taken_count: dict[str, int] = {}
    for p in pods:
        taken_count[p.node] = taken_count.get(p.node, 0) + len(p.gpus)
    nodes = sorted(taken_count)
    span = span_of(snapshot, nodes)
    spans = {
        slots[i].label: span_of(snapshot, sorted({p.node for p in plan.pods}))
        for i, plan in placed.items()
    }
    missed = missed_preferences(slots, span, spans, preferred)
    return Plan(
        pods,
        key(
            missed=missed,
            seconds=seconds,
            spread=0,
            span=span,
            harm=damage(snapshot, taken_count),
            names=nodes,
        ),
        seconds,
        label(scope, domain),
    )


def _sequentially(
    view: View,
    scope: Scope,
    domain: str,
    slots: Sequence[Slot],
    *,
    order: Sequence[int],
    start: Plan,
    edges: tuple[BundleEdge, ...] = (),
) -> tuple[dict[int, Plan], int | None, str]:
    """Place the slots one after another inside one domain, the first as `start` says; the
    plans so far, the index of the slot that did not fit (None when all did) and why
    ("room", or "bandwidth" when only its edges ruled out every candidate).

    A slot joined by edges to slots already placed takes the best of its candidate plans that
    meets those edges; its partners' own nodes are candidates too, so a decode can sit next to
    its prefill on a node the search alone would not pick.
    """
    snapshot = view.snapshot
    working = snapshot.with_free({n: snapshot.node(n).free - g for n, g in start.taken().items()})
    placed: dict[int, Plan] = {order[0]: start}
    for i in order[1:]:
        slot = slots[i]
        spread = slot.group.spread
        away: frozenset[str] = frozenset()
        if spread is not None and spread.required:
            away = frozenset(
                n
                for p in placed.values()
                for n in _spread_members(snapshot, p, slot.group.name, spread.across)
            )
        sub = view.for_group(
            slot.group.name, snapshot=working, within=(scope, domain), excluded=away
        )
        links = [
            e
            for e in edges
            if i in (e.source, e.target) and {e.source, e.target} - {i} <= placed.keys()
        ]
        inner = Tried(alternatives=bool(links), wide=bool(links))
        plan = search_slot(sub, slot, limit=slot.group.scope.required, preferred=None, tried=inner)
        if plan is None:
            return placed, i, "room"
        if links:
            plan = _meeting(snapshot, sub, slot, i, links=links, placed=placed, tried=inner)
            if plan is None:
                return placed, i, "bandwidth"
        placed[i] = plan
        taken = plan.taken()
        working = working.with_free({n: working.node(n).free - g for n, g in taken.items()})
    return placed, None, ""


def _meeting(
    snapshot: ClusterSnapshot,
    view: View,
    slot: Slot,
    index: int,
    *,
    links: Sequence[BundleEdge],
    placed: dict[int, Plan],
    tried: Tried,
) -> Plan | None:
    """The best candidate plan of a slot that meets its edges to the placed slots: by its own
    time plus its edges' transfer times (a decode node with a slower ring but a faster NIC to
    its prefill can win), then by its key."""
    # Each partner node alone, then each partner's whole node set: a slot too big for the free
    # GPUs of any one partner node can still sit beside its partner's shards on several.
    groups = [frozenset(placed[e.target if e.source == index else e.source].taken()) for e in links]
    near_sets: list[frozenset[str]] = [frozenset({n}) for n in sorted(frozenset().union(*groups))]
    near_sets += [g for g in dict.fromkeys(groups) if len(g) > 1]
    candidates = list(tried.plans)
    for nodes in near_sets:
        usable = frozenset(n for n in nodes if view.ok(n))
        if usable:
            near = View(view.snapshot, allowed=usable, excluded=view.excluded)
            found = search_slot(
                near, slot, limit=slot.group.scope.required, preferred=None, tried=Tried()
            )
            if found is not None:
                candidates.append(found)
    candidates += [v for plan in candidates for v in _nic_variants(view, slot, plan)]
    partners = {
        j: parts_of(snapshot, placed[j].pods)
        for e in links
        for j in (e.source, e.target)
        if j != index
    }
    best: tuple[tuple[object, ...], Plan] | None = None
    for plan in candidates:
        mine = parts_of(snapshot, plan.pods)
        seconds = plan.seconds
        for e in links:
            gbps = edge_gbps(
                snapshot,
                mine if e.source == index else partners[e.source],
                mine if e.target == index else partners[e.target],
            )
            if gbps < e.need_gbps:
                break
            if e.transfer_bytes:
                seconds += cost.transfer_seconds(size_bytes=e.transfer_bytes, gbps=gbps)
        else:
            rank = (plan.key.missed, cost.time_bucket(seconds), plan.key)
            if best is None or rank < best[0]:
                best = (rank, plan)
    return None if best is None else best[1]


def _nic_variants(view: View, slot: Slot, plan: Plan) -> list[Plan]:
    """The plan's node with other GPUs, each reaching the network better
    (`intranode.network_front`).

    A replica's GPUs are chosen for its own ring, which on a node with one NIC per GPU pair
    can put two of them on one NIC; across nodes, a partner's edge gets only that NIC's share
    per shard. These variants let the edge check see the same node with its shards spread over
    more NICs, so a split over two nodes can meet a KV need the same-node split was taken for.
    """
    if not plan.pods or slot.group.scope.required is Scope.NVLINK:
        return []
    node = plan.pods[0].node
    if any(p.node != node for p in plan.pods):
        return []
    shape, mask = view.snapshot.node_class(node)
    if mask.bit_count() <= slot.need:
        return []  # no other GPUs to choose: the plan's are every free one (a whole GB200 tray)
    gpus = {g for p in plan.pods for g in p.gpus}
    out = []
    for choice in network_front(shape, mask, slot.need):
        if set(choice.gpus) == gpus:
            continue
        seconds = collective_seconds(slot.group, ((choice, 1),), nodes=1, nvlink=False)
        pods = tuple(pods_on(slot.group, slot.replica, [(node, choice.gpus)]))
        out.append(
            Plan(pods, plan.key._replace(time=cost.time_bucket(seconds)), seconds, plan.domain)
        )
    return out


def _spread_members(snapshot: ClusterSnapshot, plan: Plan, group: str, across: Scope) -> set[str]:
    """The nodes of the `across` domains a plan's pods of `group` occupy."""
    out: set[str] = set()
    for p in plan.pods:
        if p.group != group:
            continue
        domain = snapshot.domain_of(p.node, across)
        if across is Scope.NODE or not domain:
            out.add(p.node)
        else:
            out.update(snapshot.domains(across).get(domain, (p.node,)))
    return out


def _inside_limit(view: View, scope: Scope, domain: str, limit: Scope | None) -> bool:
    """Whether a candidate domain lies in one domain of the bundle's required scope (multi-node
    NVLink domains may straddle leaves)."""
    if limit is None or scope is not Scope.NVLINK or limit in (Scope.NODE, Scope.NVLINK):
        return True
    return holds(view.snapshot, view.snapshot.domains(scope).get(domain, ()), limit)


def search_bundle(
    view: View,
    slots: Sequence[Slot],
    edges: tuple[BundleEdge, ...],
    *,
    limit: Scope | None,
    preferred: Scope | None,
    tried: Tried,
    bound: Callable[[], float],
) -> Plan | None:
    """The best placement of a bundle in the view, or None (reasons in `tried`).

    `limit` bounds the bundle's span (the request's required scope when the bundle is the whole
    request); `bound()` is a lower bound on the bundle's predicted seconds, used to stop
    widening the search once nothing wider can be faster.
    """
    best = _one_node(view, slots, edges, preferred=preferred, tried=tried)
    if best is not None:
        tried.plans.append(best)
    need = sum(s.need for s in slots)
    root_scope, root = view.root()
    floor: float | None = None
    for scope in (Scope.NVLINK, Scope.LEAF, Scope.SPINE, Scope.CORE, Scope.ZONE, Scope.CLUSTER):
        if WIDTH[scope] > min(width(limit), WIDTH[root_scope]):
            break
        if best is not None and not tried.explore:
            if floor is None:
                floor = bound()
            if cost.time_bucket(floor) >= best.key.time:
                break
        if scope is root_scope:
            domains: Sequence[str] = (root,)
        elif scope is Scope.CLUSTER:
            domains = ("cluster",)
        else:
            domains = [d for d in view.snapshot.free_domains(scope) if view.contains(scope, d)]
        roomy = []
        loose = view.loosest()
        for d in domains:
            if not _inside_limit(view, scope, d, limit):
                continue
            free = loose.free(scope, d)
            if free < need:
                tried.add(
                    scope, d, RejectionCode.INSUFFICIENT_GPUS, "{} free GPUs, {} needed", free, need
                )
            else:
                roomy.append((free, d))
        roomy.sort()
        after_first = 0
        for _, d in roomy[:EXACT_PER_SCOPE]:
            plan = _in_domain(view, scope, d, slots, edges, preferred=preferred, tried=tried)
            if plan is None:
                continue
            tried.plans.append(plan)
            if best is None or plan.key < best.key:
                best = plan
            after_first += 1
            if after_first > _AFTER_FIRST:
                break  # domains come tightest first: later ones only break ties
    return best


def single_node_seconds(view: View, slot: Slot) -> float:
    """The fastest a slot can be on any one node of the view (inf when none holds it)."""
    scope, domain = view.root()
    best = math.inf
    for shape, mask in view.classes(scope, domain):
        found = choose(shape, mask, slot.need, island=slot.group.scope.required is Scope.NVLINK)
        if found is not None:
            best = min(best, collective_seconds(slot.group, ((found, 1),), nodes=1, nvlink=False))
    return best


def fastest_pair_gbps(view: View) -> float:
    """The most any two GPUs of the view reach (a link in a node, or multi-node NVLink)."""
    scope, domain = view.root()
    best = 0.0
    for shape in {cls[0] for cls in view.classes(scope, domain)}:
        best = max(best, *(max(row, default=0.0) for row in shape.bw), *shape.nvlink_gbps, 0.0)
    return best
