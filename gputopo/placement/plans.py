"""The vocabulary of the engine's search: slots, plans, what was tried, and the node a plan
lands on when it fits one node.

A *slot* is one replica of one group; a *plan* a concrete placement of one or more slots with its
comparison key (`objective`); `Tried` remembers the domains turned down (for Explain) and the
plans built on the way (alternatives for callers that want more than the best). `best_node`
picks, among nodes of equally fast classes, the least damaging one from per-cell and per-class
terms, without visiting nodes one by one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gputopo import cost
from gputopo.cluster import Cell, ClusterSnapshot, NodeClass
from gputopo.domains import domain_name
from gputopo.placement.intranode import NodeChoice
from gputopo.placement.objective import WIDTH, Damage, Key, key
from gputopo.placement.result import PodPlacement, Rejection, RejectionCode
from gputopo.placement.view import View
from gputopo.request import Group, Scope
from gputopo.shape import NodeShape

__all__ = [
    "ALTERNATIVE_BUCKETS",
    "Plan",
    "Slot",
    "Tried",
    "best_node",
    "cell_terms",
    "label",
    "missed_preferences",
    "node_plan",
    "node_terms",
    "pods_on",
    "slower_node_plans",
]

# With alternatives asked for, one-node searches also plan the best node of this many of the
# fastest time buckets.
ALTERNATIVE_BUCKETS = 3


@dataclass(frozen=True, slots=True)
class Slot:
    """One replica of one group."""

    group: Group
    replica: int

    @property
    def need(self) -> int:
        """GPUs the replica needs."""
        return self.group.gpus_per_replica

    @property
    def label(self) -> str:
        """`group[replica]`."""
        return f"{self.group.name}[{self.replica}]"


@dataclass(frozen=True, slots=True)
class Plan:
    """A concrete placement of a unit and its comparison key."""

    pods: tuple[PodPlacement, ...]
    key: Key
    seconds: float
    domain: str

    def taken(self) -> dict[str, frozenset[int]]:
        """GPUs taken per node."""
        out: dict[str, set[int]] = {}
        for p in self.pods:
            out.setdefault(p.node, set()).update(p.gpus)
        return {n: frozenset(g) for n, g in out.items()}


@dataclass(slots=True)
class Tried:
    """Domains turned down during one search, with reasons.

    Thousands of domains can be turned down in one decision that still succeeds, so entries
    are kept as raw values and formatted only when a failure is explained.
    """

    items: list[tuple[Scope, str, RejectionCode, str, tuple[object, ...]]] = field(
        default_factory=list
    )
    # Every concrete plan built on the way (the best one included), for callers that want
    # alternatives to the best; with `alternatives`, one-node searches also add the best node
    # of the next slower classes.
    plans: list[Plan] = field(default_factory=list)
    alternatives: bool = False
    # With alternatives: one plan per (time bucket, network share) of every class, not only the
    # fastest buckets (a replica matched to a partner over the network: the NIC decides).
    wide: bool = False
    # Search every scope up to the limit even when no wider domain can be faster (to collect
    # alternatives when a greedy pass over a request's units failed).
    explore: bool = False

    def add(
        self, scope: Scope, domain: str, code: RejectionCode, template: str, *args: object
    ) -> None:
        """Record one rejected domain; the message is `template.format(*args)`."""
        self.items.append((scope, domain, code, template, args))

    def distinct_plans(self, count: int) -> list[Plan]:
        """The best `count` plans built, best first, no two on the same GPUs."""
        out: list[Plan] = []
        for plan in sorted(self.plans, key=lambda p: p.key):
            if all(plan.taken() != other.taken() for other in out):
                out.append(plan)
            if len(out) == count:
                break
        return out

    def rejections(self) -> list[Rejection]:
        """As `Rejection`s, in the order they were found."""
        return [Rejection(label(s, d), c, t.format(*a)) for s, d, c, t, a in self.items]


def label(scope: Scope, domain: str) -> str:
    """`tier-0/core/spine-1/leaf-2`, `node/h100-01`: `gputopo.domains.domain_name`."""
    return domain_name(scope, domain)


def missed_preferences(
    slots: Sequence[Slot], span: Scope, spans: Mapping[str, Scope], preferred: Scope | None
) -> int:
    """Preferred scopes a placement misses: each slot's group preference, and the request's."""
    missed = sum(
        1
        for s in slots
        if s.group.scope.preferred is not None
        and WIDTH[spans.get(s.label, span)] > WIDTH[s.group.scope.preferred]
    )
    if preferred is not None and WIDTH[span] > WIDTH[preferred]:
        missed += 1
    return missed


def pods_on(
    group: Group, replica: int, nodes: Sequence[tuple[str, tuple[int, ...]]], first_pod: int = 0
) -> list[PodPlacement]:
    """Cut the GPUs given per node (rank order) into the group's pods."""
    per = group.gpus_per_pod
    out: list[PodPlacement] = []
    pod = first_pod
    for node, gpus in nodes:
        for i in range(0, len(gpus), per):
            chunk = gpus[i : i + per]
            out.append(PodPlacement(group.name, replica, pod, pod * per, node, tuple(chunk)))
            pod += 1
    return out


def node_terms(shape: NodeShape, mask: int, take: int) -> tuple[int, int]:
    return (1 if mask == shape.full_mask else 0, mask.bit_count() - take)


_BROKEN = (Scope.SPINE, Scope.LEAF, Scope.NVLINK)
_FIT = (Scope.NVLINK, Scope.LEAF, Scope.SPINE)


def cell_terms(
    snapshot: ClusterSnapshot, cell: Cell, take: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    broken = []
    for scope in _BROKEN:
        domain = snapshot.cell_domain(cell, scope)
        whole = bool(domain) and snapshot.domain_free(scope, domain) == snapshot.domain_total(
            scope, domain
        )
        broken.append(1 if whole else 0)
    fit = []
    for scope in _FIT:
        domain = snapshot.cell_domain(cell, scope)
        fit.append(snapshot.domain_free(scope, domain) - take if domain else 0)
    return tuple(broken), tuple(fit)


# A class held by at most this many cells is judged cell by cell; a commoner one by visiting
# the cells tightest first (`_tightest_cells`), which stops early.
_FEW_CELLS = 32


def best_node(
    view: View,
    choices: Mapping[NodeClass, tuple[float, object]],
    take: int,
) -> tuple[str, NodeClass, Damage] | None:
    """The least damaging node among nodes of the given classes (all equally fast).

    Per cell the broken-domain and best-fit terms are computed once, per class the node terms
    (whole node broken, GPUs left on it); the key is assembled exactly as `objective.damage`
    would for that node. When the whole cluster is in view and every cell has the same fit
    scope, a common class is answered by `_tightest_cells` instead of visiting all its cells:
    a TP-8 on a 1M-GPU cluster then costs the few tightest domains, not its 10,000 leaves.
    """
    snapshot = view.snapshot
    scope, domain = view.root()
    fit = snapshot.fit_scope
    fast = fit is not None and scope is Scope.CLUSTER and not view.restricted
    wanted = list(choices)
    if fast:
        common = [c for c in wanted if len(snapshot.class_cells(c)) > _FEW_CELLS]
        common_set = set(common)
        wanted = [c for c in wanted if c not in common_set]
    best: tuple[tuple[object, ...], str, NodeClass, Damage] | None = None
    candidates: list[tuple[Cell, dict[NodeClass, list[str]]]] = (
        view.cells_of_classes(scope, domain, wanted) if wanted else []
    )
    if fast:
        assert fit is not None
        for cls in common:
            candidates.extend(_tightest_cells(snapshot, fit, cls, take))
    for cell, by_class in candidates:
        broken, fit_terms = cell_terms(snapshot, cell, take)
        for cls, names in by_class.items():
            shape, mask = cls
            mine = node_terms(shape, mask, take)
            harm = (*broken, *mine, *fit_terms)
            name = names[0]
            k = (harm, name)
            if best is None or k < best[0]:
                best = (k, name, cls, harm)
    if best is None:
        return None
    return best[1], best[2], best[3]


def _tightest_cells(
    snapshot: ClusterSnapshot, fit: Scope, cls: NodeClass, take: int
) -> list[tuple[Cell, dict[NodeClass, list[str]]]]:
    """The cells holding nodes of one class that can hold the least damaging such node.

    Every cell's first best-fit term is the free count of its `fit` domain (NVLINK; for leaf
    cells the NVLINK term is 0 and the LEAF one comes first), and it follows the broken-domain
    terms and the class's own node terms, which are equal for every node of the class. So once
    a cell that breaks no whole domain is found among the domains with f free GPUs, no domain
    with more free GPUs can hold a better node of this class: visiting the domains by free
    count from `take` up, this returns the cells of the buckets up to that one (and every cell
    of the class when none breaks nothing: the caller compares them all).
    """
    buckets = snapshot.domains_by_free(fit)
    out: list[tuple[Cell, dict[NodeClass, list[str]]]] = []
    top = max(buckets, default=-1)
    for free in range(take, top + 1):
        domains = buckets.get(free)
        if not domains:
            continue
        done = False
        for domain in sorted(domains):
            for cell in snapshot.cells_in(fit, domain):
                names = snapshot.cell_nodes(cell).get(cls)
                if not names:
                    continue
                out.append((cell, {cls: sorted(names)}))
                if not done:
                    broken, _ = cell_terms(snapshot, cell, take)
                    done = not any(broken)
        if done:
            break
    return out


def slower_node_plans(
    view: View,
    slots: Sequence[Slot],
    options: Mapping[NodeClass, tuple[float, tuple[NodeChoice, ...]]],
    preferred: Scope | None,
    tried: Tried,
) -> None:
    """Add to `tried.plans` the best node of the next slower time buckets: a later unit of
    the same request may need the fastest node more (with `tried.wide`: of every time bucket
    and network share)."""

    def sort_key(v: tuple[float, tuple[NodeChoice, ...]]) -> tuple[int, float]:
        network = min((c.min_nic_gbps for c in v[1]), default=0.0) if tried.wide else 0.0
        return cost.time_bucket(v[0]), -network

    groups = sorted({sort_key(v) for v in options.values()})
    for group in groups if tried.wide else groups[1:ALTERNATIVE_BUCKETS]:
        subset = {c: v for c, v in options.items() if sort_key(v) == group}
        plan = node_plan(view, slots, subset, preferred)
        if plan is not None:
            tried.plans.append(plan)


def node_plan(
    view: View,
    slots: Sequence[Slot],
    options: Mapping[NodeClass, tuple[float, tuple[NodeChoice, ...]]],
    preferred: Scope | None,
) -> Plan | None:
    """The plan on the least damaging node among the fastest classes.

    `options` gives, per class that can hold the slots, the predicted seconds and each slot's
    GPUs on such a node (in the order of `slots`).
    """
    if not options:
        return None
    need = sum(s.need for s in slots)
    bucket = min(cost.time_bucket(t) for t, _ in options.values())
    fastest = {c: v for c, v in options.items() if cost.time_bucket(v[0]) == bucket}
    picked = best_node(view, fastest, need)
    if picked is None:
        return None
    node, cls, harm = picked
    seconds, choices = fastest[cls]
    pods: list[PodPlacement] = []
    for slot, choice in zip(slots, choices, strict=True):
        pods.extend(pods_on(slot.group, slot.replica, [(node, choice.gpus)]))
    missed = missed_preferences(slots, Scope.NODE, {}, preferred)
    return Plan(
        tuple(pods),
        key(missed=missed, seconds=seconds, spread=0, span=Scope.NODE, harm=harm, names=(node,)),
        seconds,
        label(Scope.NODE, node),
    )
