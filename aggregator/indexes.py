"""Free and total GPUs per domain, kept up to date one node at a time.

Why here and not only in the snapshot: the label publisher (NVLink domain sizes), the metrics
collector and `/api/v1` need per-domain figures after every report, and rebuilding a cluster
snapshot per report costs O(nodes). This index costs O(levels) per changed node.

Domain identities are the placement snapshot's own (`gputopo.cluster.domain_ids`), so a domain
here is the same domain placement reasons about:

- `node`: the node; `nvlink`: a multi-node NVLink domain (sub-domain when the node has one);
- `tier-0`, `tier-1`, ...: fabric tiers closest first, each keyed by its whole path upwards
  (`core/spine-1/leaf-2`), so a leaf name reused under two spines is two leaves;
- `zone`: the node's zone.

Levels are `gputopo.domains.Level`s, spelt as the metrics, GetTopology and rejections spell them.

Totals count every GPU of every known node; `free` counts free GPUs of placeable nodes only
(a stale node contributes GPUs to `total` and nothing to `free`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gputopo.cluster import domain_ids
from gputopo.domains import NODE, NVLINK, ZONE, Level, level_tier, tier_level, tier_path
from gputopo.request import Scope
from gputopo.topology import NodeTopology

__all__ = ["DomainIndex", "DomainStats", "node_domains"]


def node_domains(topology: NodeTopology, labels: Mapping[str, str]) -> dict[Level, str]:
    """Level -> domain id of one node, with the placement snapshot's identities (every tier
    the fabric has, not only the three a request can name)."""
    ids = domain_ids(topology, labels)
    out = {NODE: topology.name}
    nvlink = ids.get(Scope.NVLINK)
    if nvlink:
        out[NVLINK] = nvlink
    tiers = topology.fabric.tiers
    for tier in range(len(tiers)):
        out[tier_level(tier)] = tier_path(tiers, tier)
    zone = ids.get(Scope.ZONE)
    if zone:
        out[ZONE] = zone
    return out


@dataclass(slots=True)
class DomainStats:
    """One domain: its nodes and GPU counts."""

    nodes: set[str] = field(default_factory=set)
    total_gpus: int = 0
    free_gpus: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    domains: tuple[tuple[Level, str], ...]
    tiers: tuple[str, ...]
    total: int
    free: int


class DomainIndex:
    """Per-domain GPU counts, updated incrementally (see the module docstring)."""

    def __init__(self) -> None:
        self._levels: dict[str, dict[str, DomainStats]] = {}
        self._entries: dict[str, _Entry] = {}
        # tier level -> raw tier value -> domain ids (paths) using it: a raw value used under
        # two different parents is ambiguous as a cluster-wide label value.
        self._raw_tiers: dict[int, dict[str, set[str]]] = {}

    def update(
        self,
        topology: NodeTopology,
        *,
        free: int,
        placeable: bool,
        labels: Mapping[str, str],
    ) -> None:
        """Set a node's contribution (replacing its previous one)."""
        name = topology.name
        self._remove(name)
        domains = tuple(sorted(node_domains(topology, labels).items()))
        tiers = topology.fabric.tiers
        entry = _Entry(domains, tiers, topology.gpu_count, free if placeable else 0)
        self._entries[name] = entry
        for level, domain in domains:
            stats = self._levels.setdefault(level, {}).setdefault(domain, DomainStats())
            stats.nodes.add(name)
            stats.total_gpus += entry.total
            stats.free_gpus += entry.free
        for tier, raw in enumerate(tiers):
            paths = self._raw_tiers.setdefault(tier, {}).setdefault(raw, set())
            paths.add(tier_path(tiers, tier))

    def remove(self, node: str) -> None:
        """Forget a node."""
        self._remove(node)

    def _remove(self, node: str) -> None:
        entry = self._entries.pop(node, None)
        if entry is None:
            return
        for level, domain in entry.domains:
            stats = self._levels[level][domain]
            stats.nodes.discard(node)
            stats.total_gpus -= entry.total
            stats.free_gpus -= entry.free
            if not stats.nodes:
                del self._levels[level][domain]
                tier = level_tier(level)
                if tier is not None:
                    self._forget_raw(tier, entry.tiers[tier], domain)

    def _forget_raw(self, tier: int, raw: str, path: str) -> None:
        paths = self._raw_tiers.get(tier, {}).get(raw)
        if paths is not None:
            paths.discard(path)
            if not paths:
                del self._raw_tiers[tier][raw]

    def domains(self, level: str) -> Mapping[str, DomainStats]:
        """Domain id -> stats at one level (live view: do not keep across changes)."""
        return self._levels.get(level, {})

    def levels(self) -> Iterator[Level]:
        """Levels that have at least one domain."""
        return (Level(level) for level, domains in self._levels.items() if domains)

    def domain_of(self, node: str, level: str) -> str | None:
        """A node's domain at a level, or None."""
        entry = self._entries.get(node)
        if entry is None:
            return None
        return next((d for lv, d in entry.domains if lv == level), None)

    def stats(self, level: str, domain: str) -> DomainStats | None:
        """One domain's stats."""
        return self._levels.get(level, {}).get(domain)

    def tier_value_is_ambiguous(self, tier: int, raw: str) -> bool:
        """Whether a tier value names switch groups under more than one parent path."""
        return len(self._raw_tiers.get(tier, {}).get(raw, ())) > 1

    def nodes_with_tier_value(self, tier: int, raw: str) -> set[str]:
        """Nodes whose tier `tier` has the raw value `raw` (under any parent)."""
        level = self._levels.get(tier_level(tier), {})
        out: set[str] = set()
        for path in self._raw_tiers.get(tier, {}).get(raw, ()):
            stats = level.get(path)
            if stats is not None:
                out |= stats.nodes
        return out

    def __len__(self) -> int:
        return len(self._entries)
