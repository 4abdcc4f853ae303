"""Clusters to replay on: an inventory file, Lingjun's production fabric, openb's node list, or
NVL72 racks, each as the `NodeTopology` list the aggregator's snapshot is built from.

Why these four: the inventory is what a site already has (topograph's model); Lingjun 2023's
`topo.csv` is the only real GPU-cluster Clos fabric we can obtain (847 hosts under 119 ToR, 3
aggregation and 1 core switch: ASW is the leaf, PSW the spine, DSW the core); openb's node list is
the cluster FGD's published figures were measured on; NVL72 racks are the shape where keeping
multi-node NVLink domains whole matters most.

Nodes of one profile are clones of one template (`load_machine` once, then a new name and fabric
position), so a 10,000-node cluster builds in about a second. GPU UUIDs stay the template's:
nothing in the simulator reads them.
"""

from __future__ import annotations

import copy
import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache

from gputopo.inventory import (
    inventory_labels,
    inventory_topologies,
    parse_inventory,
    read_text,
)
from gputopo.machines import PROFILES, gfd_labels, load_machine, with_gpu_fabric
from gputopo.topology import FabricPosition, Gpu, NodeTopology

__all__ = [
    "NVL72_TRAYS",
    "OPENB_PROFILES",
    "Cluster",
    "ClusterSourceError",
    "lingjun_cluster",
    "load_cluster",
    "nvl72_cluster",
    "openb_cluster",
]

# Trays of one GB200 NVL72 rack (4 GPUs each): one multi-node NVLink domain of 72 GPUs.
NVL72_TRAYS = 18
# NVL72 racks per leaf switch (a rack's trays hang off one leaf group) and leaves per spine.
_NVL72_RACKS_PER_LEAF = 8
_LEAVES_PER_SPINE = 4

# openb's node list names undisclosed GPU models (G1..G3) and gives no links; the profile per GPU
# count is the closest recorded machine of that size. Only the shape matters for allocation and
# fragmentation; the job-time model then sees NVLink on 8- and 4-GPU nodes and PCIe on 2-GPU
# ones, which is what the named models (V100 SXM, P100/T4 PCIe) have.
OPENB_PROFILES: Mapping[int, str] = {8: "dgx1-v100", 4: "h100-nv6-4x", 2: "workstation-2x-rtx5090"}


class ClusterSourceError(ValueError):
    """A cluster source that cannot be read; the message names the source and the field."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """Nodes to simulate, their labels, GPUs already in use, and where they came from."""

    name: str
    nodes: tuple[NodeTopology, ...]
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    used: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(n.gpu_count for n in self.nodes)


def _clone(template: NodeTopology, name: str, fabric: FabricPosition) -> NodeTopology:
    """The template as another node: same devices and links, own name and fabric position."""
    node = copy.copy(template)
    object.__setattr__(node, "name", name)
    object.__setattr__(node, "fabric", fabric)
    return node


@cache
def _template(profile: str) -> NodeTopology:
    if profile not in PROFILES:
        raise ClusterSourceError(
            f"node profile {profile!r} is unknown; known: {', '.join(sorted(PROFILES))}"
        )
    return load_machine(profile, node_name=f"{profile}-template")


@cache
def _rack_template(profile: str, domain: str) -> NodeTopology:
    return with_gpu_fabric(_template(profile), cluster_uuid=domain, clique_id=0)


@cache
def _single_gpu() -> NodeTopology:
    return NodeTopology(name="single-gpu-template", gpus=(Gpu(index=0),), profile="single-gpu")


def _rows(text: str, source: str, want: Iterable[str]) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in want if c not in (reader.fieldnames or ())]
    if missing:
        raise ClusterSourceError(f"{source}: missing column(s) {', '.join(missing)}")
    return list(reader)


def lingjun_cluster(text: str, *, profile: str = "dgx-h100", source: str = "topo.csv") -> Cluster:
    """Lingjun 2023's hosts as nodes of `profile`, ToR (ASW) / aggregation (PSW) / core (DSW).

    Hosts are named `lj-<leaf>-<n>` in file order within their ToR (the file's host ids are
    hashes; a name says where a node sits, which is what a reader of placements needs).
    """
    template = _template(profile)
    nodes: list[NodeTopology] = []
    count: dict[tuple[str, str, str], int] = {}
    for i, row in enumerate(_rows(text, source, ("ip", "DSW", "PSW", "ASW"))):
        core, spine, leaf = row["DSW"].strip(), row["PSW"].strip(), row["ASW"].strip()
        if not (core and spine and leaf):
            raise ClusterSourceError(f"{source}: row {i + 2}: empty switch name")
        key = (core, spine, leaf)
        n = count.get(key, 0)
        count[key] = n + 1
        fabric = FabricPosition(tiers=(leaf, spine, core), source="inventory", confidence="high")
        nodes.append(_clone(template, f"lj-{spine.lower()}-{leaf.lower()}-{n}", fabric))
    return _finish(f"lingjun:{profile}", nodes)


def openb_cluster(text: str, *, source: str = "openb_node_list_gpu_node.csv") -> Cluster:
    """openb's GPU nodes (CPU-only nodes are skipped), one flat leaf: the trace has no fabric."""
    nodes: list[NodeTopology] = []
    for i, row in enumerate(_rows(text, source, ("sn", "gpu"))):
        try:
            gpus = int(row["gpu"])
        except ValueError:
            raise ClusterSourceError(f"{source}: row {i + 2}: gpu: not a number") from None
        if gpus <= 0:
            continue
        if gpus == 1:
            template = _single_gpu()
        elif gpus in OPENB_PROFILES:
            template = _template(OPENB_PROFILES[gpus])
        else:
            raise ClusterSourceError(f"{source}: row {i + 2}: gpu: no profile for {gpus} GPUs")
        fabric = FabricPosition(tiers=("openb",), source="inventory", confidence="high")
        nodes.append(_clone(template, row["sn"], fabric))
    return _finish("openb", nodes)


def nvl72_cluster(racks: int, *, profile: str = "gb200-tray") -> Cluster:
    """`racks` GB200 NVL72 racks of 18 trays, 8 racks per leaf, 4 leaves per spine, one core."""
    if racks < 1:
        raise ClusterSourceError("--nvl72: must be at least 1 rack")
    nodes: list[NodeTopology] = []
    for rack in range(racks):
        leaf = rack // _NVL72_RACKS_PER_LEAF
        spine = leaf // _LEAVES_PER_SPINE
        domain = f"nvl72-{rack:04}"
        template = _rack_template(profile, domain)
        tiers = (f"leaf-{leaf:03}", f"spine-{spine:02}", "core")
        for tray in range(NVL72_TRAYS):
            fabric = FabricPosition(
                tiers=tiers, accelerator_domain=domain, source="inventory", confidence="high"
            )
            nodes.append(_clone(template, f"{domain}-{tray:02}", fabric))
    return _finish(f"nvl72:{racks}", nodes)


def _finish(name: str, nodes: list[NodeTopology]) -> Cluster:
    labels: dict[str, Mapping[str, str]] = {}
    by_template: dict[int, dict[str, str]] = {}
    for node in nodes:
        key = id(node.gpus)  # clones share their template's GPU tuple
        if key not in by_template:
            by_template[key] = gfd_labels(node)
        labels[node.name] = by_template[key]
    return Cluster(name, tuple(nodes), labels)


def load_cluster(source: str, *, profile: str = "dgx-h100") -> Cluster:
    """A cluster from `KIND:ARG`: `inventory:FILE`, `lingjun:FILE`, `openb:FILE`, `nvl72:N`.

    A bare FILE is an inventory (YAML). `profile` is the node profile of Lingjun's hosts.
    """
    kind, _, arg = source.partition(":")
    if not arg:
        kind, arg = "inventory", source
    if kind == "nvl72":
        try:
            return nvl72_cluster(int(arg))
        except ValueError:
            raise ClusterSourceError(f"{source}: nvl72 takes a number of racks") from None
    if kind not in ("inventory", "lingjun", "openb"):
        raise ClusterSourceError(
            f"{source}: unknown cluster kind {kind!r}; use inventory:, lingjun:, openb: or nvl72:"
        )
    try:
        text = read_text(arg)
    except (OSError, ValueError) as err:
        raise ClusterSourceError(f"{arg}: {err}") from None
    if kind == "lingjun":
        return lingjun_cluster(text, profile=profile, source=arg)
    if kind == "openb":
        return openb_cluster(text, source=arg)
    try:
        inventory = parse_inventory(text, source=arg)
        topologies, used = inventory_topologies(inventory, default_profile=profile)
    except ValueError as err:
        raise ClusterSourceError(f"{arg}: {' '.join(str(err).split())}") from None
    labels = inventory_labels(inventory, topologies)
    return Cluster(f"inventory:{arg}", tuple(topologies), labels, used)
