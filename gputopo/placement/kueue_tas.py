"""A faithful port of Kueue's Topology-Aware Scheduling assignment ("kueue-bestfit" baseline).

It answers the question Kueue answers at admission: given a tree of topology domains built from
node labels, the free capacity of each leaf, and one PodSet, how many pods go to which lowest-level
domain, or why it cannot be placed. Kueue's own quirks are kept on purpose, because this module is
the honest baseline our engine is compared against, not an improvement on it. The references below
are to kubernetes-sigs/kueue, ``pkg/cache/scheduler/`` (``tas_flavor_snapshot.go`` unless noted).

Phases:

0. Tree (``tas_topology_tree.go``: ``newTopologyTree``, ``addNode``, ``initialize``; node filter
   ``pkg/util/tas``: ``NodeMatchesFlavor``). Nodes lacking any level label are left out. When the
   lowest level is ``kubernetes.io/hostname`` a leaf is one host; otherwise a leaf is a domain of
   the innermost level and sums the capacity of its nodes. Built once by :class:`TasTopology`;
   :meth:`TasTopology.with_usage` derives usage snapshots that share the tree.
1. Counts (``fillInCounts``, ``fillLeafCounts``, ``fillInCountsHelper``). Per leaf, how many pods
   fit (``CountIn`` of the per-pod request plus one ``pods`` unit); summed up the tree. At the
   slice level ``sliceCount = podCount // sliceSize``, summed above it, zero below it.
2. Level (``findLevelWithFitDomains``, ``sortedDomains``, ``findBestFitDomainBy``). From the
   requested level: if one domain fits, take the best fit (the first, in sort order, with the
   smallest count that still fits); if none fits, ``required`` fails, ``preferred`` climbs a
   level, and at the top (or when ``unconstrained``) domains are taken greedily, the last one
   best-fitted. BestFit sorts by slices descending, pods ascending, path; LeastFreeCapacity (only
   ``unconstrained`` under the default ``TASProfileMixed``) sorts slices ascending.
   With the ``TASBalancedPlacement`` gate and ``preferred`` mode, ``tas_balanced_placement.go``
   (``findBestDomainsForBalancedPlacement``, ``applyBalancedPlacementAlgorithm``) runs first.
3. Descent (``updateCountsToMinimumGeneric`` and the two loops in ``findTopologyAssignment``).
   Above the slice level, the children of *all* chosen domains are re-sorted together and taken
   greedily for the *whole* count, ignoring what each parent was given (a Kueue quirk, kept).
   At and below it, each parent's count is spread over its own children.
4. Result (``buildAssignment``): leaves with a non-zero count, sorted by path; hostname values
   only when the lowest level is the hostname, all level values otherwise.

Failure reasons are Kueue's strings (``notFitMessage`` and the checks at the top of
``findTopologyAssignment``). Not ported: leader/worker PodSet groups, multi-layer slice
constraints, partial slices, preferred node affinity, taints/tolerations and node selectors (pass
only the nodes a PodSet may use), node replacement, and the newer "virtual hostname" handling.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cmp_to_key
from typing import Literal, NamedTuple

__all__ = [
    "HOSTNAME_LABEL",
    "TasAssignment",
    "TasDomain",
    "TasFailure",
    "TasNode",
    "TasRequest",
    "TasTopology",
    "find_topology_assignment",
]

HOSTNAME_LABEL = "kubernetes.io/hostname"
PODS = "pods"

Mode = Literal["required", "preferred", "unconstrained"]

_MODES = ("required", "preferred", "unconstrained")
_MILLI = 1000
# Stands for "resource absent on this leaf"; far below zero so that it still counts as absent
# after usage is subtracted, and so that `v // r if v > 0 else 0` yields 0 for it.
_MISSING = -(1 << 62)


@dataclass(frozen=True, slots=True)
class TasNode:
    """A node as TAS sees it: topology labels, allocatable, and what is already used on it.

    Quantities are in the units of the resource (cores, bytes, devices, pod slots). ``pods`` must
    be in ``allocatable``, as on every real node: each placed pod consumes one ``pods`` unit and a
    node without it fits nothing, exactly as in Kueue.
    """

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, float]
    usage: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TasRequest:
    """One PodSet: ``pods`` pods of ``per_pod`` each, and its topology annotations.

    ``mode`` and ``level`` are ``podset-required-topology`` / ``podset-preferred-topology`` /
    ``podset-unconstrained-topology``; ``slice_level`` and ``slice_size`` are
    ``podset-slice-required-topology`` and ``podset-slice-size``. An unconstrained request with a
    slice level is Kueue's "slice-only" request: searched from the top level, unconstrained.
    """

    pods: int
    per_pod: Mapping[str, float]
    mode: Mode
    level: str | None = None
    slice_level: str | None = None
    slice_size: int | None = None

    def __post_init__(self) -> None:
        if self.pods < 0:
            raise ValueError(f"pods: must be >= 0, got {self.pods}")
        if self.mode not in _MODES:
            raise ValueError(f"mode: must be one of {_MODES}, got {self.mode!r}")
        if self.mode == "unconstrained" and self.level is not None:
            raise ValueError("level: must be None when mode is 'unconstrained'")
        if self.mode != "unconstrained" and self.level is None:
            raise ValueError(f"level: required when mode is {self.mode!r}")
        if self.slice_size is not None and self.slice_level is None:
            raise ValueError("slice_size: needs slice_level")
        if self.slice_size is not None and self.slice_size < 1:
            raise ValueError(f"slice_size: must be >= 1, got {self.slice_size}")
        if self.slice_size is not None and self.pods % self.slice_size:
            # Kueue's partial slices (tas_partial_slices.go) are not ported; without them the
            # algorithm would silently place only the whole slices.
            raise ValueError(f"pods: {self.pods} is not a multiple of slice_size {self.slice_size}")
        for name, value in self.per_pod.items():
            if value < 0:
                raise ValueError(f"per_pod[{name!r}]: must be >= 0, got {value}")


class TasDomain(NamedTuple):
    """Pods assigned to one lowest-level domain; ``values`` line up with the assignment levels."""

    values: tuple[str, ...]
    pods: int


@dataclass(frozen=True, slots=True)
class TasAssignment:
    """Kueue's ``TopologyAssignment``: domains sorted by path, zero counts left out."""

    levels: tuple[str, ...]
    domains: tuple[TasDomain, ...]

    @property
    def pods(self) -> int:
        return sum(d.pods for d in self.domains)


@dataclass(frozen=True, slots=True)
class TasFailure:
    """Why the PodSet cannot be placed, in Kueue's words."""

    reason: str


def find_topology_assignment(
    *,
    levels: Sequence[str],
    nodes: Iterable[TasNode],
    request: TasRequest,
    balanced_placement: bool = False,
    profile_mixed: bool = True,
    topology_name: str = "default",
) -> TasAssignment | TasFailure:
    """Build the tree and place one PodSet: the one-shot form of :meth:`TasTopology.assign`."""
    topology = TasTopology(levels=levels, nodes=nodes, name=topology_name)
    return topology.assign(
        request, balanced_placement=balanced_placement, profile_mixed=profile_mixed
    )


def _milli(value: float) -> int:
    """Scale to integer milli-units, as Kubernetes quantities are, so that 0.1-core arithmetic
    is exact; the scale cancels out in ``capacity // request``."""
    if isinstance(value, int):
        return value * _MILLI
    return round(value * _MILLI)


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class TasTopology:
    """The domain tree of one topology with each leaf's free capacity (Kueue's
    ``topologyTree`` plus the snapshot's leaf capacities), built once and never mutated.

    Pass only nodes the PodSet may use: Ready, schedulable, tolerated, matching its selectors
    (Kueue filters those before this algorithm). Building costs O(nodes x resources + D log D)
    for D domains. :meth:`assign` costs O(leaves x requested resources + usage + D log D) and
    allocates only per-call arrays, so one tree serves many calls and threads;
    :meth:`with_usage` gives a new snapshot sharing the tree. Balanced placement additionally
    copies the candidate subtrees and runs Kueue's subset search over them.

    Without the hostname level a leaf sums its nodes, so Kueue (and this port) may place a pod
    no single node of the leaf can hold; kube-scheduler then finds out.
    """

    __slots__ = (
        "_by_level",
        "_children",
        "_columns",
        "_leaf_by_values",
        "_leaf_nodes",
        "_leaves",
        "_node_leaf",
        "_parent",
        "_values",
        "hostname_leaves",
        "levels",
        "name",
    )

    def __init__(self, *, levels: Sequence[str], nodes: Iterable[TasNode], name: str = "default"):
        if not levels:
            raise ValueError("levels: need at least one level")
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels: must be distinct, got {list(levels)}")
        self.name = name
        self.levels: tuple[str, ...] = tuple(levels)
        self.hostname_leaves = self.levels[-1] == HOSTNAME_LABEL
        depth = len(self.levels)

        # Leaves, keyed like Kueue: by hostname alone when it is the lowest level (two nodes with
        # the same hostname share a leaf), else by the full path.
        leaf_path: dict[object, tuple[str, ...]] = {}
        leaf_free: dict[object, dict[str, int]] = {}
        leaf_nodes: dict[object, list[str]] = {}
        for node in nodes:
            if any(key not in node.labels for key in self.levels):
                continue
            path = tuple(node.labels[key] for key in self.levels)
            key: object = path[-1] if self.hostname_leaves else path
            free = leaf_free.setdefault(key, {})
            leaf_path.setdefault(key, path)
            leaf_nodes.setdefault(key, []).append(node.name)
            for res, value in node.allocatable.items():
                free[res] = free.get(res, 0) + _milli(value)
            for res, value in node.usage.items():
                free[res] = free.get(res, 0) - _milli(value)

        # Domain indices are dense and, within a level, in path order, so sorting by index is
        # Kueue's final tie-break (compareDomainLevelValues).
        prefixes: list[set[tuple[str, ...]]] = [set() for _ in range(depth)]
        for path in leaf_path.values():
            for lvl in range(depth):
                prefixes[lvl].add(path[: lvl + 1])
        index: dict[tuple[str, ...], int] = {}
        self._values: list[tuple[str, ...]] = []
        self._by_level: list[list[int]] = []
        for lvl in range(depth):
            ids = []
            for prefix in sorted(prefixes[lvl]):
                index[prefix] = len(self._values)
                ids.append(len(self._values))
                self._values.append(prefix)
            self._by_level.append(ids)
        self._parent = [index[v[:-1]] if len(v) > 1 else -1 for v in self._values]
        children: list[list[int]] = [[] for _ in self._values]
        for d, p in enumerate(self._parent):
            if p >= 0:
                children[p].append(d)
        self._children: list[tuple[int, ...]] = [tuple(c) for c in children]
        self._leaves: list[int] = self._by_level[-1]

        keys_by_path = {path: key for key, path in leaf_path.items()}
        ordered_keys = [keys_by_path[self._values[d]] for d in self._leaves]
        self._leaf_nodes: list[tuple[str, ...]] = [tuple(leaf_nodes[k]) for k in ordered_keys]
        self._node_leaf = {n: i for i, names in enumerate(self._leaf_nodes) for n in names}
        self._leaf_by_values = {self._assignment_values(d): i for i, d in enumerate(self._leaves)}
        frees = [leaf_free[k] for k in ordered_keys]
        resources = sorted({res for free in frees for res in free})
        self._columns: dict[str, list[int]] = {
            res: [free.get(res, _MISSING) for free in frees] for res in resources
        }

    def __repr__(self) -> str:
        return (
            f"TasTopology(name={self.name!r}, levels={self.levels!r}, "
            f"leaves={len(self._leaves)}, domains={len(self._values)})"
        )

    def nodes_of(self, values: Sequence[str]) -> tuple[str, ...]:
        """Names of the nodes behind one assignment domain (``TasDomain.values``)."""
        leaf = self._leaf_by_values.get(tuple(values))
        return () if leaf is None else self._leaf_nodes[leaf]

    def usage_of(
        self, assignment: TasAssignment, per_pod: Mapping[str, float]
    ) -> dict[str, dict[str, float]]:
        """Per-node usage an assignment adds (one ``pods`` unit per pod included), keyed by node.

        Without the hostname level a leaf aggregates its nodes, so its whole usage is charged to
        the leaf's first node: the leaf sums its nodes, so where inside it the usage sits does not
        change any later answer.
        """
        usage: dict[str, dict[str, float]] = {}
        for values, count in assignment.domains:
            names = self.nodes_of(values)
            if not names:
                raise ValueError(f"assignment domain {values!r} is not in this topology")
            node = usage.setdefault(names[0], {})
            for res, value in per_pod.items():
                node[res] = node.get(res, 0) + value * count
            node[PODS] = node.get(PODS, 0) + count
        return usage

    def with_usage(self, usage: Mapping[str, Mapping[str, float]]) -> TasTopology:
        """A snapshot whose free capacity also subtracts ``usage`` (node name -> resources).

        It shares the tree with this one and copies only the resource columns the usage
        touches: O(usage + leaves x touched resources), no rebuild. Unknown nodes are ignored.
        Benchmarks that place one PodSet after another keep ``assign`` free of the usage walk::

            topology = topology.with_usage(topology.usage_of(assignment, per_pod))
        """
        snapshot = object.__new__(TasTopology)
        for slot in TasTopology.__slots__:
            setattr(snapshot, slot, getattr(self, slot))
        columns = dict(self._columns)
        _subtract_usage(columns, usage, self._node_leaf, len(self._leaves), only_known=False)
        snapshot._columns = columns
        return snapshot

    def assign(
        self,
        request: TasRequest,
        *,
        usage: Mapping[str, Mapping[str, float]] | None = None,
        balanced_placement: bool = False,
        profile_mixed: bool = True,
    ) -> TasAssignment | TasFailure:
        """Place one PodSet (Kueue's ``findTopologyAssignment``).

        ``usage`` maps node names to resources used on top of the nodes' own ``usage`` (Kueue's
        TAS usage and assumed usage); unknown names are ignored, as Kueue skips usage of domains
        it does not hold. ``balanced_placement`` is the ``TASBalancedPlacement`` gate (alpha, off
        in Kueue); ``profile_mixed`` the ``TASProfileMixed`` gate (on in Kueue).
        """
        return _Run(self, request, usage, balanced_placement, profile_mixed).run()

    def _assignment_values(self, d: int) -> tuple[str, ...]:
        values = self._values[d]
        return values[-1:] if self.hostname_leaves else values


class _AssumptionViolatedError(Exception):
    """Kueue logs ``errCodeAssumptionsViolated`` here and returns a short assignment."""


class _Run:
    """Mutable state of one ``assign`` call: per-domain pod and slice counts.

    Indices below ``len(tree._values)`` are the tree's domains; balanced placement appends clones
    of candidate subtrees after them (as Kueue's ``shallowCloneWithState`` does), whose
    ``origin`` is the domain they copy, used for path order.
    """

    def __init__(
        self,
        tree: TasTopology,
        request: TasRequest,
        usage: Mapping[str, Mapping[str, float]] | None,
        balanced: bool,
        profile_mixed: bool,
    ):
        self.tree = tree
        self.request = request
        self.usage = usage or {}
        self.balanced = balanced
        self.count = request.pods
        self.required = request.mode == "required"
        self.unconstrained = request.mode == "unconstrained"
        self.least_free = self.unconstrained and profile_mixed
        self.slice_size = 1
        self.level_idx = 0
        self.slice_idx = 0
        self.total_nodes = 0
        self.excluded: dict[str, int] = {}
        size = len(tree._values)
        self.pods = [0] * size
        self.slices = [0] * size
        self.origin = list(range(size))
        self.kids: list[tuple[int, ...]] = list(tree._children)

    # -- entry -------------------------------------------------------------------------------

    def run(self) -> TasAssignment | TasFailure:
        try:
            return self._run()
        except _AssumptionViolatedError as err:
            return TasFailure(f"code assumptions violated: {err}")

    def _run(self) -> TasAssignment | TasFailure:
        tree, req = self.tree, self.request
        levels = tree.levels
        if req.slice_level is not None and req.slice_size is None:
            return TasFailure("slice topology requested, but slice size not provided")
        self.slice_size = req.slice_size or 1
        if req.level is not None:
            key = req.level
        elif req.slice_level is not None:
            key = levels[0]  # isSliceTopologyOnlyRequest: search from the top
        else:
            key = levels[-1]
        if key not in levels:
            return TasFailure(f"no requested topology level: {key}")
        self.level_idx = levels.index(key)
        slice_key = req.slice_level if req.slice_level is not None else levels[-1]
        if slice_key not in levels:
            return TasFailure(f"no requested topology level for slices: {slice_key}")
        self.slice_idx = levels.index(slice_key)
        if self.level_idx > self.slice_idx:
            return TasFailure(
                f"podset slice topology {slice_key} is above the podset topology {key}"
            )

        self._fill_in_counts()

        fit: list[int] | None = None
        fit_level = 0
        use_balanced = False
        if self.balanced and not self.required and not self.unconstrained:
            candidates, threshold = self._best_domains_for_balanced()
            if candidates is not None and threshold > 0:
                placed = self._apply_balanced(threshold, candidates)
                if placed is not None:
                    fit, fit_level = placed
                    use_balanced = True
        if fit is None:
            found = self._find_level_with_fit_domains(self.level_idx)
            if isinstance(found, TasFailure):
                return found
            fit_level, fit = found

        last = len(levels) - 1
        fit = self._update_counts(fit, self.count, self.slice_size, True)
        current = fit_level
        while not use_balanced and current < min(last, self.slice_idx):
            # Above the slice level: all children of all chosen domains, re-sorted together and
            # filled for the whole count; what each parent was given is not looked at.
            lower = [c for d in fit for c in self.kids[d]]
            fit = self._update_counts(self._sorted(lower), self.count, self.slice_size, True)
            current += 1
        while current < last:
            size = self.slice_size if current < self.slice_idx else 1
            nxt: list[int] = []
            for d in fit:
                nxt.extend(
                    self._update_counts(self._sorted(self.kids[d]), self.pods[d], size, size > 1)
                )
            fit = nxt
            current += 1
        return self._build_assignment(fit)

    # -- phase 1: counts ---------------------------------------------------------------------

    def _fill_in_counts(self) -> None:
        """``fillInCounts``: pods that fit in each leaf, summed up the tree, and slices at and
        above the slice level. Works column by column (one list per requested resource), with
        usage subtracted into copies, so a call costs O(leaves x requested resources)."""
        tree = self.tree
        requests = {res: _milli(v) for res, v in self.request.per_pod.items()}
        requests[PODS] = requests.get(PODS, 0) + _MILLI
        # A zero request never limits (CountIn counts it as MaxInt32), so it is left out.
        ordered = sorted((res, amount) for res, amount in requests.items() if amount)
        n_leaves = len(tree._leaves)
        columns = {res: tree._columns.get(res) or [_MISSING] * n_leaves for res, _ in ordered}
        _subtract_usage(columns, self.usage, tree._node_leaf, n_leaves, only_known=True)

        counts = [2**31 - 1] * n_leaves
        for res, amount in ordered:
            fits = [v // amount if v > 0 else 0 for v in columns[res]]
            counts = list(map(min, counts, fits))

        self.total_nodes = n_leaves
        for i, count in enumerate(counts):
            if count == 0:
                limiting = _limiting_resource(ordered, columns, i)
                self.excluded[limiting] = self.excluded.get(limiting, 0) + 1
        pods = self.pods
        first_leaf = tree._leaves[0] if n_leaves else 0
        pods[first_leaf : first_leaf + n_leaves] = counts  # leaves are the last index block
        parent = tree._parent
        for lvl in range(len(tree.levels) - 1, 0, -1):
            for d in tree._by_level[lvl]:
                pods[parent[d]] += pods[d]
        slices, size = self.slices, self.slice_size
        for d in tree._by_level[self.slice_idx]:
            slices[d] = pods[d] // size
        for lvl in range(self.slice_idx, 0, -1):
            for d in tree._by_level[lvl]:
                slices[parent[d]] += slices[d]

    # -- sorting and best fit ----------------------------------------------------------------

    def _sorted(self, domains: Iterable[int], *, best_fit: bool | None = None) -> list[int]:
        """``sortedDomains``: BestFit = slices desc, pods asc, path; LeastFreeCapacity = slices
        asc, pods asc, path. Without leaders ``sortedDomainsWithLeader`` sorts the same way."""
        pods, slices, origin = self.pods, self.slices, self.origin
        if best_fit is None:
            best_fit = not self.least_free
        # Decorate-sort-undecorate: no Python call per element. Paths are unique within a
        # level, so the trailing `d` never decides the order.
        if best_fit:
            keyed = sorted([(-slices[d], pods[d], origin[d], d) for d in domains])
        else:
            keyed = sorted([(slices[d], pods[d], origin[d], d) for d in domains])
        return [item[3] for item in keyed]

    @staticmethod
    def _best_fit(domains: Sequence[int], start: int, needed: int, state: list[int]) -> int:
        """``findBestFitDomainBy``: the first domain with the smallest state still >= needed, or
        the first domain when none fits."""
        best = domains[start]
        best_state = state[best]
        for d in domains[start:]:
            s = state[d]
            if needed <= s < best_state:
                best, best_state = d, s
        return best

    # -- phase 2a: level ---------------------------------------------------------------------

    def _find_level_with_fit_domains(self, level: int) -> tuple[int, list[int]] | TasFailure:
        while True:
            domains = self.tree._by_level[level]
            if not domains:
                return TasFailure(f"no topology domains at level: {self.tree.levels[level]}")
            ordered = self._sorted(domains)
            top = ordered[0]
            needed = self.count // self.slice_size
            slices = self.slices
            if not self.least_free and slices[top] >= needed:
                top = self._best_fit(ordered, 0, needed, slices)
            if self.least_free:
                # Required never reaches here: a request is either required or unconstrained.
                for d in ordered:
                    if slices[d] >= needed:
                        return level, [d]
            if slices[top] >= needed:
                return level, [top]
            if self.required:
                return self._not_fit(slices[top], needed)
            if level > 0 and not self.unconstrained:
                level -= 1
                continue
            # Kueue sorts the leader-first order again by worker capacity here; without leaders
            # both orders are the same, so `ordered` is reused.
            chosen: list[int] = []
            remaining = needed
            for i, candidate in enumerate(ordered):
                if remaining <= 0:
                    break
                d = candidate
                if not self.least_free and slices[d] >= remaining:
                    d = self._best_fit(ordered, i, remaining, slices)
                chosen.append(d)
                remaining -= slices[d]
            if remaining > 0:
                return self._not_fit(needed - remaining, needed)
            return level, chosen

    def _not_fit(self, fit: int, total: int) -> TasFailure:
        unit = "pod" if self.slice_size == 1 else "slice"
        name = _go_quote(self.tree.name)
        if fit == 0:
            reason = f"topology {name} doesn't allow to fit any of {total} {unit}(s)"
        else:
            reason = f"topology {name} allows to fit only {fit} out of {total} {unit}(s)"
        if self.excluded:
            parts = sorted(f"resource {_go_quote(res)}: {n}" for res, n in self.excluded.items())
            reason += f". Total nodes: {self.total_nodes}; excluded: {', '.join(parts)}"
        return TasFailure(reason)

    # -- phase 2b: descent -------------------------------------------------------------------

    def _update_counts(
        self, domains: Sequence[int], count: int, size: int, by_slices: bool
    ) -> list[int]:
        """``updateCountsToMinimumGeneric`` without leaders: take domains in order until
        ``count`` is covered; the domain that can finish it is swapped for its best fit."""
        pods, slices = self.pods, self.slices
        state = slices if by_slices else pods
        remaining = count // size if by_slices else count
        best_fit = not self.least_free
        result: list[int] = []
        for i, candidate in enumerate(domains):
            d = candidate
            if best_fit and state[d] >= remaining:
                d = self._best_fit(domains, i, remaining, state)
            result.append(d)
            if state[d] >= remaining:
                if by_slices:
                    pods[d] = remaining * size
                    slices[d] = remaining
                else:
                    pods[d] = remaining
                return result
            if by_slices:
                pods[d] = slices[d] * size
            remaining -= state[d]
        raise _AssumptionViolatedError(f"{remaining} left after all {len(domains)} domains")

    # -- phase 2c: result --------------------------------------------------------------------

    def _build_assignment(self, leaves: list[int]) -> TasAssignment:
        tree = self.tree
        first = len(tree.levels) - 1 if tree.hostname_leaves else 0
        domains = tuple(
            TasDomain(tree._values[self.origin[d]][first:], self.pods[d])
            for d in sorted(leaves, key=lambda d: self.origin[d])
            if self.pods[d] != 0
        )
        return TasAssignment(tree.levels[first:], domains)

    # -- balanced placement (tas_balanced_placement.go) -------------------------------------

    def _best_domains_for_balanced(self) -> tuple[list[int] | None, int]:
        """``findBestDomainsForBalancedPlacement``: for each group of sibling domains at the
        requested level (children of one parent), the largest threshold T = "at least T slices
        per used domain one level down" a greedy fill allows, after pruning what holds less than
        T; ties go to the group using fewer domains at the requested level."""
        needed = self.count // self.slice_size
        if needed == 0:
            return None, 0
        tree, level = self.tree, self.level_idx
        if level == 0:
            groups = [list(tree._by_level[0])]
        else:
            groups = [list(self.kids[p]) for p in tree._by_level[level - 1]]
        best_threshold, best_count = 0, 0
        best: list[int] | None = None
        for siblings in groups:
            candidates = [self._clone(d) for d in siblings]
            lower = candidates
            if level < self.slice_idx:
                lower = [c for d in candidates for c in self.kids[d]]
            fits, used, last = self._greedy(lower, needed)
            if not fits:
                continue
            threshold = needed // used
            if last is not None:
                threshold = min(threshold, self.slices[last])
            if threshold < best_threshold:
                continue
            self._prune(candidates, threshold, level)
            fits, used, _ = self._greedy(candidates, needed)
            if not fits:
                continue
            if threshold > best_threshold or used < best_count:
                best_threshold, best_count, best = threshold, used, candidates
        return best, best_threshold

    def _apply_balanced(
        self, threshold: int, candidates: list[int]
    ) -> tuple[list[int], int] | None:
        """``applyBalancedPlacementAlgorithm``; None when it gives up (Kueue then logs the
        reason and falls back to BestFit)."""
        needed = self.count // self.slice_size
        fit_level = self.level_idx
        if self.level_idx < self.slice_idx:
            chosen = self._select_optimal_set(candidates, needed, by_entropy=True)
            if chosen is None:
                return None
            candidates = [c for d in chosen for c in self.kids[d]]
            fit_level += 1
        chosen = self._select_optimal_set(candidates, needed, by_entropy=False)
        if chosen is None or needed < len(chosen) * threshold:
            return None
        chosen = self._sorted(chosen, best_fit=True)
        extra = needed - len(chosen) * threshold
        for d in chosen:
            take = min(self.slices[d] - threshold, extra) if extra > 0 else 0
            self.slices[d] = threshold + take
            self.pods[d] = (threshold + take) * self.slice_size
            extra -= take
        if extra > 0:
            return None
        return chosen, fit_level

    def _greedy(self, domains: Sequence[int], needed: int) -> tuple[bool, int, int | None]:
        """``evaluateGreedyAssignment``: (fits, domains used, last domain used), BestFit order."""
        used, last, remaining = 0, None, needed
        for d in self._sorted(domains, best_fit=True):
            if remaining <= 0 or self.slices[d] <= 0:
                break
            used += 1
            last = d
            remaining -= self.slices[d]
        return remaining <= 0, used, last

    def _select_optimal_set(
        self, domains: list[int], needed: int, *, by_entropy: bool
    ) -> list[int] | None:
        """``selectOptimalDomainSetToFit``: among subsets of as many domains as the greedy fill
        uses, the one left with the least spare capacity (dynamic programming over pods left)."""
        fits, size, _ = self._greedy(domains, needed)
        if not fits:
            return None
        if by_entropy:
            entropy = {d: self._entropy(d) for d in domains}

            def compare(a: int, b: int) -> int:
                return self._by_entropy(a, b, entropy)

            ordered = sorted(domains, key=cmp_to_key(compare))
        else:
            ordered = sorted(domains, key=lambda d: self.origin[d])
        placements: list[dict[int, list[int]]] = [{} for _ in range(size + 1)]
        placements[0][needed * self.slice_size] = []
        for d in ordered:
            if self.slices[d] <= 0:
                continue
            for i in range(size, 0, -1):
                before, after = placements[i - 1], placements[i]
                for left in sorted(before):
                    if left > 0:
                        after.setdefault(left - self.pods[d], before[left] + [d])
        finished = [left for left in placements[size] if left <= 0]
        return placements[size][max(finished)] if finished else None

    def _by_entropy(self, a: int, b: int, entropy: dict[int, float]) -> int:
        """``compareDomainCapacityAndEntropy``: slices desc, children's balance desc, path."""
        if self.slices[a] != self.slices[b]:
            return self.slices[b] - self.slices[a]
        if entropy[a] != entropy[b]:
            return 1 if entropy[b] > entropy[a] else -1
        return self.origin[a] - self.origin[b]

    def _entropy(self, d: int) -> float:
        counts = [self.pods[c] for c in self.kids[d]]
        total = sum(counts)
        if total == 0:
            return 0.0
        return -sum(c / total * math.log2(c / total) for c in counts if c > 0)

    def _clone(self, d: int) -> int:
        """``cloneDomain``: a copy of the subtree with its own counts, so pruning one candidate
        group leaves the tree (needed by the BestFit fallback) untouched."""
        clone = len(self.pods)
        self.pods.append(self.pods[d])
        self.slices.append(self.slices[d])
        self.origin.append(self.origin[d])
        self.kids.append(())
        self.kids[clone] = tuple(self._clone(c) for c in self.kids[d])
        return clone

    def _prune(self, domains: list[int], threshold: int, level: int) -> None:
        """``pruneDomainsBelowThreshold``: drop children under the threshold, recount, then drop
        the domains themselves if they fall under it."""
        for d in domains:
            for c in self.kids[d]:
                self._prune_node(c, threshold)
        for d in domains:
            self._recount(d, level)
            self._prune_node(d, threshold)

    def _prune_node(self, d: int, threshold: int) -> None:
        if self.slices[d] < threshold:
            self._clear(d)

    def _clear(self, d: int) -> None:
        self.pods[d] = 0
        self.slices[d] = 0
        for c in self.kids[d]:
            self._clear(c)

    def _recount(self, d: int, level: int) -> None:
        """``fillInCountsHelper`` on one (cloned) subtree."""
        kids = self.kids[d]
        if not kids:
            if level == self.slice_idx:
                self.slices[d] = self.pods[d] // self.slice_size
            return
        pods = slices = 0
        for c in kids:
            self._recount(c, level + 1)
            pods += self.pods[c]
            slices += self.slices[c]
        self.pods[d] = pods
        self.slices[d] = pods // self.slice_size if level == self.slice_idx else slices


def _subtract_usage(
    columns: dict[str, list[int]],
    usage: Mapping[str, Mapping[str, float]],
    node_leaf: Mapping[str, int],
    n_leaves: int,
    *,
    only_known: bool,
) -> None:
    """Subtract per-node usage from per-leaf resource columns, copying a column before its
    first change (the tree's columns are shared). With ``only_known`` resources without a
    column are skipped; otherwise they get one, absent everywhere, as Kueue's ``Sub`` does."""
    copied: set[str] = set()
    for node, used in usage.items():
        leaf = node_leaf.get(node)
        if leaf is None:
            continue
        for res, value in used.items():
            if res not in copied:
                column = columns.get(res)
                if column is None and only_known:
                    continue
                columns[res] = [_MISSING] * n_leaves if column is None else column.copy()
                copied.add(res)
            columns[res][leaf] -= _milli(value)


def _limiting_resource(
    requests: list[tuple[str, int]], columns: Mapping[str, list[int]], leaf: int
) -> str:
    """The resource ``CountInWithLimitingResource`` blames for a leaf that fits no pod.

    Kueue walks a Go map (random order), returns at the first absent resource, and otherwise
    names the smallest count, ties broken by name. Walking by name gives the same answer except
    when several requested resources are absent, where Kueue's own answer is random.
    """
    best, best_count = "", -1
    for res, amount in requests:
        value = columns[res][leaf]
        if value == _MISSING:
            return res
        count = value // amount if value > 0 else 0
        if best_count < 0 or count < best_count:
            best, best_count = res, count
    return best
