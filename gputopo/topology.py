"""The node topology model: GPUs, NICs, NUMA nodes, the links between them, and the node's place in
the cluster fabric.

These are plain frozen values. The exporter builds one `NodeTopology` per node from NVML and sysfs
(or from a recording), the aggregator keeps the latest one per node, and placement reads them; the
protobuf codec translates them at the edges. Nothing here talks to hardware or the network.

A `Link` joins two devices (`DeviceRef`): GPU-GPU links say how peers talk, GPU-NIC links say which
NICs a GPU reaches over which PCIe path, GPU-NUMA links carry GPU-to-host bandwidth. A link keeps
both its nominal bandwidth (from the facts table in `gputopo.bandwidth`, for the state the link is
in now) and its last measurement; `Link.bandwidth_gbps` says which one counts.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from gputopo.links import LinkHealth, LinkKind, link_code

__all__ = [
    "DEFAULT_MEASUREMENT_MAX_AGE_S",
    "DeviceKind",
    "DeviceRef",
    "FabricPosition",
    "FabricState",
    "Gpu",
    "GpuFabric",
    "Link",
    "Measurement",
    "Nic",
    "NicKind",
    "NodeTopology",
    "NumaNode",
    "NvmlStatus",
    "gpu",
    "nic",
    "numa",
]

# A measurement older than this no longer overrides the nominal figure. Probes run every few
# minutes; a day-old figure says more about yesterday's load than about the link.
DEFAULT_MEASUREMENT_MAX_AGE_S = 6 * 3600.0


class DeviceKind(enum.IntEnum):
    """What a link endpoint is."""

    GPU = 1
    NIC = 2
    NUMA = 3  # host memory of a NUMA node, for GPU-to-host paths


@dataclass(frozen=True, slots=True, order=True)
class DeviceRef:
    """An endpoint of a link: a device kind and its index on the node."""

    kind: DeviceKind
    index: int

    def __str__(self) -> str:
        return f"{self.kind.name.lower()}{self.index}"


def gpu(index: int) -> DeviceRef:
    """Shorthand for a GPU endpoint."""
    return DeviceRef(DeviceKind.GPU, index)


def nic(index: int) -> DeviceRef:
    """Shorthand for a NIC endpoint."""
    return DeviceRef(DeviceKind.NIC, index)


def numa(index: int) -> DeviceRef:
    """Shorthand for a NUMA node's host memory as an endpoint."""
    return DeviceRef(DeviceKind.NUMA, index)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One probe result: what was measured, how, and when (unix seconds).

    `gbps` is the median of `samples` samples; `low_gbps`/`high_gbps` their 10th and 90th
    percentiles when the probe took several (a wide spread says the link was not steady).
    """

    gbps: float
    method: str
    size_bytes: int = 0
    duration_s: float = 0.0
    measured_at: float = 0.0
    latency_us: float | None = None
    low_gbps: float | None = None
    high_gbps: float | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class Link:
    """A connection between two devices of one node.

    `a` < `b` always (the constructor of `NodeTopology` normalises), so a pair has one key.
    `lanes` is the number of active NVLinks (or PCIe lanes for PCIe-only facts), `max_lanes` what
    the hardware has; fewer active than maximum makes the link DEGRADED. `nominal_gbps` is the facts
    table's figure for the link as it is now (degraded lanes already lower it).
    """

    a: DeviceRef
    b: DeviceRef
    kind: LinkKind
    lanes: int = 0
    max_lanes: int = 0
    generation: int = 0
    via_switch: bool = False
    nominal_gbps: float = 0.0
    measured: Measurement | None = None
    health: LinkHealth = LinkHealth.OK
    health_reason: str = ""

    @property
    def key(self) -> tuple[DeviceRef, DeviceRef]:
        """The unordered pair as a sorted tuple."""
        return (self.a, self.b)

    @property
    def code(self) -> str:
        """nvidia-smi's code for this link (`NV18`, `PIX`, ...)."""
        return link_code(self.kind, self.lanes)

    def bandwidth_gbps(
        self, *, now: float | None = None, max_age_s: float = DEFAULT_MEASUREMENT_MAX_AGE_S
    ) -> float:
        """The bandwidth placement should count: a fresh measurement, else the nominal figure.

        A DOWN link carries nothing. `now=None` accepts any measurement regardless of age (used
        for recordings, which have no clock).
        """
        if self.health is LinkHealth.DOWN:
            return 0.0
        m = self.measured
        if m is not None and m.gbps > 0 and (now is None or now - m.measured_at <= max_age_s):
            return m.gbps
        return self.nominal_gbps


class FabricState(enum.IntEnum):
    """NVML's GPU fabric state (multi-node NVLink registration)."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """NVML fabric info of a GPU in a multi-node NVLink system (GB200 NVL72 and kin)."""

    cluster_uuid: str
    clique_id: int
    state: FabricState
    health_mask: int = 0

    @property
    def usable(self) -> bool:
        """The check UCX and GFD use: registration completed with a real cluster UUID."""
        return (
            self.state is FabricState.COMPLETED
            and bool(self.cluster_uuid)
            and self.cluster_uuid.strip("0-") != ""
        )

    @property
    def clique(self) -> str:
        """GFD's `nvidia.com/gpu.clique` value: `<clusterUUID>.<cliqueId>`."""
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as discovered. Unknown numbers are 0 and unknown NUMA nodes are None."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""
    memory_mib: int = 0
    numa_node: int | None = None
    cpu_affinity: str = ""
    compute_capability: str = ""
    nvlink_generation: int = 0
    nvlink_lanes: int = 0
    nvlink_max_lanes: int = 0
    pcie_generation: int = 0
    pcie_width: int = 0
    pcie_max_generation: int = 0
    pcie_max_width: int = 0
    fabric: GpuFabric | None = None
    health: LinkHealth = LinkHealth.OK
    health_reason: str = ""


class NicKind(enum.IntEnum):
    """Link layer of a NIC."""

    UNKNOWN = 0
    INFINIBAND = 1
    ROCE = 2
    ETHERNET = 3
    EFA = 4


@dataclass(frozen=True, slots=True)
class Nic:
    """A network adapter that GPUs can use to leave the node."""

    index: int
    name: str
    kind: NicKind = NicKind.UNKNOWN
    netdev: str = ""
    speed_mbps: int = 0
    up: bool = True
    numa_node: int | None = None
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class NumaNode:
    """A NUMA node: its CPUs (cpulist text as the kernel prints it) and its distance row."""

    id: int
    cpus: str = ""
    memory_mib: int = 0
    distances: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FabricPosition:
    """Where the node sits between nodes.

    `tiers` lists switch groups closest first (tier-0 = leaf group, tier-1 = spine group, ...),
    as topograph does. `accelerator_domain` is the multi-node NVLink domain (an NVL72 rack's
    cluster UUID), `accelerator_sub_domain` a partition inside it (GFD's clique value).
    `source` says where the facts came from and `confidence` how far to trust them.
    """

    tiers: tuple[str, ...] = ()
    accelerator_domain: str = ""
    accelerator_sub_domain: str = ""
    zone: str = ""
    source: str = ""
    confidence: Literal["high", "medium", "low", ""] = ""


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    """Whether NVML answered, and if not, why: a node with no driver still reports."""

    up: bool = False
    driver_version: str = ""
    cuda_version: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Everything known about one node's devices and links.

    `partial` marks a topology built from incomplete input (a truncated recording, NVML calls that
    failed); `problems` says what was missing, one line each, so users see it rather than a guess.
    Links are normalised on construction (endpoints ordered, one link per pair, sorted).
    """

    name: str
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    numa_nodes: tuple[NumaNode, ...] = ()
    links: tuple[Link, ...] = ()
    fabric: FabricPosition = FabricPosition()
    machine: str = ""
    profile: str = ""
    nvml: NvmlStatus = NvmlStatus()
    partial: bool = False
    problems: tuple[str, ...] = ()
    _index: MappingProxyType[tuple[DeviceRef, DeviceRef], Link] = field(
        default_factory=lambda: MappingProxyType({}), init=False, repr=False, compare=False
    )
    # `gputopo.shape.node_shape`'s memo of this topology's shapes: shallow copies (clones of
    # one machine) share it as they share the device tuples; it lives and dies with them.
    _shape_memo: dict[str, object] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        normal = sorted(map(_normal, self.links), key=_order)  # stable: duplicates keep order
        # A later duplicate replaces an earlier one in place; the index keeps the order of
        # `links`, so that `amended` can update it instead of sorting again.
        index = {(lk.a, lk.b): lk for lk in normal}
        object.__setattr__(self, "links", tuple(index.values()))
        object.__setattr__(self, "_index", MappingProxyType(index))

    def amended(
        self,
        *,
        links: Iterable[Link] = (),
        removed_links: Iterable[tuple[DeviceRef, DeviceRef]] = (),
        gpus: tuple[Gpu, ...] | None = None,
        nics: tuple[Nic, ...] | None = None,
        fabric: FabricPosition | None = None,
        nvml: NvmlStatus | None = None,
        problems: tuple[str, ...] | None = None,
    ) -> NodeTopology:
        """This topology with `links` upserted (by their pair), `removed_links` removed and the
        given fields replaced; equal to building it afresh, sharing every unchanged part.

        Why: a report that changes one link of a 100-link node should not pay for normalising
        and sorting the other 99 (the aggregator does this for every delta). When every
        upserted pair is already there, the links keep their order and only a dict is copied;
        a new pair (rare: links appear with new devices) re-sorts as the constructor does.
        """
        index = self._index.copy()
        for a, b in removed_links:
            index.pop((a, b) if a < b else (b, a), None)
        new_pair = False
        for given in links:
            link = _normal(given)
            new_pair = new_pair or link.key not in index
            index[link.key] = link
        out = NodeTopology(  # not `replace`: a third of the cost of a delta went there
            name=self.name,
            gpus=self.gpus if gpus is None else gpus,
            nics=self.nics if nics is None else nics,
            numa_nodes=self.numa_nodes,
            links=tuple(index.values()) if new_pair else (),
            fabric=self.fabric if fabric is None else fabric,
            machine=self.machine,
            profile=self.profile,
            nvml=self.nvml if nvml is None else nvml,
            partial=self.partial,
            problems=self.problems if problems is None else problems,
        )
        if not new_pair:  # the constructor saw no links: set them, in order already
            object.__setattr__(out, "links", tuple(index.values()))
            object.__setattr__(out, "_index", MappingProxyType(index))
        return out

    def link(self, a: DeviceRef, b: DeviceRef) -> Link | None:
        """The link between two devices, in either order, or None."""
        key = (a, b) if a < b else (b, a)
        return self._index.get(key)

    def gpu_link(self, i: int, j: int) -> Link | None:
        """The link between GPU i and GPU j."""
        return self.link(gpu(i), gpu(j))

    def gpu_links(self) -> Iterable[Link]:
        """GPU-GPU links only."""
        return (lk for lk in self.links if lk.a.kind is lk.b.kind is DeviceKind.GPU)

    def nic_links(self, gpu_index: int) -> list[Link]:
        """GPU-NIC links of one GPU, nearest first (then by NIC index)."""
        me = gpu(gpu_index)
        # by the pair index, O(NICs): scanning every link for every GPU made a 128-GPU node's
        # Place answer take seconds (128 GPUs x 16,000 links)
        found = [lk for j in range(len(self.nics)) if (lk := self.link(me, nic(j))) is not None]
        return sorted(found, key=lambda lk: (lk.kind, lk.b.index if lk.a == me else lk.a.index))

    def nearest_nics(self, gpu_index: int) -> tuple[int, ...]:
        """Indices of the up NICs on the best PCIe path from a GPU (all of them when tied)."""
        links = [lk for lk in self.nic_links(gpu_index) if self._nic_up(lk)]
        if not links:
            return ()
        best = links[0].kind
        me = gpu(gpu_index)
        return tuple((lk.b if lk.a == me else lk.a).index for lk in links if lk.kind == best)

    def _nic_up(self, link: Link) -> bool:
        ref = link.b if link.b.kind is DeviceKind.NIC else link.a
        return 0 <= ref.index < len(self.nics) and self.nics[ref.index].up

    @property
    def gpu_count(self) -> int:
        """Number of GPUs on the node."""
        return len(self.gpus)

    @property
    def degraded_links(self) -> tuple[Link, ...]:
        """Links whose health is not OK."""
        return tuple(lk for lk in self.links if lk.health is not LinkHealth.OK)


def _normal(link: Link) -> Link:
    """The link with its endpoints in order (ValueError for a link from a device to itself).

    Compares plain tuples, as `_order` does: the dataclass comparisons of `DeviceRef` run in
    Python, and a node's links are normalised on every construction."""
    a, b = (link.a.kind, link.a.index), (link.b.kind, link.b.index)
    if a == b:
        raise ValueError(f"link from {link.a} to itself")
    return replace(link, a=link.b, b=link.a) if b < a else link


def _order(link: Link) -> tuple[int, int, int, int]:
    """The sort key of a normalised link: `(link.a, link.b)` as `DeviceRef`'s order has it."""
    return (link.a.kind, link.a.index, link.b.kind, link.b.index)
