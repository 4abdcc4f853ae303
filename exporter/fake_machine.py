"""A fake machine's hardware, laid out so fake NVML and a fake sysfs tree can answer for it.

Fake machines are recordings of real ones (`gputopo.machines`), and a recording is a matrix of
path classes, not hardware: it has no PCI tree, often no PCI addresses, no NVSwitch chips. This
module derives the hardware a recording implies, so that the real discovery code, run against
`FakeNvml` and a sysfs tree written by `write_sysfs`, must find the recorded graph again:

1. PCI addresses and netdev names where the recording has none (stable: GPU i, NIC j).
2. A PCI tree that reproduces every recorded GPU-NIC and GPU-GPU PCIe class. Devices are grouped
   the way the classes nest (PIX inside PXB inside PHB inside NODE): one host bridge per PHB
   group, one root port per PXB group, one switch per PIX group below a common switch when a PXB
   group holds several, and host bridges sit on their NUMA node. A recording whose classes do
   not nest like a tree cannot come from real hardware, and `FakeMachine` refuses it.
3. NVSwitch chips for machines whose NVLinks go through switches (4 on Hopper, 6 on Ampere), each
   GPU's switch links spread over them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from exporter.readings import PciDevice, normalise_bus_id
from exporter.sysfs import pci_path_kind
from gputopo.importers.idlists import format_cpulist
from gputopo.links import LinkKind
from gputopo.machines import load_machine
from gputopo.topology import (
    DeviceKind,
    DeviceRef,
    Gpu,
    Link,
    Nic,
    NicKind,
    NodeTopology,
    NumaNode,
    gpu,
    nic,
    numa,
)

__all__ = ["FakeLink", "FakeMachine"]

# NVSwitch chips per GPU baseboard by NVLink generation: HGX A100 has 6, HGX H100 4.
_SWITCHES_BY_GENERATION = {2: 6, 3: 6, 4: 4}
_DEFAULT_SWITCHES = 2
# PCI device ids (device << 16 | NVIDIA's vendor id) of NVSwitch chips, by NVLink generation.
_NVSWITCH_DEVICE_IDS = {3: 0x1AF110DE, 4: 0x22A310DE}
_GPU_DEVICE_ID = 0x233010DE  # an H100 SXM5; the fake only needs "an NVIDIA device"


@dataclass(frozen=True, slots=True)
class FakeLink:
    """One NVLink of a fake GPU: where it leads."""

    remote_bus_id: str
    remote_device_id: int
    to_switch: bool
    peer: int | None  # the GPU at the far end of a direct link


@dataclass(frozen=True, slots=True)
class FakeMachine:
    """A machine's topology with the hardware details fakes need (see the module docstring).

    `topology` is the recorded machine completed with PCI addresses and netdev names: what
    discovery should find. `pci` maps each GPU and NIC address to its place in the tree.
    """

    topology: NodeTopology
    pci: dict[str, PciDevice]
    nvlinks: tuple[tuple[FakeLink, ...], ...]  # per GPU, by link index
    switches: tuple[str, ...]

    @classmethod
    def from_profile(cls, profile: str, *, node_name: str) -> FakeMachine:
        """The fake hardware of a machine profile (`gputopo machines` lists them)."""
        return cls.from_topology(load_machine(profile, node_name=node_name))

    @classmethod
    def from_topology(cls, topology: NodeTopology) -> FakeMachine:
        """The fake hardware of any complete topology; ValueError if no tree can give it."""
        completed = _with_addresses(topology)
        pci = _pci_tree(completed)
        _check_tree(completed, pci)
        switches, nvlinks = _nvlinks(completed)
        return cls(topology=completed, pci=pci, nvlinks=nvlinks, switches=switches)

    @classmethod
    def from_nvml_recording(cls, nvml_json: str, sysfs_text: str, *, node_name: str) -> FakeMachine:
        """A machine recorded as plain NVML answers plus a sysfs listing (the H100 VM set).

        The NVML recording (`nvml_direct_calls_*.json`: one `# source:` line, then what pynvml
        answered per GPU) gives the GPUs as NVML sees them, NUMA and CPU affinity masks included;
        the sysfs listing gives what the kernel says beside it: each GPU's `numa_node` (-1 in a
        VM, where NVML still names node 0) and the physical NICs with their `speed` (-1: unknown).
        """
        answers = json.loads(
            nvml_json.split("\n", 1)[1] if nvml_json.startswith("#") else nvml_json
        )
        gpus = tuple(_recorded_gpu(g) for g in answers["gpus"])
        cpus = sorted({c for g in answers["gpus"] for c in _mask_bits(g["cpu_affinity_words"])})
        nodes = sorted({g.numa_node for g in gpus if g.numa_node is not None})
        nics = tuple(
            Nic(index=i, name=name, kind=NicKind.ETHERNET, netdev=name, speed_mbps=max(speed, 0))
            for i, (name, speed) in enumerate(_recorded_netdevs(sysfs_text))
        )
        topology = NodeTopology(
            name=node_name,
            machine="recorded: " + ", ".join(sorted({g.name for g in gpus})),
            gpus=gpus,
            nics=nics,
            numa_nodes=tuple(NumaNode(id=n, cpus=format_cpulist(cpus)) for n in nodes),
            links=tuple(
                Link(gpu(g.index), target, LinkKind.PHB)
                for g in gpus
                for target in ([numa(g.numa_node)] if g.numa_node is not None else [])
                + [nic(n.index) for n in nics]
            ),
        )
        machine = cls.from_topology(topology)
        kernel_numa = _recorded_pci_numa(sysfs_text)
        pci = {
            address: replace(device, numa_node=kernel_numa.get(address, device.numa_node))
            for address, device in machine.pci.items()
        }
        return replace(machine, pci=pci)

    def gpu_pci(self, index: int) -> PciDevice:
        """Where GPU `index` sits."""
        return self.pci[self.topology.gpus[index].pci_bus_id]

    def pcie_kind(self, a: int, b: int) -> LinkKind:
        """The PCIe class between two GPUs: the recorded one, else what the tree gives."""
        link = self.topology.gpu_link(a, b)
        if link is not None and link.kind.is_pcie:
            return link.kind
        return pci_path_kind(self.gpu_pci(a), self.gpu_pci(b))


def _with_addresses(topology: NodeTopology) -> NodeTopology:
    taken = {normalise_bus_id(g.pci_bus_id) for g in topology.gpus if g.pci_bus_id}
    taken |= {normalise_bus_id(n.pci_bus_id) for n in topology.nics if n.pci_bus_id}

    def fresh(start: int) -> str:
        bus = start
        while f"0000:{bus:02x}:00.0" in taken:
            bus += 1
        address = f"0000:{bus:02x}:00.0"
        taken.add(address)
        return address

    gpus = tuple(
        replace(
            g,
            pci_bus_id=normalise_bus_id(g.pci_bus_id) if g.pci_bus_id else fresh(0x18 + 0x10 * i),
        )
        for i, g in enumerate(topology.gpus)
    )
    nics = tuple(
        replace(
            n,
            pci_bus_id=normalise_bus_id(n.pci_bus_id) if n.pci_bus_id else fresh(0x1A + 0x10 * j),
            netdev=n.netdev or _netdev(n),
        )
        for j, n in enumerate(topology.nics)
    )
    return replace(topology, gpus=gpus, nics=nics)


def _netdev(n: Nic) -> str:
    if n.kind is NicKind.INFINIBAND:
        return f"ib{n.index}"
    if n.kind is NicKind.ETHERNET:
        return n.name
    return f"eth{n.index + 1}"  # eth0 is the management port on most nodes


def _device_refs(topology: NodeTopology) -> list[DeviceRef]:
    return [gpu(g.index) for g in topology.gpus] + [nic(n.index) for n in topology.nics]


class _Groups:
    """Union-find over devices."""

    def __init__(self, items: Iterable[DeviceRef]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: DeviceRef) -> DeviceRef:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: DeviceRef, b: DeviceRef) -> None:
        self.parent[self.find(a)] = self.find(b)

    def groups(self, within: Iterable[DeviceRef]) -> list[list[DeviceRef]]:
        found: dict[DeviceRef, list[DeviceRef]] = {}
        for item in within:
            found.setdefault(self.find(item), []).append(item)
        return sorted(found.values())


def _grouped(topology: NodeTopology, worst: LinkKind) -> _Groups:
    groups = _Groups(_device_refs(topology))
    for link in topology.links:
        if link.kind.is_pcie and link.kind <= worst and link.b.kind is not DeviceKind.NUMA:
            groups.union(link.a, link.b)
    return groups


def _numa_of(topology: NodeTopology, ref: DeviceRef) -> int | None:
    if ref.kind is DeviceKind.GPU:
        return topology.gpus[ref.index].numa_node
    return topology.nics[ref.index].numa_node


def _bus_id(topology: NodeTopology, ref: DeviceRef) -> str:
    if ref.kind is DeviceKind.GPU:
        return topology.gpus[ref.index].pci_bus_id
    return topology.nics[ref.index].pci_bus_id


def _pci_tree(topology: NodeTopology) -> dict[str, PciDevice]:
    """Place every GPU and NIC in a PCI tree whose classes nest like the recorded ones."""
    refs = _device_refs(topology)
    hosts, pxb, pix = (_grouped(topology, k) for k in (LinkKind.PHB, LinkKind.PXB, LinkKind.PIX))
    counter = iter(range(1, 1 << 16))

    def bridge() -> str:
        n = next(counter)
        return f"fffe:{n >> 5:02x}:{n & 31:02x}.0"

    placed: dict[str, PciDevice] = {}
    for h, host in enumerate(hosts.groups(refs)):
        numas = {x for x in (_numa_of(topology, r) for r in host) if x is not None}
        numa = numas.pop() if len(numas) == 1 else None
        host_bridge = f"pci0000:{h:02x}"
        for port in pxb.groups(host):
            root_port = bridge()
            switches = pix.groups(port)
            for group in switches:
                if len(port) == 1:
                    prefix: tuple[str, ...] = (root_port,)
                elif len(switches) == 1:
                    prefix = (root_port, bridge())
                else:
                    prefix = (root_port, bridge(), bridge(), bridge())
                for ref in group:
                    below = () if len(port) == 1 else (bridge(),)
                    address = _bus_id(topology, ref)
                    placed[address] = PciDevice(
                        bus_id=address,
                        host_bridge=host_bridge,
                        chain=(*prefix, *below, address),
                        numa_node=numa,
                    )
    return placed


def _check_tree(topology: NodeTopology, pci: dict[str, PciDevice]) -> None:
    for link in topology.links:
        if not link.kind.is_pcie or DeviceKind.NUMA in (link.a.kind, link.b.kind):
            continue
        got = pci_path_kind(pci[_bus_id(topology, link.a)], pci[_bus_id(topology, link.b)])
        if got is not link.kind:
            raise ValueError(
                f"{topology.name}: no PCI tree gives {link.a}-{link.b} {link.kind.name} with the "
                f"other recorded classes (the tree gives {got.name})"
            )


def _nvlinks(
    topology: NodeTopology,
) -> tuple[tuple[str, ...], tuple[tuple[FakeLink, ...], ...]]:
    switched = [lk for lk in topology.gpu_links() if lk.kind is LinkKind.NVLINK and lk.via_switch]
    generation = min((g.nvlink_generation for g in topology.gpus if g.nvlink_generation), default=0)
    count = _SWITCHES_BY_GENERATION.get(generation, _DEFAULT_SWITCHES) if switched else 0
    switches = tuple(f"0000:{0xE0 + k:02x}:00.0" for k in range(count))
    switch_id = _NVSWITCH_DEVICE_IDS.get(generation, _NVSWITCH_DEVICE_IDS[4])
    per_gpu = []
    for g in topology.gpus:
        links: list[FakeLink] = []
        mine = [
            lk
            for lk in topology.gpu_links()
            if lk.kind is LinkKind.NVLINK and g.index in (lk.a.index, lk.b.index)
        ]
        for lk in sorted((lk for lk in mine if not lk.via_switch), key=lambda x: (x.a, x.b)):
            peer = lk.b.index if lk.a.index == g.index else lk.a.index
            address = topology.gpus[peer].pci_bus_id
            links += [FakeLink(address, _GPU_DEVICE_ID, False, peer)] * lk.max_lanes
        switch_lanes = max((lk.max_lanes for lk in mine if lk.via_switch), default=0)
        links += [
            FakeLink(switches[k % len(switches)], switch_id, True, None)
            for k in range(switch_lanes)
        ]
        per_gpu.append(tuple(links))
    return switches, tuple(per_gpu)


def _mask_bits(words: Iterable[int]) -> list[int]:
    return [at * 64 + bit for at, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def _recorded_gpu(answer: dict[str, object]) -> Gpu:
    """One GPU of an NVML recording; a field NVML refused stays unknown."""

    def number(key: str) -> int:
        value = answer.get(key)
        return value if isinstance(value, int) else 0

    nodes = _mask_bits(answer.get("memory_affinity_node_words") or [])  # type: ignore[arg-type]
    capability = answer.get("compute_capability") or []
    return Gpu(
        index=number("index"),
        uuid=str(answer["uuid"]),
        pci_bus_id=normalise_bus_id(str(answer["pci_busId"])),
        name=str(answer["name"]),
        memory_mib=number("memory_total_mib"),
        numa_node=nodes[0] if nodes else None,
        cpu_affinity=format_cpulist(_mask_bits(answer.get("cpu_affinity_words") or [])),  # type: ignore[arg-type]
        compute_capability=".".join(str(p) for p in capability) if capability else "",  # type: ignore[attr-defined]
        pcie_generation=number("pcie_curr_gen"),
        pcie_width=number("pcie_curr_width"),
        pcie_max_generation=number("pcie_max_gen_gpu"),
        pcie_max_width=number("pcie_max_width"),
    )


_NETDEV = re.compile(r"^/sys/class/net/(\S+) -> (\S+) speed=(-?\d*) state=")
_PCI_NUMA = re.compile(r"^(\w{4}:\w{2}:\w{2}\.\w) .*\bnuma=(-?\d+)")


def _recorded_netdevs(sysfs_text: str) -> list[tuple[str, int]]:
    """Physical netdevs of a sysfs listing and their speed (virtual ones are no NICs)."""
    found = []
    for line in sysfs_text.splitlines():
        match = _NETDEV.match(line)
        if match and "/virtual/" not in match[2]:
            found.append((match[1], int(match[3] or -1)))
    return found


def _recorded_pci_numa(sysfs_text: str) -> dict[str, int | None]:
    """`numa_node` of every PCI function in a sysfs listing; -1 (none) becomes None."""
    found: dict[str, int | None] = {}
    for line in sysfs_text.splitlines():
        match = _PCI_NUMA.match(line)
        if match:
            node = int(match[2])
            found[normalise_bus_id(match[1])] = node if node >= 0 else None
    return found
