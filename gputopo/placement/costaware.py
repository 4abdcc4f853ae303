"""The `gputopo` policy: place a communication graph where it will communicate fastest.

Objective (`gputopo.placement.objective`), in order: satisfy every required constraint and
bandwidth need; then the preferred scopes; then the least predicted communication time
(bucketed, so near-equal choices tie); then preferred spreads; then the narrowest span; then the
least damage to large free domains (whole spines, leaves, NVLink racks and nodes kept free, then
best fit); then names, for determinism.

Phases:
1. Split the request into *units*, each decided at once (`units`): groups joined by edges form a
   component; a component whose edges all pair replicas one to one is cut into bundles (replica i
   of each group), any other component with edges is one bundle; a group without edges gives one
   unit per replica. Larger components go first.
2. When the whole request must stay in one domain and has several units, try the domains of that
   scope with room, tightest first (at most `MAX_ENCLOSING`), each as the enclosing domain of
   every unit; otherwise the cluster encloses them.
3. Place the units one after another on a working snapshot (`ClusterSnapshot.with_free`, cheap):
   a replica by `search.search_slot`, a bundle by `bundle.search_bundle`. Required spreads remove
   the failure domains earlier replicas used; preferred spreads search with and without them and
   let the key decide.
4. Check the answer against every hard rule (`constraints.violations`) and predict it.

Each search answers from indexes over classes of nodes and over domains (see `search`), so a
decision costs in the number of candidate domains, not GPUs. A unit that cannot be placed ends
the decision with the reason and every domain turned down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gputopo import cost
from gputopo.cluster import ClusterSnapshot
from gputopo.domains import domain_name
from gputopo.placement.bundle import (
    BundleEdge,
    fastest_pair_gbps,
    search_bundle,
    single_node_seconds,
)
from gputopo.placement.constraints import refusal
from gputopo.placement.fill import matches
from gputopo.placement.objective import WIDTH, Key
from gputopo.placement.predict import edge_pairs, predict
from gputopo.placement.result import (
    PlacementResult,
    PodPlacement,
    Prediction,
    Rejection,
    RejectionCode,
)
from gputopo.placement.search import Plan, Slot, Tried, optimistic_seconds, search_slot
from gputopo.placement.view import View
from gputopo.request import Group, Pairing, PlacementRequest, Scope

__all__ = [
    "ALTERNATIVES",
    "MAX_ENCLOSING",
    "MAX_REJECTIONS",
    "MAX_RETRIES",
    "CostAwarePolicy",
    "Unit",
    "components",
    "orders",
    "units",
]

# At most this many rejections are reported per decision; the rest are counted.
MAX_REJECTIONS = 50
# Enclosing domains tried for a multi-unit request with a required scope, tightest fit first.
MAX_ENCLOSING = 16
# When a unit cannot be placed after others took the room it needed, the decision is retried
# with that unit's group first, at most this many times.
MAX_RETRIES = 3
# How many of the first unit's best plans each start a greedy pass over the other units.
ALTERNATIVES = 3


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


@dataclass(frozen=True, slots=True)
class Unit:
    """Slots decided together, and the edges between them."""

    slots: tuple[Slot, ...]
    edges: tuple[BundleEdge, ...] = ()

    @property
    def need(self) -> int:
        """GPUs of the whole unit."""
        return sum(s.need for s in self.slots)


def units(request: PlacementRequest) -> list[Unit]:
    """The units of a request, in the order they are placed (see the module docstring)."""
    out: list[Unit] = []
    for comp in components(request):
        names = {g.name for g in comp}
        edges = [e for e in request.edges if e.source in names]
        ordered = sorted(comp, key=lambda g: (-g.gpus_per_replica, g.name))
        if not edges:
            out.extend(Unit((Slot(g, r),)) for g in ordered for r in range(g.replicas))
            continue
        if all(e.pairing is Pairing.ONE_TO_ONE for e in edges):
            for r in range(ordered[0].replicas):
                slots = tuple(Slot(g, r) for g in ordered)
                index = {s.group.name: i for i, s in enumerate(slots)}
                out.append(
                    Unit(
                        slots,
                        tuple(
                            BundleEdge(
                                index[e.source], index[e.target], e.required_gbps, e.transfer_bytes
                            )
                            for e in edges
                        ),
                    )
                )
            continue
        slots = tuple(Slot(g, r) for g in ordered for r in range(g.replicas))
        at = {(s.group.name, s.replica): i for i, s in enumerate(slots)}
        links = []
        for e in edges:
            src, dst = request.group(e.source), request.group(e.target)
            for i, j in edge_pairs(e, src.replicas, dst.replicas):
                links.append(
                    BundleEdge(
                        at[(e.source, i)],
                        at[(e.target, j)],
                        e.required_gbps,
                        e.transfer_bytes,
                    )
                )
        out.append(Unit(slots, tuple(links)))
    return out


def orders(request: PlacementRequest) -> list[list[Unit]]:
    """The unit orders a decision tries, without repeats: largest component first (`units`);
    largest unit first; and groups by replica size then name, replicas in order (the order
    Kueue admits PodSets in, so that the engine sees every state Kueue would)."""
    first = units(request)
    rank = {g.name: (-g.gpus_per_replica, g.name) for g in request.groups}
    candidates = [
        first,
        sorted(first, key=lambda u: -u.need),
        sorted(first, key=lambda u: min((rank[s.group.name], s.replica) for s in u.slots)),
    ]
    out: list[list[Unit]] = []
    for order in candidates:
        if order not in out:
            out.append(order)
    return out


def _narrower(a: Scope | None, b: Scope | None) -> Scope | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if WIDTH[a] <= WIDTH[b] else b


class _Decision:
    """One placement decision: the request, the snapshot, and what is placed so far."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        request: PlacementRequest,
        order: Sequence[Unit],
        *,
        explore: bool = False,
    ) -> None:
        self.snapshot = snapshot
        self.request = request
        self.units = list(order)
        self.explore = explore
        self.failed: Unit | None = None  # the unit that could not be placed, if any
        self._allowed: dict[tuple[tuple[tuple[str, str], ...], ...], frozenset[str] | None] = {}

    def allowed(self, *groups: Group) -> frozenset[str] | None:
        """Nodes the request's selector and every given group's accept; None when nothing is
        selected. Selectors of different groups may conflict: then no node is allowed."""
        selectors = [self.request.node_selector, *(g.node_selector for g in groups)]
        k = tuple(tuple(sorted(sel.items())) for sel in selectors if sel)
        if k not in self._allowed:
            self._allowed[k] = (
                frozenset(n for n, st in self.snapshot.nodes.items() if matches(st, *selectors))
                if k
                else None
            )
        return self._allowed[k]

    def run(self) -> PlacementResult | list[tuple[list[PodPlacement], Key]]:
        """Every complete placement this order yields (see `place_all`), or why none."""
        if (missed := self._selector_miss()) is not None:
            return missed
        required = self.request.scope.required
        if required is None or required is Scope.CLUSTER or len(self.units) == 1:
            return self.place_all(within=None)
        need = self.request.total_gpus
        enclosing = self._enclosing(required, need)
        found: list[tuple[list[PodPlacement], Key]] = []
        failures: list[Rejection] = []
        for scope, domain in enclosing[:MAX_ENCLOSING]:
            outcome = self.place_all(within=(scope, domain))
            if isinstance(outcome, PlacementResult):
                failures.append(
                    Rejection(domain_name(scope, domain), RejectionCode.UNIT, outcome.reason)
                )
                continue
            found.extend(outcome)
        if found:
            return found
        scope_name = required.name.lower()
        return PlacementResult(
            False,
            CostAwarePolicy.name,
            reason=f"no {scope_name} domain can hold the whole request ({need} GPUs)"
            if enclosing
            else f"no {scope_name} domain has {need} free GPUs",
            rejections=tuple(failures[:MAX_REJECTIONS]),
        )

    def _selector_miss(self) -> PlacementResult | None:
        """A group that no node can take at all, said as itself rather than as the capacity every
        domain then seems to lack: its node selectors (the request's and its own) match no node
        (`selector`), or every node they allow is stale or unhealthy (`unhealthy`)."""
        for group in self.request.groups:
            allowed = self.allowed(group)
            candidates = self.snapshot.nodes.keys() if allowed is None else allowed
            if allowed is not None and not allowed:
                selectors = (self.request.node_selector, group.node_selector)
                text = ", ".join(f"{k}={v}" for sel in selectors for k, v in sorted(sel.items()))
                code = RejectionCode.SELECTOR
                message = f"no node matches the selectors of group {group.name} ({text})"
            elif candidates and not any(self.snapshot.node(n).placeable for n in candidates):
                why = sorted({self.snapshot.node(n).reason or "not placeable" for n in candidates})
                code = RejectionCode.UNHEALTHY
                message = (
                    f"none of the {len(candidates)} node(s) group {group.name} may use is "
                    f"placeable ({', '.join(why)})"
                )
            else:
                continue
            return PlacementResult(
                False,
                CostAwarePolicy.name,
                reason=message,
                rejections=(Rejection("placement", code, message),),
            )
        return None

    def _enclosing(self, scope: Scope, need: int) -> list[tuple[Scope, str]]:
        snap = self.snapshot
        found: list[tuple[int, Scope, str]] = []
        if scope in (Scope.NODE, Scope.NVLINK):
            for name, cls in ((n, snap.node_class(n)) for n in snap.nodes):
                free = cls[1].bit_count()
                if free >= need and snap.node(name).placeable:
                    found.append((free, Scope.NODE, name))
        if scope is not Scope.NODE:
            for domain, free in snap.free_domains(scope).items():
                if free >= need:
                    found.append((free, scope, domain))
        found.sort(key=lambda f: (f[0], WIDTH[f[1]], f[2]))
        return [(s, d) for _, s, d in found]

    def place_all(
        self, *, within: tuple[Scope, str] | None
    ) -> PlacementResult | list[tuple[list[PodPlacement], Key]]:
        """Place the units in order. The first unit's few best plans (`ALTERNATIVES`, distinct
        node sets) each start one greedy pass: what suits the first unit best can cost later
        units more than it gains, and the request's own later units are known."""
        first, tried = self._place_unit(
            self.snapshot,
            self.units[0],
            within=within,
            used={},
            single=len(self.units) == 1,
            alternatives=len(self.units) > 1,
        )
        if first is None:
            self.failed = self.units[0]
            return self._failure(self.snapshot, self.units[0], tried)
        if len(self.units) == 1:
            return [(list(first.pods), first.key)]
        starts = tried.distinct_plans(ALTERNATIVES)
        found: list[tuple[list[PodPlacement], Key]] = []
        failure: PlacementResult | None = None
        for start in starts:
            outcome = self._greedy(start, within=within)
            if isinstance(outcome, PlacementResult):
                failure = failure or outcome
            else:
                found.append(outcome)
        if found:
            return found
        assert failure is not None
        return failure

    def _greedy(
        self, first: Plan, *, within: tuple[Scope, str] | None
    ) -> PlacementResult | tuple[list[PodPlacement], Key]:
        working = self.snapshot
        pods: list[PodPlacement] = []
        plans: list[Plan] = []
        used: dict[str, set[str]] = {}  # group -> spread domains used so far
        for unit in self.units:
            if not plans:
                plan: Plan | None = first
            else:
                plan, tried = self._place_unit(
                    working, unit, within=within, used=used, single=False
                )
            if plan is None:
                self.failed = unit
                return self._failure(working, unit, tried)
            pods.extend(plan.pods)
            plans.append(plan)
            taken = plan.taken()
            working = working.with_free({n: working.node(n).free - g for n, g in taken.items()})
            for s in unit.slots:
                spread = s.group.spread
                if spread is None:
                    continue
                for p in plan.pods:
                    if p.group == s.group.name and p.replica == s.replica:
                        d = working.domain_of(p.node, spread.across)
                        if d:
                            used.setdefault(s.group.name, set()).add(d)
        return pods, _total_key(plans)

    def _place_unit(
        self,
        working: ClusterSnapshot,
        unit: Unit,
        *,
        within: tuple[Scope, str] | None,
        used: Mapping[str, set[str]],
        single: bool,
        alternatives: bool = False,
    ) -> tuple[Plan | None, Tried]:
        tried = Tried(alternatives=alternatives, explore=alternatives and self.explore)
        allowed = self.allowed(*(s.group for s in unit.slots))
        per_group = {s.group.name: self.allowed(s.group) for s in unit.slots}
        required_out: set[str] = set()
        preferred_out: set[str] = set()
        for s in unit.slots:
            spread = s.group.spread
            if spread is None or not used.get(s.group.name):
                continue
            nodes = _members(working, spread.across, used[s.group.name])
            (required_out if spread.required else preferred_out).update(nodes)
        view = View(
            working,
            allowed=allowed,
            excluded=frozenset(required_out),
            within=within,
            per_group=per_group,
        )
        plan = self._search(view, unit, single=single, tried=tried)
        if preferred_out:
            away = View(
                working,
                allowed=allowed,
                excluded=frozenset(required_out | preferred_out),
                within=within,
                per_group=per_group,
            )
            apart = self._search(away, unit, single=single, tried=Tried())
            if plan is not None:
                shared = sum(1 for p in plan.pods if p.node in preferred_out)
                plan = replace(plan, key=plan.key._replace(spread=shared))
            if apart is not None and (plan is None or apart.key < plan.key):
                plan = apart
        return plan, tried

    def _search(self, view: View, unit: Unit, *, single: bool, tried: Tried) -> Plan | None:
        request = self.request
        limit = request.scope.required if single else None
        preferred = request.scope.preferred
        if len(unit.slots) == 1:
            slot = unit.slots[0]
            return search_slot(
                view,
                slot,
                limit=_narrower(slot.group.scope.required, limit),
                preferred=preferred,
                tried=tried,
                nvlink=limit is Scope.NVLINK,
            )

        def bound() -> float:
            total = 0.0
            for s in unit.slots:
                own = view.for_group(s.group.name)
                best = single_node_seconds(own, s)
                if s.group.pods > 1:
                    # over NICs or multi-node NVLink, whichever the view allows to be faster
                    for nvlink in (False, True):
                        best = min(best, optimistic_seconds(own, s.group, nvlink=nvlink))
                total += best
            fastest = fastest_pair_gbps(view.loosest())
            for e in unit.edges:
                shards = min(unit.slots[e.source].need, unit.slots[e.target].need)
                if e.transfer_bytes and fastest > 0:
                    total += cost.transfer_seconds(
                        size_bytes=e.transfer_bytes, gbps=shards * fastest
                    )
            return total

        return search_bundle(
            view, unit.slots, unit.edges, limit=limit, preferred=preferred, tried=tried, bound=bound
        )

    def _failure(self, working: ClusterSnapshot, unit: Unit, tried: Tried) -> PlacementResult:
        names = ", ".join(dict.fromkeys(s.label for s in unit.slots))
        need = unit.need
        rejections = tried.rejections()
        if working.free_gpus < need:
            reason = f"{need} GPUs needed for {names}, only {working.free_gpus} free in the cluster"
        elif rejections:
            codes = sorted({r.code for r in rejections})
            reason = (
                f"no domain can hold {names} ({need} GPUs): {len(rejections)} candidate(s) "
                f"rejected ({', '.join(codes)})"
            )
        else:
            reason = f"no domain has {need} free GPUs for {names}"
        kept = tuple(rejections[:MAX_REJECTIONS])
        if len(rejections) > MAX_REJECTIONS:
            kept += (
                Rejection("...", RejectionCode.MORE, f"{len(rejections) - MAX_REJECTIONS} more"),
            )
        return PlacementResult(False, CostAwarePolicy.name, reason=reason, rejections=kept)


def _members(snapshot: ClusterSnapshot, scope: Scope, domains: set[str]) -> set[str]:
    if scope is Scope.NODE:
        return set(domains)
    out: set[str] = set()
    for d in domains:
        out.update(snapshot.domains(scope).get(d, ()))
    return out


def _total_key(plans: Sequence[Plan]) -> Key:
    """The key of a whole placement from its units' keys: preferences missed, predicted time,
    spread, widest span and damage add up (names last, for determinism)."""
    return Key(
        sum(p.key.missed for p in plans),
        cost.time_bucket(sum(p.seconds for p in plans)),
        sum(p.key.spread for p in plans),
        max(p.key.span for p in plans),
        tuple(sum(h) for h in zip(*(p.key.harm for p in plans), strict=True)),
        tuple(n for p in plans for n in p.key.names),
    )


class CostAwarePolicy:
    """The cost-aware policy (see the module docstring)."""

    name = "gputopo"

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        """Place the whole request or nothing.

        Units are decided one after another, so their order matters when a request has
        several groups: each order of `orders` is tried and the best whole placement (by its
        predicted time, then the rest of its key) wins. An order that fails because earlier
        units took a later one's room is retried with the failing unit's group first; when
        every order fails, once more with the first unit's alternatives searched wider.
        """
        first_failure: PlacementResult | None = None
        best: tuple[Key, list[PodPlacement], Prediction] | None = None
        group_order = {g.name: i for i, g in enumerate(request.groups)}

        def consider(found: list[tuple[list[PodPlacement], Key]]) -> None:
            nonlocal best
            for pods, total in found:
                pods.sort(key=lambda p: (group_order[p.group], p.replica, p.rank))
                prediction = predict(snapshot, request, pods)
                final = total._replace(time=cost.time_bucket(prediction.communication_seconds))
                if best is None or final < best[0]:
                    best = (final, pods, prediction)

        queue = orders(request)
        seen = list(queue)
        retries = 0
        while queue:
            order = queue.pop(0)
            decision = _Decision(snapshot, request, order)
            outcome = decision.run()
            if not isinstance(outcome, PlacementResult):
                consider(outcome)
                continue
            first_failure = first_failure or outcome
            failed = decision.failed
            if failed is not None and retries < MAX_RETRIES:
                # Earlier units took what this one needed: let its group go first.
                names = {s.group.name for s in failed.slots}
                first = [u for u in order if any(s.group.name in names for s in u.slots)]
                again = first + [u for u in order if u not in first]
                if again not in seen:
                    seen.append(again)
                    queue.append(again)
                    retries += 1
        if best is None and len(seen[0]) > 1:
            # Every order failed: look wider for the first unit's alternatives and try again.
            for order in orders(request):
                outcome = _Decision(snapshot, request, order, explore=True).run()
                if not isinstance(outcome, PlacementResult):
                    consider(outcome)
        if best is None:
            assert first_failure is not None
            return first_failure
        _, pods, prediction = best
        wrong = refusal(
            snapshot,
            request,
            pods,
            policy=self.name,
            why="internal error: the placement found breaks a rule",
            code=RejectionCode.INTERNAL,
            prediction=prediction,
        )
        return wrong or PlacementResult(True, self.name, tuple(pods), prediction)
