"""The cluster as placement sees it: an immutable snapshot of nodes, their free GPUs, and the
domains (NVLink domains, leaves, spines, zones) that group them, with indexes kept incrementally.

The aggregator keeps one mutable state and hands out `ClusterSnapshot`s; placement only ever reads
a snapshot, so a decision is made against one consistent view. Domain membership is derived from
each node's `FabricPosition`:

- NODE: the node itself.
- NVLINK: NVLink-connected GPUs. For nodes in a multi-node NVLink domain (usable NVML fabric info,
  or an accelerator domain from the inventory) it is that domain (its sub-domain when one is
  set: GPUs only talk over NVLink inside their partition); otherwise each NVLink island of a
  node (all 8 GPUs of an NVSwitch node, a bridged pair of a PCIe server, a lone PCIe GPU).
- LEAF, SPINE, CORE: fabric tiers 0, 1, 2. A tier is identified by its whole path upwards, so a
  leaf name reused under two spines is two leaves (topograph #411's forest collision).
- ZONE: the node's zone; CLUSTER: everything.

A node that lacks a tier (no fabric facts) belongs to no domain of that scope, so a request that
requires it cannot land there; placement says so rather than guessing.

Indexes (what makes placement cost grow with domains, not GPUs):

- every node has a `NodeShape` (`gputopo.shape`): its GPU-to-GPU bandwidth matrix, link kinds,
  NUMA nodes, nearest NICs and NVLink rates, interned so that identical machines share one;
- a node's *class* is its shape plus the bit mask of its free GPUs; identical classes get
  identical intra-node answers, so placement computes each answer once;
- per domain at every scope: free GPUs, total GPUs, and how many nodes of each class it holds;
- per *cell* (the narrowest multi-node grouping of a node: its multi-node NVLink domain, else its
  leaf, else the node alone): the nodes of each class, to pick concrete nodes at the end.

`with_free` derives a new snapshot that shares everything unchanged with its parent and copies
only the index entries the changed nodes touch (copy-on-write), so reserving GPUs on a few nodes
of a 100k-GPU cluster costs a few dictionary copies, not a rebuild. `ClusterSnapshot(...,
previous=...)` does the same when the aggregator rebuilds its node list.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

from gputopo.domains import tier_path
from gputopo.request import Scope
from gputopo.shape import NodeShape, measurement_expiry, node_shape
from gputopo.topology import DEFAULT_MEASUREMENT_MAX_AGE_S, NodeTopology

__all__ = [
    "Cell",
    "ClusterSnapshot",
    "DomainKey",
    "NodeClass",
    "NodeShape",
    "NodeState",
    "domain_ids",
    "node_shape",
    "nvlink_islands",
]

_V = TypeVar("_V")

_TIER_OF_SCOPE = {Scope.LEAF: 0, Scope.SPINE: 1, Scope.CORE: 2}
# Scopes whose domains get per-class counts (NODE is the node itself).
_INDEXED_SCOPES = (Scope.NVLINK, Scope.LEAF, Scope.SPINE, Scope.CORE, Scope.ZONE, Scope.CLUSTER)
# Scopes whose domains are also indexed by free count (the best-fit terms of a node's damage).
_BUCKETED = (Scope.NVLINK, Scope.LEAF)
# Free count -> the domains with that many free GPUs, per bucketed scope.
_Buckets = dict[Scope, dict[int, frozenset[str]]]
# A derived index folds its moved domains into buckets of its own once this many pile up.
_MOVED_FOLD = 32
# Free GPUs per domain, per indexed scope.
_Free = Mapping[Scope, Mapping[str, int]]

# A domain: its scope and an identity that is unique within that scope.
DomainKey = tuple[Scope, str]


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node in a snapshot: its topology, which GPUs are free, and whether it can take work."""

    topology: NodeTopology
    free: frozenset[int]
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    placeable: bool = True
    reason: str = ""  # why the node is not placeable (stale, cordoned, ...)

    @property
    def name(self) -> str:
        """The node's name."""
        return self.topology.name

    @property
    def free_count(self) -> int:
        """Number of free GPUs (0 when the node is not placeable)."""
        return len(self.free) if self.placeable else 0


def nvlink_islands(topology: NodeTopology) -> tuple[frozenset[int], ...]:
    """GPUs of a node grouped by NVLink connectivity (connected components), sorted.

    Every GPU belongs to exactly one island; a GPU with no NVLink is an island of one.
    """
    return node_shape(topology).islands


# A node's class: its shape and the mask of its free GPUs.
NodeClass = tuple[NodeShape, int]
# The narrowest multi-node grouping of a node: (multi-node NVLink domain, leaf, "") for nodes
# with fabric facts (either may be ""), ("", "", node name) for a node with neither. Cells nest
# in leaves and NVLink domains by construction.
Cell = tuple[str, str, str]


def _mask(gpus: Iterable[int]) -> int:
    m = 0
    for g in gpus:
        m |= 1 << g
    return m


def _nvlink_domain(topology: NodeTopology) -> str:
    """The multi-node NVLink domain of a node, or "" when its NVLink stays inside the node."""
    fabric = topology.fabric
    if fabric.accelerator_sub_domain:
        return fabric.accelerator_sub_domain
    if fabric.accelerator_domain:
        return fabric.accelerator_domain
    cliques = {g.fabric.clique for g in topology.gpus if g.fabric is not None and g.fabric.usable}
    return cliques.pop() if len(cliques) == 1 else ""


def _domain_ids(state: NodeState) -> Mapping[Scope, str]:
    fabric = state.topology.fabric
    ids: dict[Scope, str] = {Scope.NODE: state.name, Scope.CLUSTER: "cluster"}
    ids[Scope.NVLINK] = _nvlink_domain(state.topology)
    for scope, tier in _TIER_OF_SCOPE.items():
        if len(fabric.tiers) > tier:
            ids[scope] = tier_path(fabric.tiers, tier)
    zone = fabric.zone or state.labels.get("topology.kubernetes.io/zone", "")
    if zone:
        ids[Scope.ZONE] = zone
    return MappingProxyType(ids)


def domain_ids(topology: NodeTopology, labels: Mapping[str, str]) -> Mapping[Scope, str]:
    """A node's domain id at each scope, as every snapshot holding the node keys its domains
    (`ClusterSnapshot.domain_of`), without building one: no shape or index is computed."""
    return _domain_ids(NodeState(topology, frozenset(), labels))


def _fit_scope(cell: Cell) -> Scope | None:
    """The narrowest multi-node domain a cell is one piece of: NVLINK, LEAF, or None."""
    if cell[0]:
        return Scope.NVLINK
    return Scope.LEAF if cell[1] else None


def _cell(name: str, ids: Mapping[Scope, str]) -> Cell:
    nvl, leaf = ids.get(Scope.NVLINK, ""), ids.get(Scope.LEAF, "")
    return (nvl, leaf, "") if nvl or leaf else ("", "", name)


_MISSING = object()


class _Layered(Mapping[str, _V]):
    """A read-only mapping: a base dict with some entries replaced, so that a derived snapshot
    costs O(changes) instead of a copy of every node. Keys never change (a snapshot derived by
    `with_free` has the same nodes); overrides are folded into a new base once they grow past a
    sixteenth of it, which keeps lookups at two dictionary probes and copies amortised."""

    __slots__ = ("_base", "_over")

    def __init__(self, base: dict[str, _V], over: dict[str, _V] | None = None) -> None:
        self._base = base
        self._over: dict[str, _V] = over or {}

    def __getitem__(self, key: str) -> _V:
        found = self._over.get(key, _MISSING)
        if found is _MISSING:
            return self._base[key]
        return found  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def items(self) -> ItemsView[str, _V]:
        return _LayeredItems(self)

    def values(self) -> ValuesView[_V]:
        return _LayeredValues(self)

    def _pairs(self) -> Iterator[tuple[str, _V]]:
        over = self._over
        if not over:
            return iter(self._base.items())
        return ((k, over.get(k, v)) for k, v in self._base.items())

    def changed(self, changes: Mapping[str, _V]) -> _Layered[_V]:
        """A new mapping with some values replaced (keys must exist)."""
        over = {**self._over, **changes}
        if len(over) > max(64, len(self._base) // 16):
            return _Layered({**self._base, **over})
        return _Layered(self._base, over)


class _LayeredItems(ItemsView[str, _V]):
    """`_Layered.items()`: one pass over the base dict, not a lookup of every key (the
    policies walk every node's state per decision; kueue-bestfit three times)."""

    _mapping: _Layered[_V]

    def __iter__(self) -> Iterator[tuple[str, _V]]:
        return self._mapping._pairs()


class _LayeredValues(ValuesView[_V]):
    """`_Layered.values()`, one pass likewise."""

    _mapping: _Layered[_V]

    def __iter__(self) -> Iterator[_V]:
        return (v for _, v in self._mapping._pairs())


class _Structure:
    """What does not change when only free GPUs change: domains, shapes, cells, totals."""

    __slots__ = (
        "__weakref__",
        "_cells_by",
        "cell",
        "cell_rep",
        "domain_ids",
        "domains",
        "expires",
        "fit_scope",
        "placeable",
        "shape",
        "total",
    )

    def __init__(
        self,
        nodes: Mapping[str, NodeState],
        *,
        now: float | None,
        reuse: _Structure | None = None,
        reuse_nodes: Mapping[str, NodeState] | None = None,
    ) -> None:
        self.domain_ids: dict[str, Mapping[Scope, str]] = {}
        self.shape: dict[str, NodeShape] = {}
        self.cell: dict[str, Cell] = {}
        self.expires: dict[str, float] = {}
        self.placeable: dict[str, bool] = {}
        members: dict[Scope, dict[str, list[str]]] = {s: {} for s in Scope}
        total: dict[Scope, dict[str, int]] = {s: {} for s in _INDEXED_SCOPES}
        for name, state in nodes.items():
            old = reuse_nodes.get(name) if reuse_nodes is not None else None
            if (
                reuse is not None
                and old is not None
                and old.topology is state.topology
                and old.labels == state.labels
                and (now is None or reuse.expires[name] > now)
            ):
                ids = reuse.domain_ids[name]
                shape = reuse.shape[name]
                expiry = reuse.expires[name]
            else:
                ids = _domain_ids(state)
                shape = node_shape(state.topology, now=now)
                expiry = (
                    measurement_expiry(state.topology, DEFAULT_MEASUREMENT_MAX_AGE_S)
                    if now is not None
                    else math.inf
                )
            self.domain_ids[name] = ids
            self.shape[name] = shape
            self.expires[name] = expiry
            self.cell[name] = _cell(name, ids)
            self.placeable[name] = state.placeable
            for scope, domain in ids.items():
                if domain:
                    members[scope].setdefault(domain, []).append(name)
            if state.placeable:
                for scope in _INDEXED_SCOPES:
                    domain = ids.get(scope, "")
                    if domain:
                        total[scope][domain] = total[scope].get(domain, 0) + shape.gpu_count
        self.cell_rep: dict[Cell, str] = {}
        for name in sorted(self.cell):
            self.cell_rep.setdefault(self.cell[name], name)
        kinds = {_fit_scope(c) for c in self.cell_rep}
        # The scope whose free count orders every cell's best-fit terms, when all cells have
        # one (see `ClusterSnapshot.fit_scope`).
        self.fit_scope: Scope | None = kinds.pop() if len(kinds) == 1 else None
        self._cells_by: dict[Scope, dict[str, tuple[Cell, ...]]] = {}
        self.domains: Mapping[Scope, Mapping[str, tuple[str, ...]]] = MappingProxyType(
            {
                scope: MappingProxyType({d: tuple(m[d]) for d in sorted(m)})
                for scope, m in members.items()
            }
        )
        self.total = total

    def cells_by(self, scope: Scope) -> Mapping[str, tuple[Cell, ...]]:
        """Domain id -> the cells whose representative node lies in it, at one scope."""
        found = self._cells_by.get(scope)
        if found is None:
            acc: dict[str, list[Cell]] = {}
            for cell in sorted(self.cell_rep):
                domain = self.domain_ids[self.cell_rep[cell]].get(scope, "")
                if domain:
                    acc.setdefault(domain, []).append(cell)
            found = {d: tuple(c) for d, c in acc.items()}
            self._cells_by[scope] = found
        return found


class _FreeIndex:
    """What changes with free GPUs: per node masks, per domain free counts and class counts.

    Treated as immutable once built; `derive` copies only what a change touches.
    """

    __slots__ = (
        "_by_free",
        "_free_base",
        "_free_moved",
        "cell_nodes",
        "class_cells",
        "domain_classes",
        "domain_free",
        "mask",
    )

    def __init__(self) -> None:
        self.mask: _Layered[int] = _Layered({})
        # NVLINK and LEAF domains by their free GPUs: free count -> domains (for best fit).
        # Derived indexes keep it lazily (see `by_free`): None until asked.
        self._by_free: _Buckets | None = {s: {} for s in _BUCKETED}
        # What `by_free` is made from while it is None: an ancestor's buckets and the bucketed
        # domains moved since, with their free counts in that ancestor.
        self._free_base: _Buckets = self._by_free
        self._free_moved: dict[tuple[Scope, str], int] = {}
        self.domain_free: dict[Scope, dict[str, int]] = {s: {} for s in _INDEXED_SCOPES}
        self.domain_classes: dict[Scope, dict[str, dict[NodeClass, int]]] = {
            s: {} for s in _INDEXED_SCOPES
        }
        self.cell_nodes: dict[Cell, dict[NodeClass, frozenset[str]]] = {}
        self.class_cells: dict[NodeClass, frozenset[Cell]] = {}

    @staticmethod
    def build(structure: _Structure, nodes: Mapping[str, NodeState]) -> _FreeIndex:
        idx = _FreeIndex()
        cell_nodes: dict[Cell, dict[NodeClass, set[str]]] = {}
        masks: dict[str, int] = {}
        for name, state in nodes.items():
            if not structure.placeable[name]:
                continue
            mask = _mask(state.free)
            masks[name] = mask
            cls = (structure.shape[name], mask)
            ids = structure.domain_ids[name]
            free = len(state.free)
            for scope in _INDEXED_SCOPES:
                domain = ids.get(scope, "")
                if not domain:
                    continue
                df = idx.domain_free[scope]
                df[domain] = df.get(domain, 0) + free
                counts = idx.domain_classes[scope].setdefault(domain, {})
                counts[cls] = counts.get(cls, 0) + 1
            cell_nodes.setdefault(structure.cell[name], {}).setdefault(cls, set()).add(name)
        class_cells: dict[NodeClass, set[Cell]] = {}
        for cell, by_class in cell_nodes.items():
            idx.cell_nodes[cell] = {c: frozenset(v) for c, v in by_class.items()}
            for c in by_class:
                class_cells.setdefault(c, set()).add(cell)
        idx.class_cells = {c: frozenset(v) for c, v in class_cells.items()}
        idx.mask = _Layered(masks)
        by_free: _Buckets = {}
        for scope in _BUCKETED:
            buckets: dict[int, set[str]] = {}
            for domain, free in idx.domain_free[scope].items():
                buckets.setdefault(free, set()).add(domain)
            by_free[scope] = {f: frozenset(d) for f, d in buckets.items()}
        idx._by_free = idx._free_base = by_free
        return idx

    @property
    def by_free(self) -> _Buckets:
        """NVLINK and LEAF domains by free GPUs, built on first use for a derived index.

        Only a search over the whole cluster reads these buckets (`plans._tightest_cells`),
        while every reservation, churn step and in-search trial derives an index: keeping the
        moved domains and folding them on demand takes the bucket copies off that path.
        """
        found = self._by_free
        if found is None:
            found = _moved_into(self._free_base, self._free_moved, self.domain_free)
            self._by_free = found
        return found

    def derive(self, structure: _Structure, changes: Mapping[str, frozenset[int]]) -> _FreeIndex:
        """A new index with the given nodes' free sets; shares untouched entries with self."""
        out = object.__new__(_FreeIndex)  # every field is set below: skip __init__'s empties
        new_masks: dict[str, int] = {}
        out.domain_free = dict(self.domain_free)
        out.domain_classes = dict(self.domain_classes)
        out.cell_nodes = dict(self.cell_nodes)
        out.class_cells = dict(self.class_cells)
        if self._by_free is not None:
            base, moved = self._by_free, {}
        else:
            base, moved = self._free_base, self._free_moved
        shared = moved  # copied before the first new entry
        copied_free: set[Scope] = set()
        copied_classes: set[tuple[Scope, str]] = set()
        copied_scope_classes: set[Scope] = set()
        copied_cells: set[Cell] = set()
        for name, free in changes.items():
            if not structure.placeable.get(name, False):
                continue
            old_mask = self.mask[name]
            new_mask = _mask(free)
            if old_mask == new_mask:
                continue
            new_masks[name] = new_mask
            shape = structure.shape[name]
            old_cls, new_cls = (shape, old_mask), (shape, new_mask)
            delta = new_mask.bit_count() - old_mask.bit_count()
            ids = structure.domain_ids[name]
            for scope in _INDEXED_SCOPES:
                domain = ids.get(scope, "")
                if not domain:
                    continue
                if scope not in copied_free:
                    out.domain_free[scope] = dict(out.domain_free[scope])
                    copied_free.add(scope)
                if scope in _BUCKETED and (scope, domain) not in moved:
                    if moved is shared:
                        moved = dict(shared)
                    moved[scope, domain] = out.domain_free[scope][domain]
                out.domain_free[scope][domain] += delta
                if scope not in copied_scope_classes:
                    out.domain_classes[scope] = dict(out.domain_classes[scope])
                    copied_scope_classes.add(scope)
                if (scope, domain) not in copied_classes:
                    out.domain_classes[scope][domain] = dict(out.domain_classes[scope][domain])
                    copied_classes.add((scope, domain))
                counts = out.domain_classes[scope][domain]
                left = counts[old_cls] - 1
                if left:
                    counts[old_cls] = left
                else:
                    del counts[old_cls]
                counts[new_cls] = counts.get(new_cls, 0) + 1
            cell = structure.cell[name]
            if cell not in copied_cells:
                out.cell_nodes[cell] = dict(out.cell_nodes[cell])
                copied_cells.add(cell)
            by_class = out.cell_nodes[cell]
            remaining = by_class[old_cls] - {name}
            if remaining:
                by_class[old_cls] = remaining
            else:
                del by_class[old_cls]
                cells = out.class_cells[old_cls] - {cell}
                if cells:
                    out.class_cells[old_cls] = cells
                else:
                    del out.class_cells[old_cls]
            if new_cls in by_class:
                by_class[new_cls] = by_class[new_cls] | {name}
            else:
                by_class[new_cls] = frozenset((name,))
                out.class_cells[new_cls] = out.class_cells.get(new_cls, frozenset()) | {cell}
        out.mask = self.mask.changed(new_masks)
        out._free_base, out._free_moved = base, moved
        out._by_free = None
        if not moved:
            out._by_free = base
        elif len(moved) >= _MOVED_FOLD:
            # Fold now, so that a long chain of derives stays O(changes) each.
            out._by_free = _moved_into(base, moved, out.domain_free)
        return out


def _moved_into(base: _Buckets, moved: Mapping[tuple[Scope, str], int], free: _Free) -> _Buckets:
    """`base`'s buckets with each moved domain taken from its count there to its count now."""
    out = {scope: dict(b) for scope, b in base.items()}
    for (scope, domain), before in moved.items():
        after = free[scope][domain]
        if after == before:
            continue
        buckets = out[scope]
        rest = buckets[before] - {domain}
        if rest:
            buckets[before] = rest
        else:
            del buckets[before]
        buckets[after] = buckets.get(after, frozenset()) | {domain}
    return out


class ClusterSnapshot:
    """An immutable view of the cluster at one generation, with its placement indexes.

    `previous` (optional) is an older snapshot of the same cluster: nodes whose topology object
    and labels are unchanged reuse its shapes, and when only free GPUs changed the indexes are
    derived from it incrementally. `now` (unix seconds) ages out link measurements older than
    `DEFAULT_MEASUREMENT_MAX_AGE_S`; None (recordings, tests) trusts every measurement.
    """

    __slots__ = ("__dict__", "__weakref__", "_index", "_nodes", "_structure", "generation", "now")

    def __init__(
        self,
        nodes: Iterable[NodeState],
        *,
        generation: int = 0,
        previous: ClusterSnapshot | None = None,
        now: float | None = None,
    ) -> None:
        listed = list(nodes)
        given = {n.name: n for n in listed}
        if len(given) != len(listed):
            raise ValueError("duplicate node names in snapshot")
        if previous is not None and given.keys() == previous._nodes.keys():
            by_name = {name: given[name] for name in previous._nodes}  # already in name order
        else:
            by_name = {name: given[name] for name in sorted(given)}
        self._nodes: Mapping[str, NodeState] = _Layered(by_name)
        self.generation = generation
        self.now = now
        self._structure: _Structure | None = None
        self._index: _FreeIndex | None = None
        if previous is not None and previous._structure is not None:
            self._derive_from(previous, by_name)

    def _derive_from(self, previous: ClusterSnapshot, by_name: dict[str, NodeState]) -> None:
        old_nodes = previous._nodes
        prev_structure = previous._structure
        assert prev_structure is not None
        now = self.now
        expires = prev_structure.expires
        changes: dict[str, frozenset[int]] = {}
        same_structure = (now is None) == (previous.now is None) and len(by_name) == len(old_nodes)
        if same_structure:
            for name, state in by_name.items():
                old = old_nodes.get(name)
                if (
                    old is None
                    or old.topology is not state.topology
                    or old.placeable != state.placeable
                    or old.labels != state.labels
                    or (now is not None and expires[name] <= now)
                ):
                    same_structure = False
                    break
                if old.free != state.free:
                    changes[name] = state.free
        if same_structure:
            self._structure = prev_structure
            if previous._index is not None:
                self._index = previous._index.derive(prev_structure, changes)
            return
        self._structure = _Structure(
            self._nodes, now=self.now, reuse=prev_structure, reuse_nodes=old_nodes
        )

    # --- the index, built on first use ------------------------------------------------------

    @property
    def structure(self) -> _Structure:
        """Domains, shapes and cells (built on first use, shared with derived snapshots)."""
        if self._structure is None:
            self._structure = _Structure(self._nodes, now=self.now)
        return self._structure

    @property
    def index(self) -> _FreeIndex:
        """Free GPUs per domain and nodes per class (built on first use, derived after)."""
        if self._index is None:
            self._index = _FreeIndex.build(self.structure, self._nodes)
        return self._index

    def indexed(self) -> ClusterSnapshot:
        """Build the indexes now rather than on first use; returns the snapshot."""
        if self._index is None:
            self._index = _FreeIndex.build(self.structure, self._nodes)
        return self

    # --- nodes -------------------------------------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        """Nodes by name, in name order."""
        return self._nodes

    def node(self, name: str) -> NodeState:
        """One node; KeyError if unknown."""
        return self._nodes[name]

    def shape(self, name: str) -> NodeShape:
        """The node's shape (see `NodeShape`)."""
        return self.structure.shape[name]

    def free_mask(self, name: str) -> int:
        """Bit mask of the node's free GPUs (0 when it is not placeable)."""
        return self.index.mask.get(name, 0)

    def node_class(self, name: str) -> NodeClass:
        """The node's class: its shape and free mask."""
        return (self.structure.shape[name], self.index.mask.get(name, 0))

    def cell_of(self, name: str) -> Cell:
        """The node's narrowest multi-node grouping (see `Cell`)."""
        return self.structure.cell[name]

    def cells_in(self, scope: Scope, domain: str) -> tuple[Cell, ...]:
        """The cells of a domain (CLUSTER: all), in cell order."""
        if scope is Scope.CLUSTER:
            return self.structure.cells_by(Scope.CLUSTER).get("cluster", ())
        if scope is Scope.NODE:
            return (self.structure.cell[domain],)
        return self.structure.cells_by(scope).get(domain, ())

    def cell_domain(self, cell: Cell, scope: Scope) -> str:
        """A cell's domain at a scope (its representative node's)."""
        rep = self.structure.cell_rep.get(cell)
        return self.structure.domain_ids[rep].get(scope, "") if rep else ""

    @cached_property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(n.topology.gpu_count for n in self._nodes.values())

    @cached_property
    def free_gpus(self) -> int:
        """Free GPUs on placeable nodes."""
        return self.index.domain_free[Scope.CLUSTER].get("cluster", 0)

    # --- domains -----------------------------------------------------------------------------

    def domain_of(self, node: str, scope: Scope) -> str | None:
        """The id of the node's domain at a scope (None when the node has none).

        For NVLINK this is the multi-node domain, or "" when the node's NVLink domains are its
        own islands (see `nvlink_islands`).
        """
        return self.structure.domain_ids[node].get(scope)

    def domains(self, scope: Scope) -> Mapping[str, tuple[str, ...]]:
        """Domain id -> names of its nodes, for a scope; sorted by id.

        For NVLINK only multi-node domains are listed (node-local islands are per node).
        """
        return self.structure.domains[scope]

    def domain_free(self, scope: Scope, domain: str) -> int:
        """Free GPUs on the placeable nodes of a domain (NODE: of the node)."""
        if scope is Scope.NODE:
            return self.index.mask.get(domain, 0).bit_count()
        return self.index.domain_free[scope].get(domain, 0)

    def domain_total(self, scope: Scope, domain: str) -> int:
        """GPUs on the placeable nodes of a domain (NODE: of the node)."""
        if scope is Scope.NODE:
            placeable = self.structure.placeable.get(domain, False)
            return self.structure.shape[domain].gpu_count if placeable else 0
        return self.structure.total[scope].get(domain, 0)

    def domain_classes(self, scope: Scope, domain: str) -> Mapping[NodeClass, int]:
        """How many placeable nodes of each class a domain holds."""
        if scope is Scope.NODE:
            return {self.node_class(domain): 1} if self.structure.placeable[domain] else {}
        return self.index.domain_classes[scope].get(domain, {})

    def free_domains(self, scope: Scope) -> Mapping[str, int]:
        """Domain id -> free GPUs, for an indexed scope (not NODE)."""
        return self.index.domain_free[scope]

    @property
    def fit_scope(self) -> Scope | None:
        """NVLINK when every cell is a multi-node NVLink domain (or a piece of one), LEAF when
        every cell is a leaf (or a piece of one) outside any, None for a mix or nodes without
        fabric facts. With it, a cell's best-fit terms start with that domain's free GPUs, so
        cells can be visited tightest first (`domains_by_free`)."""
        return self.structure.fit_scope

    def domains_by_free(self, scope: Scope) -> Mapping[int, frozenset[str]]:
        """Free GPUs -> the domains with that many free, for NVLINK and LEAF (kept with the
        free counts, so finding the tightest domains costs their number, not the cluster's)."""
        return self.index.by_free[scope]

    def cell_nodes(self, cell: Cell) -> Mapping[NodeClass, frozenset[str]]:
        """The placeable nodes of a cell, by class."""
        return self.index.cell_nodes.get(cell, {})

    def class_cells(self, cls: NodeClass) -> frozenset[Cell]:
        """The cells that hold at least one node of a class."""
        return self.index.class_cells.get(cls, frozenset())

    def classes(self) -> Mapping[NodeClass, int]:
        """Every class in the cluster, with its node count."""
        return self.index.domain_classes[Scope.CLUSTER].get("cluster", {})

    def free_in(self, names: Iterable[str]) -> int:
        """Free GPUs on the named nodes."""
        return sum(self._nodes[n].free_count for n in names)

    # --- derived snapshots -------------------------------------------------------------------

    def with_free(
        self, changes: Mapping[str, frozenset[int]], *, generation: int | None = None
    ) -> ClusterSnapshot:
        """A new snapshot where the named nodes have the given free sets (others unchanged).

        Shares the structure and every untouched index entry with this snapshot.
        """
        out = object.__new__(ClusterSnapshot)
        replaced = {}
        for name, free in changes.items():
            s = self._nodes[name]
            replaced[name] = NodeState(s.topology, frozenset(free), s.labels, s.placeable, s.reason)
        base = self._nodes
        out._nodes = (
            base.changed(replaced) if isinstance(base, _Layered) else _Layered({**base, **replaced})
        )
        out.generation = self.generation if generation is None else generation
        out.now = self.now
        out._structure = self._structure
        out._index = None
        if self._structure is not None and self._index is not None:
            out._index = self._index.derive(self._structure, changes)
        return out
