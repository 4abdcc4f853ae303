"""The sysfs reader, against trees built in tmp_path and against this machine's /sys."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.readings import PciDevice
from exporter.sysfs import Sysfs, pci_path_kind
from gputopo.links import LinkKind
from gputopo.topology import NicKind


def dev(host: str, *chain: str, numa: int | None = 0) -> PciDevice:
    return PciDevice(bus_id=chain[-1], host_bridge=host, chain=chain, numa_node=numa)


@dataclass(frozen=True)
class PathCase:
    a: PciDevice
    b: PciDevice
    want: LinkKind


PATHS = [
    pytest.param(
        PathCase(
            dev("pci0000:00", "rp", "up", "d1", "gpu"),
            dev("pci0000:00", "rp", "up", "d2", "nic"),
            LinkKind.PIX,
        ),
        id="two downstream ports of one switch: PIX",
    ),
    pytest.param(
        PathCase(
            dev("pci0000:00", "rp", "u1", "d1", "u2", "d2a", "gpu"),
            dev("pci0000:00", "rp", "u1", "d1", "u2", "d2b", "nic"),
            LinkKind.PIX,
        ),
        id="one switch deep below another: still PIX",
    ),
    pytest.param(
        PathCase(
            dev("pci0000:00", "rp", "u1", "d1", "u2", "d2", "gpu"),
            dev("pci0000:00", "rp", "u1", "d1b", "nic"),
            LinkKind.PXB,
        ),
        id="through two switches: PXB",
    ),
    pytest.param(
        PathCase(dev("pci0000:00", "rp1", "gpu"), dev("pci0000:00", "rp2", "nic"), LinkKind.PHB),
        id="two root ports of one host bridge: PHB",
    ),
    pytest.param(
        PathCase(dev("pci0000:00", "gpu"), dev("pci0000:00", "nic"), LinkKind.PHB),
        id="a flat VM bus: PHB",
    ),
    pytest.param(
        PathCase(
            dev("pci0000:00", "rp", "gpu", numa=0),
            dev("pci0000:17", "rp", "nic", numa=0),
            LinkKind.NODE,
        ),
        id="two host bridges on one NUMA node: NODE",
    ),
    pytest.param(
        PathCase(
            dev("pci0000:00", "rp", "gpu", numa=0),
            dev("pci0000:80", "rp", "nic", numa=1),
            LinkKind.SYS,
        ),
        id="host bridges on two sockets: SYS",
    ),
    pytest.param(
        PathCase(
            dev("pci0000:00", "rp", "gpu", numa=None),
            dev("pci0000:17", "rp", "nic", numa=None),
            LinkKind.SYS,
        ),
        id="NUMA unknown across host bridges: the worse case, SYS",
    ),
]


@pytest.mark.parametrize("case", PATHS)
def test_pci_path_kind(case: PathCase) -> None:
    assert pci_path_kind(case.a, case.b) is case.want
    assert pci_path_kind(case.b, case.a) is case.want


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def link(at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(os.path.relpath(target, at.parent))


def test_nics_of_every_kind_and_virtual_netdevs_left_out(tmp_path: Path) -> None:
    root = tmp_path
    bridge = root / "devices" / "pci0000:00" / "0000:00:01.0"
    ib, roce, efa = (bridge / f"0000:0{i}:00.0" for i in (1, 2, 3))
    for device, numa in ((ib, "0"), (roce, "1"), (efa, "-1")):
        write(device / "numa_node", numa)
    for name, device, layer, state, rate in (
        ("mlx5_0", ib, "InfiniBand", "4: ACTIVE", "400 Gb/sec (4X NDR)"),
        ("mlx5_1", roce, "Ethernet", "1: DOWN", "100 Gb/sec (4X EDR)"),
        ("rdmap3s0", efa, "Unspecified", "4: ACTIVE", "100 Gb/sec"),
    ):
        rdma = device / "infiniband" / name
        write(rdma / "ports" / "1" / "link_layer", layer)
        write(rdma / "ports" / "1" / "state", state)
        write(rdma / "ports" / "1" / "rate", rate)
        link(rdma / "device", device)
        link(root / "class" / "infiniband" / name, rdma)
    driver = root / "bus" / "pci" / "drivers" / "efa"
    driver.mkdir(parents=True)
    link(efa / "driver", driver)
    link(roce / "net" / "eth3" / "device", roce)
    write(roce / "net" / "eth3" / "speed", "100000")
    write(root / "devices" / "virtual" / "net" / "lo" / "operstate", "unknown")
    link(root / "class" / "net" / "lo", root / "devices" / "virtual" / "net" / "lo")

    nics = Sysfs(root).nics()
    assert [(n.name, n.kind, n.speed_mbps, n.up) for n in nics] == [
        ("mlx5_0", NicKind.INFINIBAND, 400_000, True),
        ("mlx5_1", NicKind.ROCE, 100_000, False),
        ("rdmap3s0", NicKind.EFA, 100_000, True),
    ]
    assert nics[1].netdev == "eth3"
    assert [n.pci.numa_node if n.pci else "?" for n in nics] == [0, 1, None]
    assert nics[0].pci is not None
    assert nics[0].pci.chain == ("0000:00:01.0", "0000:01:00.0")


def test_without_rdma_a_physical_netdev_is_the_nic_and_its_device_may_sit_below_virtio(
    tmp_path: Path,
) -> None:
    """As on this kind of VM: eth0 -> .../0000:00:03.0/virtio2/net/eth0."""
    pci = tmp_path / "devices" / "pci0000:00" / "0000:00:03.0"
    net = pci / "virtio2" / "net" / "eth0"
    write(net / "speed", "-1")
    write(net / "operstate", "up")
    link(net / "device", pci / "virtio2")
    link(tmp_path / "class" / "net" / "eth0", net)
    (nic,) = Sysfs(tmp_path).nics()
    assert (nic.name, nic.kind, nic.speed_mbps, nic.up) == ("eth0", NicKind.ETHERNET, 0, True)
    assert nic.pci is not None
    assert nic.pci.bus_id == "0000:00:03.0"


def test_numa_nodes_with_distances_and_memory(tmp_path: Path) -> None:
    base = tmp_path / "devices" / "system" / "node"
    for i, cpus in ((0, "0-23,48-71"), (1, "24-47,72-95")):
        write(base / f"node{i}" / "cpulist", cpus)
        write(base / f"node{i}" / "distance", "10 21" if i == 0 else "21 10")
        write(base / f"node{i}" / "meminfo", f"Node {i} MemTotal:       263856800 kB")
    write(base / "online", "0-1")
    nodes = Sysfs(tmp_path).numa_nodes()
    assert [(n.id, n.cpus, n.distances, n.memory_mib) for n in nodes] == [
        (0, "0-23,48-71", (10, 21), 257672),
        (1, "24-47,72-95", (21, 10), 257672),
    ]


def test_missing_and_odd_files_leave_values_unknown(tmp_path: Path) -> None:
    gpu = tmp_path / "devices" / "pci0000:00" / "0000:18:00.0"
    write(gpu / "current_link_speed", "Unknown")
    write(gpu / "current_link_width", "garbage")
    write(gpu / "numa_node", "-1")
    link(tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0", gpu)
    reading = Sysfs(tmp_path).read(bus_ids=["00000000:18:00.0", "0000:99:00.0"])
    device = reading.pci["0000:18:00.0"]
    assert (device.pcie_generation, device.pcie_width, device.numa_node) == (None, None, None)
    assert reading.problems == (f"PCI device 0000:99:00.0: not found under {tmp_path}/bus/pci",)
    assert reading.nics == ()
    assert reading.numa_nodes == ()


def test_an_empty_root_reads_as_nothing_without_error(tmp_path: Path) -> None:
    reading = Sysfs(tmp_path / "nothing-here").read()
    assert (reading.numa_nodes, reading.nics, reading.problems) == ((), (), ())


def test_this_machines_real_sys_reads_without_error() -> None:
    reading = Sysfs().read()
    assert reading.errors == 0
    assert reading.numa_nodes
    assert all(n.cpus for n in reading.numa_nodes)
    assert all(n.name for n in reading.nics)
    assert all(n.pci is None or n.pci.host_bridge.startswith("pci") for n in reading.nics)


def test_where_a_device_sits_is_kept_while_its_link_is_the_same(tmp_path: Path) -> None:
    """Sysfs keeps a device's place and fixed files per link target; what can change is read
    every pass, and a link that points elsewhere (or a device that is gone) is read anew."""
    first = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:18:00.0"
    second = tmp_path / "devices" / "pci0000:80" / "0000:80:01.0" / "0000:18:00.0"
    for device, numa in ((first, "0"), (second, "1")):
        write(device / "numa_node", numa)
        write(device / "max_link_speed", "32.0 GT/s PCIe")
        write(device / "current_link_speed", "32.0 GT/s PCIe")
        write(device / "local_cpulist", "0-7")
    address = tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0"
    link(address, first)
    sysfs = Sysfs(tmp_path)
    before = sysfs.pci_device("0000:18:00.0")
    assert before is not None
    assert (before.host_bridge, before.numa_node, before.pcie_generation) == ("pci0000:00", 0, 5)

    write(first / "current_link_speed", "2.5 GT/s PCIe")  # trained down to save power
    write(first / "local_cpulist", "0-3")  # CPUs taken offline
    now = sysfs.pci_device("0000:18:00.0")
    assert now is not None
    assert (now.pcie_generation, now.pcie_max_generation, now.local_cpus) == (1, 5, "0-3")

    address.unlink()
    link(address, second)  # the same address, another place (a re-enumerated bus)
    moved = sysfs.pci_device("0000:18:00.0")
    assert moved is not None
    assert (moved.host_bridge, moved.numa_node) == ("pci0000:80", 1)

    address.unlink()
    assert sysfs.pci_device("0000:18:00.0") is None
