"""Write the sysfs tree of a fake machine, as the kernel lays it out, under any root.

The sysfs reader is tested the way prometheus/client_python tests its process collector: against
a fixture tree. This writes one for a `FakeMachine`: NUMA nodes, every GPU and NIC at its place
under `devices/pci<dom>:<bus>/` with the `bus/pci/devices` links, RDMA devices in
`class/infiniband` (ports with state, rate, link layer; the `efa` driver for EFA) and netdevs
in `class/net`, all with the files and relative symlinks a real kernel has.
"""

from __future__ import annotations

import os
from pathlib import Path

from exporter.fake_machine import FakeMachine
from gputopo.topology import Nic, NicKind

__all__ = ["write_sysfs"]

_RATES = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe"}
_RATES |= {5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}
_NIC_CLASS = {NicKind.INFINIBAND: "0x020700"}
_VENDORS = {NicKind.EFA: "0x1d0f"}
_DEFAULT_NODE_MIB = 256 * 1024


def write_sysfs(machine: FakeMachine, root: Path, *, nic_up: dict[int, bool] | None = None) -> Path:
    """Write the machine's sysfs under `root` (created if needed); returns `root`."""
    topology = machine.topology
    up = nic_up or {}
    _write_numa(machine, root)
    devices = root / "devices"
    for address, device in machine.pci.items():
        where = devices / device.host_bridge
        for bridge in device.chain[:-1]:
            where = where / bridge
            _files(where, {"class": "0x060400", "vendor": "0x10de", "numa_node": "-1"})
        where = where / address
        numa = "-1" if device.numa_node is None else str(device.numa_node)
        _files(where, {"numa_node": numa, "local_cpulist": _node_cpus(machine, device.numa_node)})
        _link(root / "bus" / "pci" / "devices" / address, where)
    for g in topology.gpus:
        where = _device_dir(machine, root, g.pci_bus_id)
        current = (g.pcie_generation, g.pcie_width)
        maximum = (g.pcie_max_generation or g.pcie_generation, g.pcie_max_width or g.pcie_width)
        _files(
            where,
            {
                "class": "0x030200",
                "vendor": "0x10de",
                "current_link_speed": _RATES.get(current[0], "Unknown"),
                "current_link_width": str(current[1]),
                "max_link_speed": _RATES.get(maximum[0], "Unknown"),
                "max_link_width": str(maximum[1]),
            },
        )
    for n in topology.nics:
        _write_nic(machine, root, n, up.get(n.index, n.up))
    return root


def _device_dir(machine: FakeMachine, root: Path, address: str) -> Path:
    device = machine.pci[address]
    return root / "devices" / device.host_bridge / Path(*device.chain)


def _node_cpus(machine: FakeMachine, node: int | None) -> str:
    found = next((n for n in machine.topology.numa_nodes if n.id == node), None)
    return found.cpus if found is not None else ""


def _write_numa(machine: FakeMachine, root: Path) -> None:
    nodes = machine.topology.numa_nodes
    base = root / "devices" / "system" / "node"
    for node in nodes:
        distances = node.distances or tuple(10 if m.id == node.id else 21 for m in nodes)
        memory_kib = (node.memory_mib or _DEFAULT_NODE_MIB) * 1024
        _files(
            base / f"node{node.id}",
            {
                "cpulist": node.cpus,
                "distance": " ".join(str(d) for d in distances),
                "meminfo": f"Node {node.id} MemTotal:       {memory_kib} kB\n",
            },
        )
    _files(base, {"online": ",".join(str(n.id) for n in nodes)})


def _write_nic(machine: FakeMachine, root: Path, n: Nic, up: bool) -> None:
    where = _device_dir(machine, root, n.pci_bus_id)
    _files(
        where,
        {
            "class": _NIC_CLASS.get(n.kind, "0x020000"),
            "vendor": _VENDORS.get(n.kind, "0x15b3"),
        },
    )
    net = where / "net" / n.netdev
    _files(
        net,
        {
            "speed": str(n.speed_mbps) if up and n.speed_mbps > 0 else "-1",  # -1: unknown
            "operstate": "up" if up else "down",
            "type": "32" if n.kind is NicKind.INFINIBAND else "1",
        },
    )
    _link(net / "device", where)
    _link(root / "class" / "net" / n.netdev, net)
    if n.kind is NicKind.ETHERNET:
        return  # a plain netdev has no RDMA device
    driver = "efa" if n.kind is NicKind.EFA else "mlx5_core"
    driver_dir = root / "bus" / "pci" / "drivers" / driver
    driver_dir.mkdir(parents=True, exist_ok=True)
    _link(where / "driver", driver_dir)
    rdma = where / "infiniband" / n.name
    layer = {NicKind.INFINIBAND: "InfiniBand", NicKind.ROCE: "Ethernet"}.get(n.kind, "Unspecified")
    _files(
        rdma / "ports" / "1",
        {
            "state": "4: ACTIVE" if up else "1: DOWN",
            "rate": f"{n.speed_mbps / 1000:g} Gb/sec (4X)",
            "link_layer": layer,
        },
    )
    _link(rdma / "device", where)
    _link(root / "class" / "infiniband" / n.name, rdma)


def _files(directory: Path, contents: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (directory / name).write_text(text if text.endswith("\n") else text + "\n")


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs has them, so the tree can move."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))
