"""Where a node sits between nodes, merged from every source that says something about it.

Sources, highest precedence first (DESIGN.md; `reference/internode.md` §7):

1. `inventory`: the static inventory file (topograph's model YAML). An admin wrote it on
   purpose, so it overrides everything.
2. `nvml`: the exporter's NVML GPU fabric info. A registered multi-node NVLink GPU knows its
   NVLink domain (cluster UUID) and partition (clique) exactly. Then whatever else the exporter
   put in its reported fabric position (cloud metadata, say), under the source it names.
3. `labels`: labels others wrote on the Node object: GFD's `nvidia.com/gpu.clique`, topograph's
   (v1 and older keys), EKS, GKE, OKE, CoreWeave, and `topology.kubernetes.io/zone`. Labels
   this aggregator owns are never read back as a source (that would be a loop).
4. `probes`: tiers inferred from exporter-to-exporter network probes. Low confidence.

Merging is per dimension, keyed the way the dimensions are used: the tier path is taken whole
from the first source that has one (mixing levels from two sources could build a tree that
exists nowhere), the accelerator domain and its sub-domain as a pair, the zone alone. A lower
source that disagrees with the chosen value is reported as a `Conflict` (shown on
`/api/v1/nodes/{name}/sources`, counted in metrics), never silently merged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gputopo.inventory import Inventory
from gputopo.topology import FabricPosition, NodeTopology

__all__ = [
    "LABEL_SOURCES",
    "Conflict",
    "FabricSources",
    "Resolution",
    "SourceFacts",
    "facts_from_labels",
    "facts_from_nvml",
    "resolve",
]

Confidence = Literal["high", "medium", "low", ""]

TIERS, ACCELERATOR, ZONE = "tiers", "accelerator", "zone"
ZONE_LABEL = "topology.kubernetes.io/zone"
GFD_CLIQUE = "nvidia.com/gpu.clique"
TOPOGRAPH_TIER = "fabric.topograph.run/tier-"
TOPOGRAPH_DOMAIN = "accelerator.topograph.run/domain"
TOPOGRAPH_SUB_DOMAIN = "accelerator.topograph.run/sub-domain"


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What one source says about a node; empty fields say nothing."""

    source: str
    confidence: Confidence
    tiers: tuple[str, ...] = ()
    accelerator_domain: str = ""
    accelerator_sub_domain: str = ""
    zone: str = ""

    def value(self, dimension: str) -> str:
        """A dimension's value as one comparable string ("" when the source is silent)."""
        if dimension == TIERS:
            return "/".join(self.tiers)
        if dimension == ACCELERATOR:
            if not (self.accelerator_domain or self.accelerator_sub_domain):
                return ""
            return f"{self.accelerator_domain}|{self.accelerator_sub_domain}"
        return self.zone


@dataclass(frozen=True, slots=True)
class Conflict:
    """A lower-precedence source that disagrees with the value chosen for a dimension."""

    dimension: str
    kept_source: str
    kept: str
    ignored_source: str
    ignored: str

    def __str__(self) -> str:
        return (
            f"{self.dimension}: {self.ignored_source} says {self.ignored!r}, "
            f"{self.kept_source} says {self.kept!r} and wins"
        )


@dataclass(frozen=True, slots=True)
class Resolution:
    """The merged fabric position of a node and where each part came from."""

    fabric: FabricPosition
    chosen: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    conflicts: tuple[Conflict, ...] = ()
    consulted: tuple[SourceFacts, ...] = ()


# --- facts from each kind of source --------------------------------------------------------------


def facts_from_nvml(topology: NodeTopology) -> SourceFacts | None:
    """The NVLink domain from NVML fabric info, when every registered GPU agrees on one.

    GFD's rule: GPUs of one node that disagree on the cluster UUID or clique say nothing usable
    (a half-registered tray), so no domain is taken from them.
    """
    cliques = {
        (g.fabric.cluster_uuid, g.fabric.clique)
        for g in topology.gpus
        if g.fabric is not None and g.fabric.usable
    }
    if len(cliques) != 1:
        return None
    ((uuid, clique),) = cliques
    return SourceFacts("nvml", "high", accelerator_domain=uuid, accelerator_sub_domain=clique)


def facts_from_report(fabric: FabricPosition) -> SourceFacts | None:
    """What the exporter reported as its fabric position, under the source it names."""
    if not (fabric.tiers or fabric.accelerator_domain or fabric.zone):
        return None
    return SourceFacts(
        fabric.source or "exporter",
        fabric.confidence or "medium",
        tiers=fabric.tiers,
        accelerator_domain=fabric.accelerator_domain,
        accelerator_sub_domain=fabric.accelerator_sub_domain,
        zone=fabric.zone,
    )


def _closest_first(labels: Mapping[str, str], keys: Iterable[str]) -> tuple[str, ...]:
    """Values of `keys` (closest first) up to the first missing one."""
    out = []
    for key in keys:
        value = labels.get(key, "")
        if not value:
            break
        out.append(value)
    return tuple(out)


def _gfd(labels: Mapping[str, str]) -> SourceFacts | None:
    clique = labels.get(GFD_CLIQUE, "")
    if not clique:
        return None
    domain = clique.rsplit(".", 1)[0] if "." in clique else clique
    return SourceFacts(
        "labels/gfd", "medium", accelerator_domain=domain, accelerator_sub_domain=clique
    )


def _topograph(labels: Mapping[str, str]) -> SourceFacts | None:
    tiers = _closest_first(labels, (f"{TOPOGRAPH_TIER}{i}" for i in range(64)))
    domain = labels.get(TOPOGRAPH_DOMAIN, "")
    if not (tiers or domain):
        return None
    return SourceFacts(
        "labels/topograph",
        "medium",
        tiers=tiers,
        accelerator_domain=domain,
        accelerator_sub_domain=labels.get(TOPOGRAPH_SUB_DOMAIN, "") if domain else "",
    )


def _topograph_legacy(labels: Mapping[str, str]) -> SourceFacts | None:
    """topograph before v1: `network.topology.nvidia.com/{leaf|block,spine,core|datacenter}`."""
    prefix = "network.topology.nvidia.com/"
    leaf = labels.get(f"{prefix}leaf") or labels.get(f"{prefix}block", "")
    core = labels.get(f"{prefix}core") or labels.get(f"{prefix}datacenter", "")
    tiers = _closest_first({"0": leaf, "1": labels.get(f"{prefix}spine", ""), "2": core}, "012")
    domain = labels.get(f"{prefix}accelerator", "")
    if not (tiers or domain):
        return None
    return SourceFacts("labels/topograph-v0", "medium", tiers=tiers, accelerator_domain=domain)


def _eks(labels: Mapping[str, str]) -> SourceFacts | None:
    """EKS numbers layers from the top (layer-1) down; the closest is the deepest present."""
    prefix = "topology.k8s.aws/network-node-layer-"
    top_down = _closest_first(labels, (f"{prefix}{i}" for i in range(1, 9)))
    domain = labels.get("topology.k8s.aws/ultraserver-id", "")
    if not (top_down or domain):
        return None
    return SourceFacts(
        "labels/eks", "medium", tiers=tuple(reversed(top_down)), accelerator_domain=domain
    )


def _gke(labels: Mapping[str, str]) -> SourceFacts | None:
    """GKE's physical topology: sub-block inside block (the host is a machine, not a switch)."""
    prefix = "cloud.google.com/gce-topology-"
    subblock, block = labels.get(f"{prefix}subblock", ""), labels.get(f"{prefix}block", "")
    tiers = (subblock, block) if subblock and block else ((block,) if block else ())
    if not tiers:
        return None
    return SourceFacts("labels/gke", "medium", tiers=tiers)


def _oke(labels: Mapping[str, str]) -> SourceFacts | None:
    prefix = "oci.oraclecloud.com/"
    tiers = _closest_first(
        labels,
        (
            f"{prefix}rdma.local_block_id",
            f"{prefix}rdma.network_block_id",
            f"{prefix}rdma.hpc_island_id",
        ),
    )
    domain = labels.get(f"{prefix}host.gpu_memory_fabric_id", "")
    rack = labels.get(f"{prefix}host.rack_id", "")
    if not (tiers or domain):
        return None
    return SourceFacts(
        "labels/oke",
        "medium",
        tiers=tiers,
        accelerator_domain=domain,
        accelerator_sub_domain=f"{domain}.{rack}" if domain and rack else "",
    )


def _coreweave(labels: Mapping[str, str]) -> SourceFacts | None:
    leaf = labels.get("ib.coreweave.cloud/leafgroup") or labels.get(
        "backend.coreweave.cloud/leafgroup", ""
    )
    tiers = _closest_first({"0": leaf, "1": labels.get("ib.coreweave.cloud/superpod", "")}, "01")
    domain = labels.get("ds.coreweave.com/nvlink.domain", "")
    if not (tiers or domain):
        return None
    return SourceFacts("labels/coreweave", "medium", tiers=tiers, accelerator_domain=domain)


def _zone(labels: Mapping[str, str]) -> SourceFacts | None:
    zone = labels.get(ZONE_LABEL, "")
    return SourceFacts("labels/zone", "medium", zone=zone) if zone else None


# Label sources in precedence order. GFD's clique comes first for the accelerator domain, as in
# topograph (`acceleratorDomainSourceLabel`: a node's gpu.clique is authoritative).
LABEL_SOURCES: tuple[tuple[str, Callable[[Mapping[str, str]], SourceFacts | None]], ...] = (
    ("gfd", _gfd),
    ("topograph", _topograph),
    ("eks", _eks),
    ("gke", _gke),
    ("oke", _oke),
    ("coreweave", _coreweave),
    ("topograph-v0", _topograph_legacy),
    ("zone", _zone),
)


def facts_from_labels(labels: Mapping[str, str]) -> list[SourceFacts]:
    """Every label source that says something, in precedence order."""
    return [facts for _, parse in LABEL_SOURCES if (facts := parse(labels)) is not None]


# --- merging -------------------------------------------------------------------------------------


def _agrees(dimension: str, kept: SourceFacts, other: SourceFacts) -> bool:
    """Whether `other` says the same as `kept`; a source silent on the sub-domain agrees."""
    if dimension != ACCELERATOR:
        return kept.value(dimension) == other.value(dimension)
    if kept.accelerator_domain != other.accelerator_domain:
        return False
    subs = (kept.accelerator_sub_domain, other.accelerator_sub_domain)
    return not all(subs) or subs[0] == subs[1]


def resolve(facts: Iterable[SourceFacts]) -> Resolution:
    """Merge facts given in precedence order (see the module docstring)."""
    ordered = tuple(facts)
    chosen: dict[str, SourceFacts] = {}
    conflicts: list[Conflict] = []
    for dimension in (TIERS, ACCELERATOR, ZONE):
        for f in ordered:
            value = f.value(dimension)
            if not value:
                continue
            winner = chosen.get(dimension)
            if winner is None:
                chosen[dimension] = f
            elif not _agrees(dimension, winner, f):
                conflicts.append(
                    Conflict(dimension, winner.source, winner.value(dimension), f.source, value)
                )
    tiers, accel, zone = chosen.get(TIERS), chosen.get(ACCELERATOR), chosen.get(ZONE)
    main = tiers or accel
    fabric = FabricPosition(
        tiers=tiers.tiers if tiers else (),
        accelerator_domain=accel.accelerator_domain if accel else "",
        accelerator_sub_domain=accel.accelerator_sub_domain if accel else "",
        zone=zone.zone if zone else "",
        source=main.source if main else "",
        confidence=main.confidence if main else "",
    )
    return Resolution(
        fabric=fabric,
        chosen=MappingProxyType({d: f.source for d, f in chosen.items()}),
        conflicts=tuple(conflicts),
        consulted=ordered,
    )


class FabricSources:
    """The sources that are not the node's own report: the inventory and inferred tiers.

    Mutable (an inventory is loaded, probes are re-inferred); `ClusterState` asks it to
    `resolve_node` whenever a node's report, its labels or these sources change.
    """

    def __init__(self, *, inventory: Inventory | None = None) -> None:
        self.inventory = inventory
        self._probe_tiers: dict[str, tuple[str, ...]] = {}

    def set_probe_tiers(self, tiers: Mapping[str, tuple[str, ...]]) -> set[str]:
        """Replace the probe-inferred tiers; returns the nodes whose tiers changed."""
        changed = {
            n
            for n in set(tiers) | set(self._probe_tiers)
            if tiers.get(n) != self._probe_tiers.get(n)
        }
        self._probe_tiers = dict(tiers)
        return changed

    def inventory_facts(self, node: str) -> SourceFacts | None:
        """What the inventory says about a node."""
        if self.inventory is None or node not in self.inventory.nodes:
            return None
        f = self.inventory.nodes[node].fabric()
        return SourceFacts(
            "inventory",
            "high",
            tiers=f.tiers,
            accelerator_domain=f.accelerator_domain,
            accelerator_sub_domain=f.accelerator_sub_domain,
            zone=f.zone,
        )

    def resolve_node(
        self, node: str, reported: NodeTopology | None, foreign_labels: Mapping[str, str]
    ) -> Resolution:
        """All sources for one node, merged. `foreign_labels` excludes labels we own."""
        facts: list[SourceFacts | None] = [self.inventory_facts(node)]
        if reported is not None:
            facts += [facts_from_nvml(reported), facts_from_report(reported.fabric)]
        facts += facts_from_labels(foreign_labels)
        probe = self._probe_tiers.get(node)
        if probe:
            facts.append(SourceFacts("probes", "low", tiers=probe))
        # A node served from the inventory (--inventory-nodes) reports the inventory's own
        # position back; the same facts from the same source are one source, listed once.
        return resolve(dict.fromkeys(f for f in facts if f is not None))
