"""Turn what NVML and sysfs said into a node's topology: a pure function, no hardware.

1. GPUs: NVML's facts, with sysfs filling what NVML could not say (NUMA node, CPUs, PCIe link).
2. NVLink per GPU: links that end at an NVSwitch (by remote device type) make the GPU a switch
   member; links that end at a GPU of this node are direct links to that peer.
3. GPU pairs: switch members are peers with the smaller of their switch lane counts; direct
   lanes count when both ends agree (the smaller count when they do not). A pair with active
   lanes is NVLINK; otherwise its PCIe class from NVML's common ancestor, else from the sysfs
   PCI tree, else SYS (the worst case) with a problem line. Lanes the hardware has but that are
   down are kept in `max_lanes`, so health can say what was lost.
4. GPU-NIC pairs: the PCIe class of the sysfs path; GPU-NUMA pairs: PHB to the GPU's own NUMA
   node, SYS to the others (host memory across the socket interconnect).
5. NICs and NUMA nodes from sysfs; NUMA nodes a device names but sysfs lacks are added, NIC NUMA
   nodes sysfs does not know are inferred from the nearest GPUs as the importers do.
6. Nominal bandwidth from the facts table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from exporter.readings import (
    GpuReading,
    NvLinkReading,
    NvmlReading,
    RemoteType,
    SysfsReading,
    is_nvidia_device,
    nvlink_generation,
)
from exporter.sysfs import pci_path_kind
from gputopo.importers.nvsmi import with_numa_completed
from gputopo.links import LinkKind, link_kind_from_nvml
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import (
    FabricState,
    Gpu,
    GpuFabric,
    Link,
    Nic,
    NodeTopology,
    gpu,
    nic,
    numa,
)

__all__ = ["Assembled", "assemble"]


@dataclass(frozen=True, slots=True)
class Assembled:
    """The topology, and the PCIe class of every GPU pair (NVLinked pairs too), which health
    needs to say what a pair falls back to when its NVLinks are unusable."""

    topology: NodeTopology
    pcie_kinds: dict[tuple[int, int], LinkKind]


@dataclass(slots=True)
class _NvLinks:
    """One GPU's NVLinks, sorted by where they lead."""

    switch_active: int = 0
    switch_total: int = 0
    direct_active: Counter[int] = field(default_factory=Counter)
    direct_total: Counter[int] = field(default_factory=Counter)
    generation: int = 0


def assemble(*, node_name: str, nvml: NvmlReading, sysfs: SysfsReading) -> Assembled:
    """The node's topology from one NVML and one sysfs reading (see the module docstring)."""
    problems: list[str] = [*nvml.problems, *sysfs.problems]
    by_bus = {g.pci_bus_id: g.index for g in nvml.gpus if g.pci_bus_id}
    readings = {g.index: g for g in nvml.gpus}
    links_of = {g.index: _sort_nvlinks(g, by_bus, problems) for g in nvml.gpus}
    gpus = tuple(_gpu(g, links_of[g.index], sysfs) for g in nvml.gpus)
    nics = tuple(
        Nic(
            index=j,
            name=n.name,
            kind=n.kind,
            netdev=n.netdev,
            speed_mbps=n.speed_mbps,
            up=n.up,
            numa_node=n.pci.numa_node if n.pci is not None else None,
            pci_bus_id=n.pci.bus_id if n.pci is not None else "",
        )
        for j, n in enumerate(sysfs.nics)
    )
    links: list[Link] = []
    pcie_kinds: dict[tuple[int, int], LinkKind] = {}
    for a in readings:
        for b in readings:
            if a >= b:
                continue
            kind = _pcie_kind(a, b, nvml=nvml, sysfs=sysfs, readings=readings, problems=problems)
            pcie_kinds[(a, b)] = kind
            links.append(_gpu_pair(a, b, kind, links_of))
    for g in gpus:
        here = sysfs.pci.get(g.pci_bus_id)
        for j, n in enumerate(sysfs.nics):
            if here is not None and n.pci is not None:
                links.append(Link(gpu(g.index), nic(j), pci_path_kind(here, n.pci)))
        if g.numa_node is not None:
            for node in sysfs.numa_nodes:
                kind = LinkKind.PHB if node.id == g.numa_node else LinkKind.SYS
                links.append(Link(gpu(g.index), numa(node.id), kind))
    partial = any(not g.uuid or not g.pci_bus_id for g in gpus)
    topology = NodeTopology(
        name=node_name,
        gpus=gpus,
        nics=nics,
        numa_nodes=sysfs.numa_nodes,
        links=tuple(links),
        nvml=nvml.status,
        partial=partial,
        problems=tuple(problems),
    )
    return Assembled(
        topology=with_nominal_bandwidth(with_numa_completed(topology)), pcie_kinds=pcie_kinds
    )


def _is_switch(link: NvLinkReading, by_bus: dict[str, int]) -> bool | None:
    """True for a link into an NVSwitch, False to a GPU, None when it cannot be told."""
    if link.remote_type is not None:
        if link.remote_type is RemoteType.SWITCH:
            return True
        return False if link.remote_type is RemoteType.GPU else None
    if link.remote_bus_id in by_bus:
        return False
    if link.remote_bus_id and is_nvidia_device(link.remote_device_id):
        return True
    return None


def _sort_nvlinks(g: GpuReading, by_bus: dict[str, int], problems: list[str]) -> _NvLinks:
    found = _NvLinks()
    guessed = False
    unknown_down = 0
    versions = [lk.version for lk in g.nvlinks if lk.active and lk.version]
    versions = versions or [lk.version for lk in g.nvlinks if lk.version]
    found.generation = nvlink_generation(min(versions)) if versions else 0
    for link in g.nvlinks:
        to_switch = _is_switch(link, by_bus)
        guessed = guessed or (link.remote_type is None and to_switch is True)
        if to_switch:
            found.switch_total += 1
            found.switch_active += link.active
        elif to_switch is False and link.remote_bus_id in by_bus:
            peer = by_bus[link.remote_bus_id]
            found.direct_total[peer] += 1
            found.direct_active[peer] += link.active
        elif not link.active:
            unknown_down += 1  # the far end of a link that is down may be unknown
    if found.switch_total:
        found.switch_total += unknown_down  # a switch member's links all lead to switches
    if guessed:
        problems.append(
            f"GPU{g.index}: the driver does not report NVLink remote device types; links to an "
            "NVIDIA device that is no GPU of this node are taken for NVSwitch links"
        )
    return found


def _gpu(g: GpuReading, links: _NvLinks, sysfs: SysfsReading) -> Gpu:
    pci = sysfs.pci.get(g.pci_bus_id)

    def pick(first: int | None, second: int | None) -> int:
        return first if first is not None else (second or 0)

    fabric = None
    if g.fabric is not None:
        try:
            state = FabricState(g.fabric.state)
        except ValueError:
            state = FabricState.NOT_STARTED
        fabric = GpuFabric(
            cluster_uuid=g.fabric.cluster_uuid,
            clique_id=g.fabric.clique_id,
            state=state,
            health_mask=g.fabric.health_mask,
        )
    return Gpu(
        index=g.index,
        uuid=g.uuid,
        pci_bus_id=g.pci_bus_id,
        name=g.name,
        memory_mib=g.memory_mib or 0,
        numa_node=g.numa_node if g.numa_node is not None else (pci.numa_node if pci else None),
        cpu_affinity=g.cpu_affinity or (pci.local_cpus if pci else ""),
        compute_capability=g.compute_capability,
        nvlink_generation=links.generation,
        nvlink_lanes=links.switch_active + sum(links.direct_active.values()),
        nvlink_max_lanes=links.switch_total + sum(links.direct_total.values()),
        pcie_generation=pick(g.pcie_generation, pci.pcie_generation if pci else None),
        pcie_width=pick(g.pcie_width, pci.pcie_width if pci else None),
        pcie_max_generation=pick(g.pcie_max_generation, pci.pcie_max_generation if pci else None),
        pcie_max_width=pick(g.pcie_max_width, pci.pcie_max_width if pci else None),
        fabric=fabric,
    )


def _pcie_kind(
    a: int,
    b: int,
    *,
    nvml: NvmlReading,
    sysfs: SysfsReading,
    readings: dict[int, GpuReading],
    problems: list[str],
) -> LinkKind:
    pair = nvml.pair(a, b)
    if pair is not None and pair.common_ancestor is not None:
        return link_kind_from_nvml(common_ancestor_level=pair.common_ancestor, nvlink_lanes=0)
    here, there = sysfs.pci.get(readings[a].pci_bus_id), sysfs.pci.get(readings[b].pci_bus_id)
    if here is not None and there is not None:
        problems.append(f"GPU{a}-GPU{b}: PCIe path from sysfs (NVML did not give it)")
        return pci_path_kind(here, there)
    problems.append(f"GPU{a}-GPU{b}: PCIe path unknown to NVML and sysfs; counted as SYS")
    return LinkKind.SYS


def _gpu_pair(a: int, b: int, kind: LinkKind, links_of: dict[int, _NvLinks]) -> Link:
    mine, theirs = links_of[a], links_of[b]
    lanes = max_lanes = 0
    via_switch = False
    if mine.switch_total and theirs.switch_total:
        lanes = min(mine.switch_active, theirs.switch_active)
        max_lanes = min(mine.switch_total, theirs.switch_total)
        via_switch = True
    direct = _agree(mine.direct_active[b], theirs.direct_active[a])
    direct_max = _agree(mine.direct_total[b], theirs.direct_total[a])
    if direct_max > max_lanes:
        lanes, max_lanes, via_switch = direct, direct_max, False
    generations = [g for g in (mine.generation, theirs.generation) if g]
    generation = min(generations) if generations else 0
    if lanes > 0:
        return Link(
            gpu(a),
            gpu(b),
            LinkKind.NVLINK,
            lanes=lanes,
            max_lanes=max_lanes,
            generation=generation,
            via_switch=via_switch,
        )
    # No active NVLink: the pair talks over PCIe; lanes it lost stay visible for health.
    return Link(
        gpu(a), gpu(b), kind, max_lanes=max_lanes, generation=generation if max_lanes else 0
    )


def _agree(there: int, back: int) -> int:
    """Direct lanes between a pair as both ends count them: the smaller count, or whichever end
    NVML described when the other end could not say."""
    return min(there, back) if there and back else there or back
