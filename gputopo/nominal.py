"""Fill in the nominal bandwidth of every link from what is known about its devices.

A figure of 0 means unknown (a NIC whose speed the kernel does not report), never a guess.

Discovery (NVML), importers (nvidia-smi text, NCCL XML) and fake machines all produce links with
a kind and lane count but no bandwidth; this is the one place that turns those facts into GB/s,
so a recording and a live node of the same machine get the same figures.
"""

from __future__ import annotations

from dataclasses import replace

from gputopo import bandwidth
from gputopo.links import LinkHealth, LinkKind
from gputopo.topology import DeviceKind, DeviceRef, Gpu, Link, NodeTopology

__all__ = [
    "ASSUMED_PCIE",
    "gpu_pcie_gbps",
    "link_nominal_gbps",
    "plausible",
    "plausible_link",
    "with_nominal_bandwidth",
]

# When a GPU's PCIe link is unknown (recordings rarely say) we assume Gen4 x16, the most common
# link of datacenter GPUs in service; callers that know better set the GPU's pcie fields.
ASSUMED_PCIE = (4, 16)
_GPUDIRECT_RDMA_MAX_PATH = LinkKind.PXB


def gpu_pcie_gbps(g: Gpu) -> float:
    """Line rate of a GPU's PCIe link as trained now, or the assumed default when unknown."""
    gen, width = g.pcie_generation, g.pcie_width
    if gen <= 0 or width <= 0:
        gen, width = ASSUMED_PCIE
    return bandwidth.pcie_gbps(generation=gen, width=width)


def link_nominal_gbps(topology: NodeTopology, link: Link) -> float:
    """Nominal one-direction bandwidth of a link of this node, from the facts table."""
    if link.health is LinkHealth.DOWN:
        return 0.0
    if link.kind is LinkKind.NVLINK:
        generation = _nvlink_generation(topology, link)
        return bandwidth.nvlink_gbps(lanes=link.lanes, generation=generation)
    if link.kind is LinkKind.C2C:
        return bandwidth.C2C_GBPS
    if link.kind is LinkKind.NET:
        return 0.0
    touches_nic = DeviceKind.NIC in (link.a.kind, link.b.kind)
    if touches_nic and any(_unknown_nic(topology, ref) for ref in (link.a, link.b)):
        return 0.0  # a NIC whose speed is unknown makes the path unknown, not the GPU's rate
    rates = [r for r in (_endpoint_gbps(topology, ref) for ref in (link.a, link.b)) if r > 0]
    link_rate = (
        min(rates)
        if rates
        else bandwidth.pcie_gbps(generation=ASSUMED_PCIE[0], width=ASSUMED_PCIE[1])
    )
    if DeviceKind.NUMA in (link.a.kind, link.b.kind):
        return bandwidth.host_path_gbps(link.kind, link_gbps=link_rate)
    if touches_nic and link.kind <= _GPUDIRECT_RDMA_MAX_PATH:
        # GPUDirect RDMA runs at the NIC's line rate as long as the path stays below the host
        # bridge (NCCL's default NCCL_NET_GDR_LEVEL is PXB); farther, traffic is staged in host
        # memory and pays the PCIe path penalty like peer traffic does.
        return round(link_rate, 3)
    return bandwidth.pcie_path_gbps(link.kind, link_gbps=link_rate)


def with_nominal_bandwidth(topology: NodeTopology) -> NodeTopology:
    """The same topology with every link's `nominal_gbps` set from the facts table; only the
    links whose figure changes are copied, and the same object comes back when none does (the
    exporter's health pass runs this on every pass, where a healthy node changes nothing)."""
    changed = [
        replace(link, nominal_gbps=gbps)
        for link in topology.links
        if (gbps := link_nominal_gbps(topology, link)) != link.nominal_gbps
    ]
    return topology.amended(links=changed) if changed else topology


def plausible(topology: NodeTopology) -> NodeTopology:
    """The topology with every link's nominal and measured bandwidth cut to what a link of its
    kind can carry (NVLink: of the GPUs' generation, `bandwidth.ceiling_gbps`); the same object
    when nothing was above. Why: placement prefers the fastest links, so a node that claimed
    NVLink at thousands of GB/s (within the codec's generous bounds, but not what an H100 has)
    drew every honest request. Cut to the ceiling, a claim can at most tie with an honest node
    of the same hardware, never outbid it."""
    # A snapshot checks every link (about 90 on a DGX), and links of one kind and generation
    # share their ceiling: one lookup each, and a link under it is not touched.
    ceilings: dict[tuple[LinkKind, int | None], float] = {}
    fixed = []
    for link in topology.links:
        generation = _nvlink_generation(topology, link) if link.kind is LinkKind.NVLINK else None
        top = ceilings.get((link.kind, generation))
        if top is None:
            top = bandwidth.ceiling_gbps(link.kind, nvlink_generation=generation)
            ceilings[(link.kind, generation)] = top
        m = link.measured
        if link.nominal_gbps > top or (m is not None and m.gbps > top):
            fixed.append(_cut(link, top))
    return topology.amended(links=fixed) if fixed else topology


def plausible_link(topology: NodeTopology, link: Link) -> Link:
    """One link of `topology` as `plausible` leaves it: the same object when it is within what
    its kind can carry. The aggregator checks only the links a delta changed this way (the
    GPUs, whose NVLink generation sets the ceiling, unchanged)."""
    top = bandwidth.ceiling_gbps(
        link.kind,
        nvlink_generation=_nvlink_generation(topology, link)
        if link.kind is LinkKind.NVLINK
        else None,
    )
    return _cut(link, top)


def _cut(link: Link, top: float) -> Link:
    """The link with its nominal and measured figures at most `top` (itself when they are)."""
    fixed = link
    if link.nominal_gbps > top:
        fixed = replace(fixed, nominal_gbps=top)
    if link.measured is not None and link.measured.gbps > top:
        fixed = replace(fixed, measured=replace(link.measured, gbps=top))
    return fixed


def _nvlink_generation(topology: NodeTopology, link: Link) -> int | None:
    if link.generation > 0:
        return link.generation
    gens = [
        topology.gpus[ref.index].nvlink_generation
        for ref in (link.a, link.b)
        if ref.kind is DeviceKind.GPU and 0 <= ref.index < len(topology.gpus)
    ]
    known = [g for g in gens if g > 0]
    return min(known) if known else None


def _unknown_nic(topology: NodeTopology, ref: DeviceRef) -> bool:
    return (
        ref.kind is DeviceKind.NIC
        and 0 <= ref.index < len(topology.nics)
        and topology.nics[ref.index].speed_mbps <= 0
    )


def _endpoint_gbps(topology: NodeTopology, ref: DeviceRef) -> float:
    if ref.kind is DeviceKind.GPU and 0 <= ref.index < len(topology.gpus):
        return gpu_pcie_gbps(topology.gpus[ref.index])
    if ref.kind is DeviceKind.NIC and 0 <= ref.index < len(topology.nics):
        # A NIC's PCIe link is rarely the bottleneck of a GPU-NIC path; its line rate is.
        return bandwidth.nic_gbps(topology.nics[ref.index].speed_mbps)
    return 0.0
