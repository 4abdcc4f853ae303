"""The cluster as placement sees it: an immutable snapshot of nodes, their free GPUs, and the
domains (NVLink domains, leaves, spines, zones) that group them.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from gputopo.links import LinkKind
from gputopo.request import Scope
from gputopo.topology import NodeTopology

__all__ = [
    "ClusterSnapshot",
    "DomainKey",
    "NodeState",
    "nvlink_islands",
]

_TIER_OF_SCOPE = {Scope.LEAF: 0, Scope.SPINE: 1, Scope.CORE: 2}

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
    parent = list(range(topology.gpu_count))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in topology.gpu_links():
        if link.kind is LinkKind.NVLINK and link.bandwidth_gbps() > 0:
            ra, rb = find(link.a.index), find(link.b.index)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, set[int]] = {}
    for g in range(topology.gpu_count):
        groups.setdefault(find(g), set()).add(g)
    return tuple(sorted((frozenset(s) for s in groups.values()), key=min))


def _nvlink_domain(topology: NodeTopology) -> str:
    """The multi-node NVLink domain of a node, or "" when its NVLink stays inside the node."""
    fabric = topology.fabric
    if fabric.accelerator_sub_domain:
        return fabric.accelerator_sub_domain
    if fabric.accelerator_domain:
        return fabric.accelerator_domain
    cliques = {g.fabric.clique for g in topology.gpus if g.fabric is not None and g.fabric.usable}
    return cliques.pop() if len(cliques) == 1 else ""


class ClusterSnapshot:
    """An immutable view of the cluster at one generation.

    Indexes (domain membership, free GPUs per domain) are computed on first use and cached;
    the snapshot never changes after construction, so they never go stale.
    """

    __slots__ = ("__dict__", "__weakref__", "_nodes", "generation")

    def __init__(self, nodes: Iterable[NodeState], *, generation: int = 0) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        names = [n.name for n in ordered]
        if len(set(names)) != len(names):
            raise ValueError("duplicate node names in snapshot")
        self._nodes: Mapping[str, NodeState] = MappingProxyType({n.name: n for n in ordered})
        self.generation = generation

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        """Nodes by name, in name order."""
        return self._nodes

    def node(self, name: str) -> NodeState:
        """One node; KeyError if unknown."""
        return self._nodes[name]

    @cached_property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(n.topology.gpu_count for n in self._nodes.values())

    @cached_property
    def free_gpus(self) -> int:
        """Free GPUs on placeable nodes."""
        return sum(n.free_count for n in self._nodes.values())

    def domain_of(self, node: str, scope: Scope) -> str | None:
        """The id of the node's domain at a scope (None when the node has none).

        For NVLINK this is the multi-node domain, or "" when the node's NVLink domains are its
        own islands (see `nvlink_islands`).
        """
        return self._domain_ids[node].get(scope)

    @cached_property
    def _domain_ids(self) -> Mapping[str, Mapping[Scope, str]]:
        out: dict[str, Mapping[Scope, str]] = {}
        for name, state in self._nodes.items():
            fabric = state.topology.fabric
            ids: dict[Scope, str] = {Scope.NODE: name, Scope.CLUSTER: "cluster"}
            ids[Scope.NVLINK] = _nvlink_domain(state.topology)
            for scope, tier in _TIER_OF_SCOPE.items():
                if len(fabric.tiers) > tier:
                    ids[scope] = "/".join(reversed(fabric.tiers[tier:]))
            zone = fabric.zone or state.labels.get("topology.kubernetes.io/zone", "")
            if zone:
                ids[Scope.ZONE] = zone
            out[name] = MappingProxyType(ids)
        return MappingProxyType(out)

    def domains(self, scope: Scope) -> Mapping[str, tuple[str, ...]]:
        """Domain id -> names of its nodes, for a scope; sorted by id.

        For NVLINK only multi-node domains are listed (node-local islands are per node).
        """
        return self._domains[scope]

    @cached_property
    def _domains(self) -> Mapping[Scope, Mapping[str, tuple[str, ...]]]:
        by_scope: dict[Scope, dict[str, list[str]]] = {s: {} for s in Scope}
        for name, ids in self._domain_ids.items():
            for scope, domain in ids.items():
                if domain:
                    by_scope[scope].setdefault(domain, []).append(name)
        return MappingProxyType(
            {
                scope: MappingProxyType({d: tuple(members[d]) for d in sorted(members)})
                for scope, members in by_scope.items()
            }
        )

    def free_in(self, names: Iterable[str]) -> int:
        """Free GPUs on the named nodes."""
        return sum(self._nodes[n].free_count for n in names)

    def with_free(
        self, changes: Mapping[str, frozenset[int]], *, generation: int | None = None
    ) -> ClusterSnapshot:
        """A new snapshot where the named nodes have the given free sets (others unchanged)."""
        nodes = [
            NodeState(s.topology, changes[s.name], s.labels, s.placeable, s.reason)
            if s.name in changes
            else s
            for s in self._nodes.values()
        ]
        return ClusterSnapshot(
            nodes, generation=self.generation if generation is None else generation
        )
