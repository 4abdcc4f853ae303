"""The part of a snapshot one search may use: placeable nodes, minus what selectors or a spread
rule out, inside an optional enclosing domain; answered from the snapshot's indexes.

When nothing is ruled out (the common case) every question is a dictionary lookup in the
snapshot's incremental indexes. Selectors (and spreads) restrict the nodes; then the view counts
the allowed nodes per domain once and caches the answer for the rest of the decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gputopo.cluster import Cell, ClusterSnapshot, NodeClass
from gputopo.request import Scope

__all__ = ["View", "inside"]

_TIERS = (Scope.LEAF, Scope.SPINE, Scope.CORE)


def inside(
    snapshot: ClusterSnapshot, scope: Scope, domain: str, outer: Scope, outer_id: str
) -> bool:
    """Whether every node of `domain` (at `scope`) lies in `outer_id` (at `outer`)."""
    if outer is Scope.CLUSTER:
        return True
    if scope is outer:
        return domain == outer_id
    if scope in _TIERS and outer in _TIERS and _TIERS.index(scope) < _TIERS.index(outer):
        return domain.startswith(outer_id + "/")
    members = snapshot.domains(scope).get(domain, (domain,) if scope is Scope.NODE else ())
    return bool(members) and all(snapshot.domain_of(n, outer) == outer_id for n in members)


class View:
    """Nodes a search may use (see the module docstring).

    `allowed`: only these nodes (selectors); None for all. `excluded`: never these (spread).
    `within`: only nodes of this domain (a required scope of the whole request). `per_group`:
    the nodes each group's own selectors allow (a bundle's groups may select differently, and
    `allowed` is what all of them allow).
    """

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        *,
        allowed: frozenset[str] | None = None,
        excluded: frozenset[str] = frozenset(),
        within: tuple[Scope, str] | None = None,
        per_group: Mapping[str, frozenset[str] | None] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.allowed = allowed
        self.excluded = excluded
        self.within = within
        self.per_group: Mapping[str, frozenset[str] | None] = per_group or {}
        self._classes: dict[tuple[Scope, str], Mapping[NodeClass, int]] = {}

    def for_group(
        self,
        group: str,
        *,
        snapshot: ClusterSnapshot | None = None,
        within: tuple[Scope, str] | None = None,
        excluded: Iterable[str] = (),
    ) -> View:
        """The view one group's replica may use, on `snapshot` (default: this one's), inside
        `within` (default: this one's enclosing domain), without some more nodes."""
        return View(
            snapshot or self.snapshot,
            allowed=self.per_group.get(group, self.allowed),
            excluded=self.excluded | frozenset(excluded),
            within=within or self.within,
        )

    def loosest(self) -> View:
        """The view with the nodes any of its groups may use (for capacity checks of a bundle
        whose groups select different nodes)."""
        if not self.per_group:
            return self
        allowed: frozenset[str] | None = frozenset()
        for nodes in self.per_group.values():
            allowed = None if nodes is None or allowed is None else allowed | nodes
        return View(self.snapshot, allowed=allowed, excluded=self.excluded, within=self.within)

    @property
    def restricted(self) -> bool:
        """Whether selectors or exclusions rule out nodes the index counts."""
        return self.allowed is not None or bool(self.excluded)

    def ok(self, name: str) -> bool:
        """Whether the search may use a node."""
        if name in self.excluded or (self.allowed is not None and name not in self.allowed):
            return False
        if self.within is not None:
            scope, domain = self.within
            if scope is Scope.NODE:
                return name == domain
            return self.snapshot.domain_of(name, scope) == domain
        return True

    def contains(self, scope: Scope, domain: str) -> bool:
        """Whether a domain lies entirely in the view's enclosing domain."""
        if self.within is None:
            return True
        return inside(self.snapshot, scope, domain, *self.within)

    def root(self) -> tuple[Scope, str]:
        """The enclosing domain (the cluster when none)."""
        return self.within if self.within is not None else (Scope.CLUSTER, "cluster")

    def classes(self, scope: Scope, domain: str) -> Mapping[NodeClass, int]:
        """How many usable nodes of each class a domain holds."""
        snap = self.snapshot
        if not self.restricted and self.contains(scope, domain):
            return snap.domain_classes(scope, domain)
        cached = self._classes.get((scope, domain))
        if cached is not None:
            return cached
        counts: dict[NodeClass, int] = {}
        members: Iterable[str]
        if scope is Scope.NODE:
            members = (domain,)
        elif scope is Scope.CLUSTER:
            members = snap.nodes
        else:
            members = snap.domains(scope).get(domain, ())
        if self.allowed is not None and len(self.allowed) < 64:
            # A few allowed nodes (a partner's node, a small selector): look at those alone.
            members = [
                n
                for n in sorted(self.allowed)
                if n in snap.nodes
                and (scope in (Scope.NODE, Scope.CLUSTER) or snap.domain_of(n, scope) == domain)
                and (scope is not Scope.NODE or n == domain)
            ]
        for name in members:
            if self.ok(name) and snap.node(name).placeable:
                cls = snap.node_class(name)
                counts[cls] = counts.get(cls, 0) + 1
        self._classes[(scope, domain)] = counts
        return counts

    def free(self, scope: Scope, domain: str) -> int:
        """Usable free GPUs in a domain."""
        if not self.restricted and self.contains(scope, domain):
            return self.snapshot.domain_free(scope, domain)
        return sum(c[1].bit_count() * n for c, n in self.classes(scope, domain).items())

    def cells_of_classes(
        self, scope: Scope, domain: str, classes: Iterable[NodeClass]
    ) -> list[tuple[Cell, dict[NodeClass, list[str]]]]:
        """The cells of a domain that hold usable nodes of the given classes, with those nodes
        (names sorted), in cell order."""
        snap = self.snapshot
        wanted = set(classes)
        if scope is Scope.NODE:
            cls = snap.node_class(domain)
            if cls in wanted and self.ok(domain) and snap.node(domain).placeable:
                return [(snap.cell_of(domain), {cls: [domain]})]
            return []
        cells_in = snap.cells_in(scope, domain)
        via_classes = sum(len(snap.class_cells(c)) for c in wanted)
        if via_classes < len(cells_in):
            found: set[Cell] = set()
            for c in wanted:
                found.update(snap.class_cells(c))
            if scope is not Scope.CLUSTER:
                found &= set(cells_in)
            candidates: Iterable[Cell] = sorted(found)
        else:
            candidates = cells_in
        filtering = self.restricted or not self.contains(scope, domain)
        out: list[tuple[Cell, dict[NodeClass, list[str]]]] = []
        for cell in candidates:
            nodes = snap.cell_nodes(cell)
            by_class: dict[NodeClass, list[str]] = {}
            for cls in wanted:
                names = nodes.get(cls)
                if not names:
                    continue
                usable = sorted(n for n in names if self.ok(n)) if filtering else sorted(names)
                if usable:
                    by_class[cls] = usable
            if by_class:
                out.append((cell, by_class))
        return out
