"""Which labels a node should carry, and the smallest patch that gets it there without touching
anyone else's.

Keys (the default `topograph-v1` scheme; `reference/internode.md` §7a):

- `fabric.topograph.run/tier-N` (N = 0 closest), `accelerator.topograph.run/domain` and
  `.../sub-domain`: topograph v1's keys, so its consumers (NVSentinel, GPUStack, NFD) work
  unchanged. `topograph-v0` writes `network.topology.nvidia.com/{leaf,spine,core,accelerator}`
  instead, and `own` only the project's own prefix (for clusters that also run topograph).
- Under the project's prefix (default `gputopo.io/`): fixed-depth `leaf`, `spine`, `core`
  aliases (a static Kueue/KAI Topology needs every node to have every level: shallower paths are
  padded with their topmost tier), `nvlink-domain-size` (GPUs one NVLink domain joins: a
  node's largest NVLink island, or the whole multi-node domain), `interconnect` (`mnnvl`,
  `nvswitch`, `nvlink`, `pcie`, `none`), `gpu-count`, `numa-count`, `nic-count`,
  `degraded-links`, `stale`, `topology-generation`, and the provenance of the fabric facts
  (`topology-source`, `topology-confidence`).

Values are valid label values: as they are when they already are (<= 63 characters of
`[-A-Za-z0-9_.]`, alphanumeric at both ends), else `x` + the FNV-64a hash of the value in hex,
topograph's rule for long values (applied here to invalid characters too).

Ownership is the API server's own record (`metadata.managedFields`): labels are written with
server-side apply under the field manager `gputopo`, never forced (`plan_patch` plans what to
apply). A key the node carries that `gputopo` does not own belongs to someone else and is never
changed or removed: it is reported as foreign, and read as a source like any other label. When
another manager (topograph, a person with kubectl) changes a key `gputopo` set, the server
hands the key to that manager, and from then on it is theirs: no label war. The
`topology-generation` counter lives on the node too (with the `<prefix>topology-fingerprint`
annotation it counts changes of), so a restarted aggregator continues it rather than starting
over at 1.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gputopo.cluster import nvlink_islands
from gputopo.links import LinkKind
from gputopo.topology import NodeTopology

__all__ = [
    "LabelPatch",
    "LabelScheme",
    "NodeFacts",
    "desired_labels",
    "fingerprint",
    "fnv64a",
    "label_value",
    "plan_patch",
    "tier_value",
]

_VALID_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_MAX_VALUE = 63
Profile = Literal["topograph-v1", "topograph-v0", "own"]


def fnv64a(text: str) -> int:
    """FNV-1a, 64 bits (topograph hashes long label values with it)."""
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def label_value(value: str) -> str:
    """A valid label value for `value` (see the module docstring)."""
    if len(value) <= _MAX_VALUE and _VALID_VALUE.fullmatch(value):  # `$` would pass a final \n
        return value
    return f"x{fnv64a(value):016x}"


@dataclass(frozen=True, slots=True)
class LabelScheme:
    """The label keys to write."""

    profile: Profile = "topograph-v1"
    prefix: str = "gputopo.io/"

    def tier_key(self, tier: int) -> str:
        """Key of fabric tier `tier` (0 = closest)."""
        if self.profile == "topograph-v1":
            return f"fabric.topograph.run/tier-{tier}"
        if self.profile == "topograph-v0":
            return f"network.topology.nvidia.com/{('leaf', 'spine', 'core')[tier]}"
        return f"{self.prefix}tier-{tier}"

    def max_tiers(self) -> int | None:
        """How many tiers the scheme can name (None: any)."""
        return 3 if self.profile == "topograph-v0" else None

    @property
    def domain_key(self) -> str:
        """Key of the multi-node NVLink domain."""
        if self.profile == "topograph-v1":
            return "accelerator.topograph.run/domain"
        if self.profile == "topograph-v0":
            return "network.topology.nvidia.com/accelerator"
        return f"{self.prefix}accelerator-domain"

    @property
    def sub_domain_key(self) -> str | None:
        """Key of the partition inside the domain (None: the scheme has none)."""
        if self.profile == "topograph-v1":
            return "accelerator.topograph.run/sub-domain"
        if self.profile == "topograph-v0":
            return None
        return f"{self.prefix}accelerator-sub-domain"

    def own(self, name: str) -> str:
        """A key under the project's prefix."""
        return f"{self.prefix}{name}"

    @property
    def fingerprint_annotation(self) -> str:
        """Annotation with the fingerprint the generation label counts changes of."""
        return self.own("topology-fingerprint")

    @property
    def generation_key(self) -> str:
        """Label with the node's topology generation."""
        return self.own("topology-generation")

    @property
    def stale_key(self) -> str:
        """Label saying the node stopped reporting."""
        return self.own("stale")

    def alias_keys(self) -> tuple[str, str, str]:
        """Fixed-depth aliases of tiers 0, 1, 2."""
        return (self.own("leaf"), self.own("spine"), self.own("core"))


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the labels of one node are computed from."""

    topology: NodeTopology
    stale: bool = False
    generation: int = 1
    nvlink_domain_gpus: int = 0  # GPUs in the node's multi-node NVLink domain (0: none)
    ambiguous_tiers: frozenset[int] = frozenset()  # tiers whose raw value is not unique


def fingerprint(topology: NodeTopology) -> str:
    """A short hash of what the generation label counts: the node's structure and health.

    Measured bandwidths and timestamps are left out: they move all the time and no label
    depends on them.
    """
    parts: list[str] = [topology.name]
    parts += [f"g{g.index}:{g.name}:{g.nvlink_lanes}:{g.health.name}" for g in topology.gpus]
    parts += [f"n{n.index}:{n.name}:{n.kind.name}:{n.up}:{n.speed_mbps}" for n in topology.nics]
    parts += [f"m{n.id}" for n in topology.numa_nodes]
    parts += [
        f"l{lk.a}-{lk.b}:{lk.kind.name}:{lk.lanes}/{lk.max_lanes}:{lk.health.name}"
        for lk in topology.links
    ]
    f = topology.fabric
    parts.append(f"f{'/'.join(f.tiers)}|{f.accelerator_domain}|{f.accelerator_sub_domain}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _interconnect(topology: NodeTopology, multi_node: bool) -> str:
    if multi_node:
        return "mnnvl"
    nvlinks = [lk for lk in topology.gpu_links() if lk.kind is LinkKind.NVLINK]
    if any(lk.via_switch for lk in nvlinks):
        return "nvswitch"
    if nvlinks:
        return "nvlink"
    return "pcie" if topology.gpu_count > 1 else "none"


def tier_value(tiers: tuple[str, ...], tier: int, *, ambiguous: bool) -> str:
    """A tier's label value, unique cluster-wide: the raw id, or a hash of its path when the
    raw id is `ambiguous` (reused under another parent; Volcano's label discovery needs
    globally unique values). Scheduler objects that name tiers use it too, so they match."""
    if ambiguous:
        return f"x{fnv64a('/'.join(reversed(tiers[tier:]))):016x}"
    return label_value(tiers[tier])


def desired_labels(facts: NodeFacts, scheme: LabelScheme) -> dict[str, str]:
    """Every label this aggregator wants on the node (see the module docstring)."""
    topo = facts.topology
    fabric = topo.fabric
    out: dict[str, str] = {}
    tiers = fabric.tiers[: scheme.max_tiers()] if scheme.max_tiers() else fabric.tiers
    values = [
        tier_value(fabric.tiers, i, ambiguous=i in facts.ambiguous_tiers) for i in range(len(tiers))
    ]
    for i, value in enumerate(values):
        out[scheme.tier_key(i)] = value
    if values:
        for i, key in enumerate(scheme.alias_keys()):
            out[key] = values[min(i, len(values) - 1)]
    if fabric.accelerator_domain:
        out[scheme.domain_key] = label_value(fabric.accelerator_domain)
        if scheme.sub_domain_key and fabric.accelerator_sub_domain:
            out[scheme.sub_domain_key] = label_value(fabric.accelerator_sub_domain)
    if fabric.source:
        out[scheme.own("topology-source")] = label_value(fabric.source.replace("/", "."))
    if fabric.confidence:
        out[scheme.own("topology-confidence")] = fabric.confidence
    multi = facts.nvlink_domain_gpus > 0
    islands = nvlink_islands(topo)
    size = facts.nvlink_domain_gpus if multi else max((len(i) for i in islands), default=0)
    out[scheme.own("nvlink-domain-size")] = str(size)
    out[scheme.own("interconnect")] = _interconnect(topo, multi)
    out[scheme.own("gpu-count")] = str(topo.gpu_count)
    out[scheme.own("numa-count")] = str(len(topo.numa_nodes))
    out[scheme.own("nic-count")] = str(len(topo.nics))
    out[scheme.own("degraded-links")] = str(len(topo.degraded_links))
    out[scheme.stale_key] = "true" if facts.stale else "false"
    out[scheme.generation_key] = str(facts.generation)
    return out


@dataclass(frozen=True, slots=True)
class LabelPatch:
    """What to apply to one node, and what that changes.

    `apply_labels`/`apply_annotations` are the whole of what gputopo claims after the apply
    (server-side apply removes an owned key left out); `labels`/`annotations` are the changes
    that makes (None removes), for logs and `--dry-run`; `foreign` the desired keys skipped
    because another manager owns them.
    """

    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    foreign: tuple[str, ...] = ()
    apply_labels: Mapping[str, str] = field(default_factory=dict)
    apply_annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing changes: no apply is needed."""
        return not self.labels and not self.annotations

    def describe(self, current: Mapping[str, str]) -> list[str]:
        """One line per label change, for `--dry-run` and logs."""
        lines = []
        for key, value in sorted(self.labels.items()):
            if value is None:
                lines.append(f"-{key}")
            elif key in current:
                lines.append(f"~{key}: {current[key]} -> {value}")
            else:
                lines.append(f"+{key}={value}")
        return lines


def plan_patch(
    *,
    labels: Mapping[str, str],
    managers: Mapping[str, frozenset[str]],
    me: str,
    desired: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    annotation_managers: Mapping[str, frozenset[str]] | None = None,
    extra_annotations: Mapping[str, str] | None = None,
    keep: Iterable[str] = (),
) -> LabelPatch:
    """What manager `me` applies to move a node's labels to `desired`, touching only its own.

    1. A desired key the node carries that `me` does not own is foreign: left alone.
    2. So is one `me` shares with another manager when the value would change (an apply
       without force cannot take it, and must not).
    3. Otherwise a desired key is applied (and owned from then on).
    4. An owned key no longer desired is left out of the apply, so the server removes it,
       unless listed in `keep` (applied as it is) or another manager owns it too (it stays).
    5. Annotations: `extra_annotations` are applied; annotations `me` owns that are not in it
       are kept as they are (a stale node keeps its fingerprint).
    """
    annotations = annotations or {}
    apply: dict[str, str] = {}
    out: dict[str, str | None] = {}
    foreign = []
    for key, value in desired.items():
        owners = managers.get(key, frozenset())
        if key in labels and (me not in owners or (owners - {me} and labels[key] != value)):
            foreign.append(key)
            continue
        apply[key] = value
        if labels.get(key) != value:
            out[key] = value
    owned = {k for k, who in managers.items() if me in who and k in labels}
    for key in sorted(owned - set(apply)):
        if key in keep:
            apply[key] = labels[key]
        elif key not in foreign and not managers[key] - {me}:
            out[key] = None
    mine_ann = {k for k, who in (annotation_managers or {}).items() if me in who}
    apply_ann = {k: annotations[k] for k in mine_ann if k in annotations}
    apply_ann |= dict(extra_annotations or {})
    ann: dict[str, str | None] = {k: v for k, v in apply_ann.items() if annotations.get(k) != v}
    return LabelPatch(
        labels=out,
        annotations=ann,
        foreign=tuple(sorted(foreign)),
        apply_labels=apply,
        apply_annotations=apply_ann,
    )
