"""A replica of several pods across nodes: candidate domains, estimates from class counts, and
the nodes of the winner.

Candidate domains are the multi-node NVLink domains, leaves, spines, ... up to the required
scope, each kept only if its free GPUs suffice. Each is *estimated* from its class counts alone
(how many nodes of which class, their cached GPU choices, hence the exact predicted time and node
damage), then sorted; only the best estimates are turned into concrete nodes (`_pick_nodes`), at
most `EXACT_PER_SCOPE` per scope. A wider scope is skipped when the best plan so far already
reaches the optimistic bound of the predicted time (`optimistic_seconds`): a wider domain can
then only tie on time and lose on span.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gputopo import cost
from gputopo.cluster import NodeClass
from gputopo.links import LinkKind
from gputopo.placement.intranode import (
    NodeChoice,
    candidate_subsets,
    ceilings,
    choose,
    figures_of,
    network_front,
    pending_refinements,
)
from gputopo.placement.links import holds, span_of
from gputopo.placement.objective import WIDTH, damage, key, width
from gputopo.placement.plans import (
    Plan,
    Slot,
    Tried,
    cell_terms,
    label,
    missed_preferences,
    node_terms,
    pods_on,
)
from gputopo.placement.predict import collective_seconds, node_floor_seconds
from gputopo.placement.result import RejectionCode
from gputopo.placement.view import View
from gputopo.request import Group, Scope
from gputopo.shape import NodeShape

__all__ = [
    "EXACT_PER_SCOPE",
    "MAX_SPLITS",
    "SMALL_DOMAIN",
    "SMALL_GANG",
    "clear_caches",
    "optimistic_seconds",
    "several_nodes",
]

# Gangs of at most SMALL_GANG pods try every split over a domain's classes when the domain has at
# most SMALL_DOMAIN nodes with room and there are at most MAX_SPLITS splits (a split costs one
# cached intra-node choice per class and one prediction; a 100k-GPU cluster estimates hundreds of
# domains per decision, where the greedy fills must do).
SMALL_GANG = 8
SMALL_DOMAIN = 16
MAX_SPLITS = 400
# How many estimated domains per scope are turned into concrete nodes. Estimates are exact in
# time and node damage; what this bounds is the tie-break between equally good domains.
EXACT_PER_SCOPE = 8

_MULTI_SCOPES = (Scope.NVLINK, Scope.LEAF, Scope.SPINE, Scope.CORE, Scope.ZONE, Scope.CLUSTER)


@dataclass(frozen=True, slots=True)
class _Use:
    """Nodes of one class used by a gang: how many, and how many pods on each."""

    cls: NodeClass
    nodes: int
    pods: int
    choice: NodeChoice


@dataclass(frozen=True, slots=True)
class _Estimate:
    uses: tuple[_Use, ...]
    seconds: float
    node_terms: tuple[int, int]

    @property
    def nodes(self) -> int:
        return sum(u.nodes for u in self.uses)


def _fit(cls: NodeClass, per_pod: int) -> int:
    return cls[1].bit_count() // per_pod


def _gang_from(
    order: Sequence[tuple[NodeClass, int]], group: Group, nvlink: bool
) -> _Estimate | None:
    """Fill the gang's pods into nodes of the classes in this order (most pods per node first
    within the order); None when they do not hold it."""
    per_pod = group.gpus_per_pod
    remaining = group.pods
    uses: list[_Use] = []
    for cls, count in order:
        if remaining <= 0:
            break
        fit = _fit(cls, per_pod)
        if fit <= 0:
            continue
        full = min(count, remaining // fit)
        if full:
            found = choose(cls[0], cls[1], fit * per_pod, leaves_node=True)
            assert found is not None
            uses.append(_Use(cls, full, fit, found))
            remaining -= full * fit
        if remaining and count > full and remaining < fit:
            found = choose(cls[0], cls[1], remaining * per_pod, leaves_node=True)
            assert found is not None
            uses.append(_Use(cls, 1, remaining, found))
            remaining = 0
    if remaining > 0:
        return None
    nodes = sum(u.nodes for u in uses)
    uses = [
        _Use(u.cls, u.nodes, u.pods, _priced(u.cls, u.pods, group, nodes, nvlink)) for u in uses
    ]
    parts = [(u.choice, u.nodes) for u in uses]
    seconds = collective_seconds(group, parts, nodes=nodes, nvlink=nvlink)
    broken = sum(u.nodes for u in uses if u.cls[1] == u.cls[0].full_mask)
    leftover = sum(u.nodes * (u.cls[1].bit_count() - u.pods * per_pod) for u in uses)
    return _Estimate(tuple(uses), seconds, (broken, leftover))


def _estimate(
    classes: Mapping[NodeClass, int],
    group: Group,
    nvlink: bool,
    memo: dict[tuple[object, ...], _Estimate | None],
) -> _Estimate | None:
    """`_fill_estimate`, remembered per multiset of usable classes: racks and leaves with the
    same free nodes give the same answer, and most domains of a cluster repeat a few.

    The multiset is the one `_fill_estimate` can tell apart (`_signature`): a gang of p pods
    uses at most p nodes of a class, so racks with 7 and with 11 free trays are one question
    for a TP-8 on two of them."""
    sig = _signature(classes, group, nvlink)
    if sig not in memo:
        memo[sig] = _remembered(classes, group, nvlink, sig)
    return memo[sig]


def _signature(classes: Mapping[NodeClass, int], group: Group, nvlink: bool) -> tuple[object, ...]:
    """What `_fill_estimate` reads of a domain's class counts: each usable class's count capped
    at the gang's pods, and whether the usable nodes are few enough to try every split.

    The cap changes no answer: every fill takes at most `pods // fit` whole nodes of a class
    and one more, the feasibility and one-class tests compare `fit * count` with the pods, and
    a split puts a positive number of pods on each node it uses, so neither sees a count past
    the pods (`tests/placement/test_gang_estimates.py` checks it against the uncapped counts).
    """
    per_pod, pods = group.gpus_per_pod, group.pods
    usable = [(c, n) for c, n in classes.items() if _fit(c, per_pod) > 0]
    small = sum(n for _, n in usable) <= SMALL_DOMAIN
    return (nvlink, small, *sorted((id(c[0]), c[1], min(n, pods)) for c, n in usable))


# `_fill_estimate` across decisions, per (gang, nvlink, usable classes): consecutive decisions
# see mostly the same racks and leaves (each churn event changes a few nodes), and an estimate
# is a pure function of these. The shapes are in the key, so an id in it is never reused while
# the entry lives.
_FILLS: dict[tuple[object, ...], _Estimate | None] = {}
_MAX_FILLS = 1 << 14


def _remembered(
    classes: Mapping[NodeClass, int], group: Group, nvlink: bool, sig: tuple[object, ...]
) -> _Estimate | None:
    # what of the group an estimate reads (its pods, their size, and how they communicate)
    shapes = {id(c[0]): c[0] for c in classes}
    key = (
        group.pods,
        group.gpus_per_pod,
        group.pattern,
        group.message_bytes,
        sig,
        *shapes.values(),
    )
    if key in _FILLS:
        return _FILLS[key]
    found = _fill_estimate(classes, group, nvlink)
    # Kept only when no intra-node answer it used was cut short by the search budget (those are
    # refined later, and the estimate with them).
    if not pending_refinements():
        if len(_FILLS) >= _MAX_FILLS:
            _FILLS.clear()
        _FILLS[key] = found
    return found


def clear_caches() -> None:
    """Forget the estimates kept across decisions (`gputopo.placement.clear_caches`)."""
    _FILLS.clear()
    _on_more_nics.cache_clear()


def _fill_estimate(
    classes: Mapping[NodeClass, int], group: Group, nvlink: bool
) -> _Estimate | None:
    """The best of a few fills of a gang into a domain's classes.

    Orders tried: most pods per node first (fewest nodes, smallest shards on the network), best
    intra-node ring first, fastest network first, each breaking ties by the least damage; and
    every class alone that can hold the gang. A gang of at most `SMALL_GANG` pods in a domain
    of at most `SMALL_DOMAIN` nodes with room also tries every split over the classes (how many
    of each class's nodes hold 1, 2, ... pods) while there are at most `MAX_SPLITS` of them:
    with nodes of different sizes and networks, the best split can be none of the greedy fills
    (two pods on a free 8-GPU node and one on another, rather than one per node). The best
    predicted time wins, then node damage.
    """
    per_pod = group.gpus_per_pod
    usable = [(c, n) for c, n in classes.items() if _fit(c, per_pod) > 0]
    if sum(_fit(c, per_pod) * n for c, n in usable) < group.pods:
        return None

    def quality(c: NodeClass) -> tuple[float, float]:
        take = min(_fit(c, per_pod), group.pods) * per_pod
        found = choose(c[0], c[1], take, leaves_node=True)
        assert found is not None
        return (found.ring_gbps, found.min_nic_gbps)

    def harm(c: NodeClass) -> tuple[int, int]:
        return node_terms(c[0], c[1], min(_fit(c, per_pod), group.pods) * per_pod)

    orders = [
        sorted(usable, key=lambda cn: (-min(_fit(cn[0], per_pod), group.pods), harm(cn[0]))),
        sorted(usable, key=lambda cn: (-quality(cn[0])[0], -quality(cn[0])[1], harm(cn[0]))),
        sorted(usable, key=lambda cn: (-quality(cn[0])[1], -quality(cn[0])[0], harm(cn[0]))),
    ]
    orders += [[cn] for cn in usable if _fit(cn[0], per_pod) * cn[1] >= group.pods]
    candidates = [_gang_from(order, group, nvlink) for order in orders]
    if (
        group.pods <= SMALL_GANG
        and sum(n for _, n in usable) <= SMALL_DOMAIN
        and _count_splits(usable, per_pod, group.pods) <= MAX_SPLITS
    ):
        candidates += [_estimate_of(split, group, nvlink) for split in _splits(usable, group)]
    best: _Estimate | None = None
    for found in candidates:
        if found is None:
            continue
        if best is None or (cost.time_bucket(found.seconds), found.node_terms) < (
            cost.time_bucket(best.seconds),
            best.node_terms,
        ):
            best = found
    return best


def _estimate_of(
    split: Sequence[tuple[NodeClass, int, int]], group: Group, nvlink: bool
) -> _Estimate:
    """The estimate of one split: (class, pods per node, nodes) entries."""
    per_pod = group.gpus_per_pod
    nodes = sum(k for _, _, k in split)
    uses = [_Use(cls, k, q, _priced(cls, q, group, nodes, nvlink)) for cls, q, k in split]
    seconds = collective_seconds(
        group, [(u.choice, u.nodes) for u in uses], nodes=nodes, nvlink=nvlink
    )
    broken = sum(u.nodes for u in uses if u.cls[1] == u.cls[0].full_mask)
    leftover = sum(u.nodes * (u.cls[1].bit_count() - u.pods * per_pod) for u in uses)
    return _Estimate(tuple(uses), seconds, (broken, leftover))


def _priced(cls: NodeClass, pods: int, group: Group, nodes: int, nvlink: bool) -> NodeChoice:
    """The GPUs for `pods` pods on a node of this class when the gang spans `nodes` nodes: of
    `intranode.network_front`, the one whose own share of the collective is fastest (a better
    ring first on ties)."""
    options = network_front(cls[0], cls[1], pods * group.gpus_per_pod)
    if nodes <= 1:
        return options[0]
    if len(options) == 1:
        return _on_more_nics(cls[0], cls[1], options[0])
    ranks = group.gpus_per_replica
    return _on_more_nics(
        cls[0],
        cls[1],
        min(
            options,
            key=lambda c: cost.time_bucket(
                node_floor_seconds(group, c, ranks=ranks, nodes=nodes, nvlink=nvlink)
            ),
        ),
    )


def _nic_count(choice: NodeChoice) -> int:
    return len({n for n in choice.nic_names if n})


@lru_cache(maxsize=1 << 14)
def _on_more_nics(shape: NodeShape, mask: int, picked: NodeChoice) -> NodeChoice:
    """`picked`, or GPUs of the same node that are as good on every figure the cost model
    prices (ring bandwidth, slowest NIC share, NUMA nodes) and sit on more distinct NICs.

    The model prices a node's network by its slowest GPU's share, so four GPUs packed on two
    shared NICs tie with four GPUs over three or four NICs; NCCL spreads a gang's inter-node
    rings over every NIC its GPUs have, so more NICs carry more (issue 26's second quality
    case). Only for GPUs that leave the node; the first such subset in scoring order wins.
    """
    most = _nic_count(picked)
    numa = len({shape.numa[g] for g in picked.gpus})
    best = picked
    pool = tuple(g for g in range(shape.gpu_count) if mask >> g & 1)
    for subset in candidate_subsets(shape, pool, len(picked.gpus)):
        other = figures_of(shape, subset)
        if (
            _nic_count(other) > most
            and other.ring_gbps >= picked.ring_gbps
            and other.min_nic_gbps >= picked.min_nic_gbps
            and len({shape.numa[g] for g in subset}) <= numa
        ):
            best, most = other, _nic_count(other)
    return best


def _shapes(total: int, parts: int, largest: int) -> list[list[int]]:
    """Multisets (non-increasing lists) of at most `parts` pod counts in 1..largest summing to
    `total`: how one class's nodes can share `total` pods."""
    if total == 0:
        return [[]]
    if parts == 0 or largest == 0:
        return []
    out: list[list[int]] = []
    for first in range(min(largest, total), 0, -1):
        out.extend([first, *rest] for rest in _shapes(total - first, parts - 1, first))
    return out


def _count_splits(usable: Sequence[tuple[NodeClass, int]], per_pod: int, pods: int) -> int:
    """How many splits `_splits` yields (counted without building them)."""
    ways = [1] + [0] * pods
    for cls, count in usable:
        fit = _fit(cls, per_pod)
        by_total = [len(_shapes(t, count, fit)) for t in range(pods + 1)]
        ways = [sum(ways[t - k] * by_total[k] for k in range(t + 1)) for t in range(pods + 1)]
    return ways[pods]


def _splits(
    usable: Sequence[tuple[NodeClass, int]], group: Group
) -> Iterable[list[tuple[NodeClass, int, int]]]:
    """Every way to spread the gang's pods over the classes' nodes, as (class, pods per node,
    nodes) entries."""
    per_pod = group.gpus_per_pod

    def walk(
        i: int, left: int, acc: list[tuple[NodeClass, int, int]]
    ) -> Iterable[list[tuple[NodeClass, int, int]]]:
        if left == 0:
            yield acc
            return
        if i == len(usable):
            return
        cls, count = usable[i]
        for total in range(min(left, _fit(cls, per_pod) * count), -1, -1):
            for shape in _shapes(total, count, _fit(cls, per_pod)):
                entries = [(cls, q, shape.count(q)) for q in sorted(set(shape), reverse=True)]
                yield from walk(i + 1, left - total, acc + entries)

    return walk(0, group.pods, [])


def _pick_nodes(view: View, scope: Scope, domain: str, est: _Estimate) -> list[tuple[str, _Use]]:
    """Concrete nodes for an estimate: cells of the domain in damage order (not whole-free
    first, then fewest free), nodes by name inside a cell."""
    snapshot = view.snapshot
    wanted: dict[NodeClass, int] = {}
    for u in est.uses:
        wanted[u.cls] = wanted.get(u.cls, 0) + u.nodes
    cells = view.cells_of_classes(scope, domain, wanted.keys())
    ordered = sorted(cells, key=lambda cb: (cell_terms(snapshot, cb[0], 0), cb[0]))
    chosen: dict[NodeClass, list[str]] = {c: [] for c in wanted}
    for _, by_class in ordered:
        for cls, names in by_class.items():
            short = wanted[cls] - len(chosen[cls])
            if short > 0:
                chosen[cls].extend(names[:short])
    out: list[tuple[str, _Use]] = []
    for u in est.uses:
        take = chosen[u.cls][: u.nodes]
        del chosen[u.cls][: u.nodes]
        if len(take) < u.nodes:
            raise AssertionError(f"index and nodes disagree in {label(scope, domain)}")
        out.extend((n, u) for n in take)
    order = {cell: i for i, (cell, _) in enumerate(ordered)}
    out.sort(key=lambda nu: (-nu[1].pods, order[snapshot.cell_of(nu[0])], nu[0]))
    return out


def _gang_plan(
    view: View,
    slot: Slot,
    scope: Scope,
    domain: str,
    est: _Estimate,
    *,
    preferred: Scope | None,
) -> Plan:
    snapshot = view.snapshot
    picked = _pick_nodes(view, scope, domain, est)
    nodes = [n for n, _ in picked]
    span = span_of(snapshot, nodes)
    seconds = est.seconds
    if span is Scope.NVLINK and scope is not Scope.NVLINK:  # all landed in one NVLink domain
        parts = [(u.choice, u.nodes) for u in est.uses]
        seconds = collective_seconds(slot.group, parts, nodes=len(nodes), nvlink=True)
    pods = pods_on(slot.group, slot.replica, [(n, u.choice.gpus) for n, u in picked])
    taken = {n: u.pods * slot.group.gpus_per_pod for n, u in picked}
    harm = damage(snapshot, taken)
    missed = missed_preferences([slot], span, {}, preferred)
    return Plan(
        tuple(pods),
        key(missed=missed, seconds=seconds, spread=0, span=span, harm=harm, names=sorted(nodes)),
        seconds,
        label(scope, domain),
    )


def optimistic_seconds(view: View, group: Group, *, nvlink: bool) -> float:
    """A lower bound on a gang's predicted time on several nodes anywhere in the view.

    The model's time is never below any one node's own terms (`predict.node_floor_seconds`),
    in particular the node holding the fewest pods, q <= pods / 2 of them, on at least
    max(2, ceil(pods / most)) nodes (`most`: the most pods any class holds). For every such q
    the bound takes a node with the best figures any class can give q pods, each maximised on
    its own (`intranode.ceilings`: the best ring, the best network share), and the best NVLink
    rate of any free GPU.
    Slower links or more nodes never help in the model, so the minimum over q bounds every
    multi-node placement from below, whether the gang's nodes hold equal or uneven shares.
    """
    scope, domain = view.root()
    per_pod = group.gpus_per_pod
    classes = [c for c in view.classes(scope, domain) if _fit(c, per_pod) > 0]
    most = max((_fit(c, per_pod) for c in classes), default=0)
    if group.pods < 2 or most == 0:
        return math.inf
    nodes = max(2, -(-group.pods // most))
    best = math.inf
    for q in range(1, min(most, group.pods // 2) + 1):
        gpus = q * per_pod
        ring, nic, nvl = 0.0, 0.0, 0.0
        for c in classes:
            if _fit(c, per_pod) < q:
                continue
            best_ring, best_share = ceilings(c[0], c[1], gpus)
            ring = max(ring, best_ring)
            nic = max(nic, best_share)
            nvl = max(nvl, *(c[0].nvlink_gbps[g] for g in _bits(c[1])))
        ideal = NodeChoice(
            tuple(range(gpus)), ring, LinkKind.NVLINK, (nic,) * gpus, ("",) * gpus, nvl
        )
        best = min(
            best,
            node_floor_seconds(
                group, ideal, ranks=group.gpus_per_replica, nodes=nodes, nvlink=nvlink
            ),
        )
    return best


def _bits(mask: int) -> list[int]:
    return [g for g in range(mask.bit_length()) if mask >> g & 1]


def _domains(view: View, scope: Scope) -> Iterable[str]:
    root_scope, root = view.root()
    if scope is Scope.CLUSTER:
        return ("cluster",) if root_scope is Scope.CLUSTER else ()
    if WIDTH[scope] > WIDTH[root_scope]:
        return ()
    if scope is root_scope:
        return (root,)
    return (d for d in view.snapshot.free_domains(scope) if view.contains(scope, d))


def _candidates(view: View, scope: Scope, limit: Scope | None) -> Iterable[tuple[str, View]]:
    """The domains of a scope to try, each with the view of the nodes a replica may use there.

    A multi-node NVLink domain that straddles domains of the required scope (a rack whose trays
    hang off two leaves) is tried once per part: its nodes in one leaf at a time.
    """
    snapshot = view.snapshot
    for domain in _domains(view, scope):
        if (
            limit is None
            or scope is not Scope.NVLINK
            or limit in (Scope.NODE, Scope.NVLINK)
            or holds(snapshot, snapshot.domains(scope).get(domain, ()), limit)
        ):
            yield domain, view
            continue
        parts: dict[str, set[str]] = {}
        for name in snapshot.domains(scope).get(domain, ()):
            outer = snapshot.domain_of(name, limit)
            if outer and (view.allowed is None or name in view.allowed):
                parts.setdefault(outer, set()).add(name)
        for _, names in sorted(parts.items()):
            yield (
                domain,
                View(
                    snapshot, allowed=frozenset(names), excluded=view.excluded, within=view.within
                ),
            )


def several_nodes(
    view: View,
    slot: Slot,
    limit: Scope | None,
    *,
    preferred: Scope | None,
    best: Plan | None,
    tried: Tried,
) -> Plan | None:
    group = slot.group
    need = slot.need
    bounds: dict[bool, float] = {}
    memo: dict[tuple[object, ...], _Estimate | None] = {}
    for scope in _MULTI_SCOPES:
        if WIDTH[scope] > width(limit):
            break
        nvlink = scope is Scope.NVLINK
        if best is not None and not tried.explore:
            if nvlink not in bounds:
                bounds[nvlink] = optimistic_seconds(view, group, nvlink=nvlink)
            if cost.time_bucket(bounds[nvlink]) >= best.key.time:
                # A domain of this scope (or a wider one, for the network) can at best tie on
                # time, and then loses on span: nothing to gain here.
                if nvlink:
                    continue
                break
        estimates: list[tuple[tuple[object, ...], str, _Estimate, View]] = []
        for domain, part in _candidates(view, scope, limit):
            free = part.free(scope, domain)
            if free < need:
                tried.add(
                    scope,
                    domain,
                    RejectionCode.INSUFFICIENT_GPUS,
                    "{} free GPUs, {} needed",
                    free,
                    need,
                )
                continue
            est = _estimate(part.classes(scope, domain), group, nvlink, memo)
            if est is None:
                tried.add(
                    scope,
                    domain,
                    RejectionCode.FRAGMENTED,
                    "{} free GPUs, but not {} pods of {} GPUs on single nodes",
                    free,
                    group.pods,
                    group.gpus_per_pod,
                )
                continue
            rough = (
                cost.time_bucket(est.seconds),
                est.node_terms,
                view.snapshot.domain_free(scope, domain) - need,
                domain,
            )
            estimates.append((rough, domain, est, part))
        estimates.sort(key=lambda e: e[0])
        for _, domain, est, part in estimates[:EXACT_PER_SCOPE]:
            plan = _gang_plan(part, slot, scope, domain, est, preferred=preferred)
            tried.plans.append(plan)
            if best is None or plan.key < best.key:
                best = plan
    return best
