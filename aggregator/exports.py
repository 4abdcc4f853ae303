"""Scheduler objects from the cluster graph: Kueue and KAI `Topology`, Volcano `HyperNode`s and a
Slurm `topology.conf`, all from the same fabric positions and the same label keys.

- Kueue (`kueue.x-k8s.io/v1beta2`; v1beta1 is deprecated) and KAI (`kai.scheduler/v1alpha1`)
  `Topology`: `levels` of node label keys, outermost first, hostname last. `gputopo-fabric`
  uses the fixed-depth aliases (`<prefix>core`, `spine`, `leaf`) the label publisher writes on
  every node with a fabric position, cut to the depth the cluster has; `gputopo-nvlink` uses
  the accelerator domain (and sub-domain when every domain node has one), under the spine
  alias when every NVLink domain sits inside one spine.
- Volcano (`topology.volcano.sh/v1alpha1`) `HyperNode`s: tier 1 = leaf groups with their Nodes
  as members, tier k+1 = groups of tier-k HyperNodes. Names are derived from the cluster-wide
  unique tier values, so a leaf name reused under two spines makes two HyperNodes.
- Slurm `topology/tree` in topograph's format (short switch names `switch.<level>.<n>` with a
  comment naming the real switch, nodes as compact host lists, nodes without a fabric position
  under `no-topology`); `topology/block` for NVLink domains with topograph's default block sizes.

Every object carries `app.kubernetes.io/managed-by: gputopo`; `check_topology` and
`check_hypernode` are structural validators written from the consumers' CRD schemas (including
the CEL rules a 1.20 API server cannot enforce).
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggregator.labels import LabelScheme, fnv64a, tier_value
from gputopo.inventory import compact_hostlist
from gputopo.topology import FabricPosition

__all__ = [
    "HOSTNAME",
    "KAI_TOPOLOGY",
    "KUEUE_TOPOLOGY",
    "MANAGED_BY",
    "VOLCANO_HYPERNODE",
    "ObjectKind",
    "Placed",
    "check_hypernode",
    "check_topology",
    "kai_topologies",
    "kueue_topologies",
    "slurm_block",
    "slurm_tree",
    "topology_levels",
    "volcano_hypernodes",
]

HOSTNAME = "kubernetes.io/hostname"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gputopo"}
_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class ObjectKind:
    """A scheduler object kind: where it lives in the API."""

    group_version: str
    plural: str
    kind: str


# v1beta2: the stored version, whose levels may change in place while the hostname level stays
# lowest (kueue config/components/crd/bases/kueue.x-k8s.io_topologies.yaml).
KUEUE_TOPOLOGY = ObjectKind("kueue.x-k8s.io/v1beta2", "topologies", "Topology")
KAI_TOPOLOGY = ObjectKind("kai.scheduler/v1alpha1", "topologies", "Topology")
VOLCANO_HYPERNODE = ObjectKind("topology.volcano.sh/v1alpha1", "hypernodes", "HyperNode")
TIER_NAMES = ("leaf", "spine", "core")


@dataclass(frozen=True, slots=True)
class Placed:
    """A node and its place in the fabric."""

    name: str
    fabric: FabricPosition


# --- Kueue and KAI ------------------------------------------------------------------------------


def topology_levels(nodes: Sequence[Placed], scheme: LabelScheme) -> dict[str, list[str]]:
    """Topology name -> label keys, outermost first (see the module docstring)."""
    out: dict[str, list[str]] = {}
    depth = min(max((len(n.fabric.tiers) for n in nodes), default=0), 3)
    if depth:
        aliases = scheme.alias_keys()[:depth]
        out["gputopo-fabric"] = [*reversed(aliases), HOSTNAME]
    in_domain = [n for n in nodes if n.fabric.accelerator_domain]
    if in_domain:
        levels = [scheme.domain_key]
        sub_key = scheme.sub_domain_key
        if sub_key and all(n.fabric.accelerator_sub_domain for n in in_domain):
            levels.append(sub_key)
        spines: dict[str, set[tuple[str, ...]]] = {}
        for n in in_domain:
            spines.setdefault(n.fabric.accelerator_domain, set()).add(n.fabric.tiers[1:])
        if all(len(s) == 1 and next(iter(s)) for s in spines.values()):
            levels.insert(0, scheme.alias_keys()[1])
        out["gputopo-nvlink"] = [*levels, HOSTNAME]
    return out


def _topology(kind: ObjectKind, name: str, levels: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": kind.group_version,
        "kind": kind.kind,
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {"levels": [{"nodeLabel": key} for key in levels]},
    }


def kueue_topologies(nodes: Sequence[Placed], scheme: LabelScheme) -> list[dict[str, Any]]:
    """Kueue `Topology` objects for the cluster."""
    return [
        _topology(KUEUE_TOPOLOGY, name, levels)
        for name, levels in topology_levels(nodes, scheme).items()
    ]


def kai_topologies(nodes: Sequence[Placed], scheme: LabelScheme) -> list[dict[str, Any]]:
    """KAI `Topology` objects for the cluster (same levels as Kueue's)."""
    return [
        _topology(KAI_TOPOLOGY, name, levels)
        for name, levels in topology_levels(nodes, scheme).items()
    ]


def check_topology(obj: Mapping[str, Any], *, max_levels: int = 8) -> list[str]:
    """Problems that Kueue's or KAI's Topology schema would reject, one line each.

    From their CRDs: 1..`max_levels` levels (Kueue v1beta1 allows 8, v1beta2 and KAI 16; 8 is the
    default, so an object fits either Kueue version), each a
    qualified label name of at most 316 characters; levels unique; the hostname label only
    at the lowest level; cluster-scoped with a DNS-subdomain name.
    """
    problems = _check_meta(obj)
    levels = (obj.get("spec") or {}).get("levels")
    if not isinstance(levels, list) or not 1 <= len(levels) <= max_levels:
        return [*problems, f"spec.levels: must list 1 to {max_levels} levels"]
    keys = []
    for i, level in enumerate(levels):
        key = level.get("nodeLabel") if isinstance(level, Mapping) else None
        if set(level) - {"nodeLabel"} if isinstance(level, Mapping) else True:
            problems.append(f"spec.levels[{i}]: only nodeLabel is allowed")
        if not isinstance(key, str) or not 1 <= len(key) <= 316 or not _QUALIFIED_NAME.match(key):
            problems.append(f"spec.levels[{i}].nodeLabel: {key!r} is not a label key")
        keys.append(key)
    if len(set(map(str, keys))) != len(keys):
        problems.append("spec.levels: must be unique")
    if HOSTNAME in keys and keys[-1] != HOSTNAME:
        problems.append(f"spec.levels: {HOSTNAME} can only be the lowest level")
    return problems


def _check_meta(obj: Mapping[str, Any]) -> list[str]:
    problems = []
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    if (
        not isinstance(name, str)
        or not name
        or len(name) > 253
        or not _DNS_SUBDOMAIN.fullmatch(name)
    ):
        problems.append(f"metadata.name: {name!r} is not a DNS subdomain")
    if "namespace" in meta:
        problems.append("metadata.namespace: the object is cluster-scoped")
    return problems


# --- Volcano ------------------------------------------------------------------------------------


def _ambiguous(nodes: Iterable[Placed]) -> dict[int, set[str]]:
    """tier -> raw values used under more than one parent path."""
    paths: dict[tuple[int, str], set[tuple[str, ...]]] = {}
    for n in nodes:
        for t, raw in enumerate(n.fabric.tiers):
            paths.setdefault((t, raw), set()).add(n.fabric.tiers[t:])
    out: dict[int, set[str]] = {}
    for (t, raw), ps in paths.items():
        if len(ps) > 1:
            out.setdefault(t, set()).add(raw)
    return out


def _object_name(prefix: str, value: str) -> str:
    """A DNS-subdomain object name for a label value (hashed when it would not be one)."""
    name = f"{prefix}-{value.lower()}"
    if len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) and value == value.lower():
        return name
    clean = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:40]
    return f"{prefix}-{clean}-{fnv64a(value):016x}".replace("--", "-")


def volcano_hypernodes(nodes: Sequence[Placed]) -> list[dict[str, Any]]:
    """Volcano HyperNodes for the fabric tiers (see the module docstring)."""
    ambiguous = _ambiguous(nodes)
    members: dict[tuple[int, str], set[tuple[str, str]]] = {}
    for n in sorted(nodes, key=lambda p: p.name):
        tiers = n.fabric.tiers
        below = ("Node", n.name)
        for t in range(len(tiers)):
            # The tier's cluster-wide unique value, as the label publisher writes it.
            key = (t, tier_value(tiers, t, ambiguous=tiers[t] in ambiguous.get(t, ())))
            members.setdefault(key, set()).add(below)
            below = ("HyperNode", _object_name(f"gputopo-{_tier_name(t)}", key[1]))
    out = []
    for (t, value), children in sorted(members.items()):
        out.append(
            {
                "apiVersion": VOLCANO_HYPERNODE.group_version,
                "kind": VOLCANO_HYPERNODE.kind,
                "metadata": {
                    "name": _object_name(f"gputopo-{_tier_name(t)}", value),
                    "labels": dict(MANAGED_BY),
                },
                "spec": {
                    "tier": t + 1,
                    "tierName": _tier_name(t),
                    "members": [
                        {"type": kind, "selector": {"exactMatch": {"name": name}}}
                        for kind, name in sorted(children)
                    ],
                },
            }
        )
    return out


def _tier_name(t: int) -> str:
    return TIER_NAMES[t] if t < len(TIER_NAMES) else f"tier-{t}"


def check_hypernode(obj: Mapping[str, Any]) -> list[str]:
    """Problems Volcano's HyperNode schema would reject (from its CRD), one line each."""
    problems = _check_meta(obj)
    spec = obj.get("spec") or {}
    tier = spec.get("tier")
    if not isinstance(tier, int) or isinstance(tier, bool) or tier < 0:
        problems.append("spec.tier: must be a non-negative integer")
    name = spec.get("tierName", "")
    if not isinstance(name, str) or len(name) > 253:
        problems.append("spec.tierName: must be a string of at most 253 characters")
    members = spec.get("members")
    if not isinstance(members, list) or not members:
        return [*problems, "spec.members: must list at least one member"]
    for i, m in enumerate(members):
        where = f"spec.members[{i}]"
        if m.get("type") not in ("Node", "HyperNode"):
            problems.append(f"{where}.type: must be Node or HyperNode")
        selector = m.get("selector") or {}
        chosen = [k for k in ("exactMatch", "regexMatch", "labelMatch") if k in selector]
        if len(chosen) != 1:
            problems.append(f"{where}.selector: exactly one of exactMatch, regexMatch, labelMatch")
        exact = (selector.get("exactMatch") or {}).get("name", "")
        if "exactMatch" in selector and (
            not exact or len(exact) > 253 or not _DNS_SUBDOMAIN.fullmatch(exact)
        ):
            problems.append(f"{where}.selector.exactMatch.name: {exact!r} is not a DNS subdomain")
    return problems


# --- Slurm --------------------------------------------------------------------------------------


_NO_TOPOLOGY = ("\0no-topology",)  # not a switch path any node can have


def slurm_tree(nodes: Sequence[Placed]) -> str:
    """`topology.conf` for `topology/tree`, in topograph's format (see the module docstring).

    Switches are identified by their path (a reused name under two parents is two switches),
    numbered `switch.<level>.<n>` with level 1 for leaves and n in root-first path order, and
    written breadth-first from the top; nodes without a fabric position come last among the
    top-level entries, under the pseudo switch `no-topology`.
    """
    children: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    hosts: dict[tuple[str, ...], list[str]] = {}
    loose = []
    for n in nodes:
        tiers = n.fabric.tiers
        if not tiers:
            loose.append(n.name)
            continue
        hosts.setdefault(tiers, []).append(n.name)
        for t in range(len(tiers)):
            children.setdefault(tiers[t + 1 :], set()).add(tiers[t:])

    def root_first(path: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(reversed(path))

    heights: dict[tuple[str, ...], int] = {}

    def height(path: tuple[str, ...]) -> int:
        if path not in heights:
            heights[path] = 1 + max((height(k) for k in children.get(path, ())), default=0)
        return heights[path]

    by_level: dict[int, list[tuple[str, ...]]] = {}
    for path in {p for kids in children.values() for p in kids}:
        by_level.setdefault(height(path), []).append(path)
    short = {
        path: f"switch.{level}.{i}"
        for level, paths in by_level.items()
        for i, path in enumerate(sorted(paths, key=root_first), start=1)
    }
    lines: list[str] = []
    queue: deque[tuple[str, ...]] = deque(sorted(children.get((), ()), key=root_first))
    if loose:
        queue.append(_NO_TOPOLOGY)  # a sibling of the top switches, after them
    while queue:
        path = queue.popleft()
        if path == _NO_TOPOLOGY:
            lines.append(f"SwitchName=no-topology Nodes={','.join(compact_hostlist(loose))}")
            continue
        kids = sorted(children.get(path, ()), key=root_first)
        lines.append(f"# {short[path]}={path[0]}")
        if kids:
            names = ",".join(compact_hostlist(short[k] for k in kids))
            lines.append(f"SwitchName={short[path]} Switches={names}")
        if path in hosts:
            lines.append(
                f"SwitchName={short[path]} Nodes={','.join(compact_hostlist(hosts[path]))}"
            )
        queue.extend(kids)
    return "\n".join(lines) + ("\n" if lines else "")


def block_sizes(sizes: Sequence[int]) -> list[int]:
    """topograph's default block sizes: the smallest domain D, then 2D, 4D, ... up to
    2^floor(log2 N) * D for N domains."""
    if not sizes:
        return []
    smallest = min(sizes)
    return [smallest * 2**i for i in range(int(math.log2(len(sizes))) + 1)]


def slurm_block(nodes: Sequence[Placed]) -> str:
    """`topology.conf` for `topology/block`: one block per NVLink (sub-)domain."""
    domains: dict[str, list[str]] = {}
    for n in nodes:
        domain = n.fabric.accelerator_sub_domain or n.fabric.accelerator_domain
        if domain:
            domains.setdefault(domain, []).append(n.name)
    lines = []
    for i, (domain, names) in enumerate(sorted(domains.items()), start=1):
        lines.append(f"# block{i:03d}={domain}")
        lines.append(f"BlockName=block{i:03d} Nodes={','.join(compact_hostlist(names))}")
    if domains:
        sizes = block_sizes([len(v) for v in domains.values()])
        lines.append(f"BlockSizes={','.join(str(s) for s in sizes)}")
    return "\n".join(lines) + ("\n" if lines else "")
