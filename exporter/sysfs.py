"""Read NUMA nodes, NICs and the PCI tree from sysfs, under a root that tests choose.

NVML knows GPUs; the NICs a GPU should use, and which NUMA node a NIC hangs off, only the kernel
knows. `Sysfs(root)` reads them from `root` (`/sys` on a node, a tree in `tmp_path` in tests,
as prometheus/client_python tests its process collector against a fixture `/proc`):

- NUMA nodes: `devices/system/node/node<N>/{cpulist,distance,meminfo}`;
- RDMA NICs: `class/infiniband/<dev>` (port state, rate, link layer; the driver says EFA), and
  plain netdevs from `class/net` only on a node without RDMA devices, where sockets are all NCCL
  has (virtual interfaces such as `lo`, bridges and veths are never NICs);
- PCI devices: `bus/pci/devices/<addr>` resolved to its place under `devices/pci<dom>:<bus>/`.

`pci_path_kind` classifies the path between two PCI devices exactly as `nvidia-smi topo -m` does
(PIX, PXB, PHB, NODE, SYS), which is how GPUs find their nearest NICs.

Nothing here raises for a missing or odd file: the value stays unknown, and files that every
such device has get a line in `problems`.

Where a PCI device sits cannot change while its sysfs links point to the same place: resolving
a link (`realpath`, a `stat` per path component) and the files that never change for a device
(`numa_node`, `max_link_speed`, `max_link_width`) are read once per (link, link target) and
kept; every pass still reads the links themselves, whether the device is there, its CPUs and
its link as trained now. A link that points elsewhere, or a device that is gone, is read anew.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from exporter.readings import NicReading, PciDevice, SysfsReading, normalise_bus_id
from gputopo.importers.idlists import parse_idlist
from gputopo.importers.nccl_xml import pcie_generation
from gputopo.links import LinkKind
from gputopo.topology import NicKind, NumaNode

__all__ = ["Sysfs", "pci_path_kind"]

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_NODE_DIR = re.compile(r"^node(\d+)$")
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")
_MEMTOTAL = re.compile(r"MemTotal:\s*(\d+)\s*kB")
_NATURAL = re.compile(r"(\d+)")


def _natural(name: str) -> tuple[object, ...]:
    """Sort key putting mlx5_2 before mlx5_10."""
    return tuple(int(p) if p.isdigit() else p for p in _NATURAL.split(name))


def pci_path_kind(a: PciDevice, b: PciDevice) -> LinkKind:
    """nvidia-smi's class of the PCIe path between two devices.

    1. Different host bridges: NODE when both are known to be on one NUMA node, else SYS (an
       unknown NUMA node is taken for the worse case).
    2. One host bridge, nothing else in common: PHB.
    3. A common bridge with at most a switch port and the device below it on each side: PIX
       ("at most a single PCIe bridge"); deeper on either side: PXB.
    """
    if a.host_bridge != b.host_bridge:
        same_numa = a.numa_node is not None and a.numa_node == b.numa_node
        return LinkKind.NODE if same_numa else LinkKind.SYS
    common = 0
    for x, y in zip(a.chain[:-1], b.chain[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return LinkKind.PHB
    if len(a.chain) - common <= 2 and len(b.chain) - common <= 2:
        return LinkKind.PIX
    return LinkKind.PXB


class Sysfs:
    """Reads one sysfs tree (see the module docstring)."""

    def __init__(self, root: Path = Path("/sys")) -> None:
        self.root = root
        # (path, what its links say) -> where the device is and what never changes for it.
        self._places: dict[tuple[str, ...], _Place] = {}

    def read(self, *, bus_ids: Iterable[str] = ()) -> SysfsReading:
        """NUMA nodes, NICs, and the PCI devices with the given addresses (GPUs)."""
        problems: list[str] = []
        pci: dict[str, PciDevice] = {}
        for bus_id in bus_ids:
            address = normalise_bus_id(bus_id)
            device = self.pci_device(address)
            if device is None:
                problems.append(f"PCI device {address}: not found under {self.root}/bus/pci")
            else:
                pci[address] = device
        nics = self.nics()
        return SysfsReading(
            numa_nodes=self.numa_nodes(),
            nics=nics,
            pci=pci,
            problems=tuple(problems),
            errors=len(problems),
        )

    # --- NUMA -----------------------------------------------------------------------------

    def numa_nodes(self) -> tuple[NumaNode, ...]:
        """The NUMA nodes, by id; empty on a kernel without NUMA."""
        base = self.root / "devices" / "system" / "node"
        found = []
        for entry in _listdir(base):
            match = _NODE_DIR.match(entry)
            if match is None:
                continue
            node = base / entry
            distances = _read(node / "distance")
            memory = _MEMTOTAL.search(_read(node / "meminfo"))
            found.append(
                NumaNode(
                    id=int(match.group(1)),
                    cpus=_read(node / "cpulist"),
                    memory_mib=int(memory.group(1)) // 1024 if memory else 0,
                    distances=tuple(int(d) for d in distances.split() if d.isdigit()),
                )
            )
        return tuple(sorted(found, key=lambda n: n.id))

    # --- NICs -----------------------------------------------------------------------------

    def nics(self) -> tuple[NicReading, ...]:
        """RDMA devices; plain physical netdevs when there is none."""
        rdma = [
            self._rdma_nic(name)
            for name in sorted(_listdir(self.root / "class" / "infiniband"), key=_natural)
        ]
        if rdma:
            return tuple(rdma)
        found = []
        for name in sorted(_listdir(self.root / "class" / "net"), key=_natural):
            net = self.root / "class" / "net" / name
            target = os.path.realpath(net)
            if "/virtual/" in target or not (net / "device").exists():
                continue
            speed = _int(_read(net / "speed"))
            found.append(
                NicReading(
                    name=name,
                    kind=NicKind.ETHERNET,
                    netdev=name,
                    speed_mbps=max(speed or 0, 0),
                    up=_read(net / "operstate") == "up",
                    pci=self._pci_of(net / "device"),
                )
            )
        return tuple(found)

    def _rdma_nic(self, name: str) -> NicReading:
        dev = self.root / "class" / "infiniband" / name
        ports = sorted(_listdir(dev / "ports"), key=_natural)
        states = {port: _read(dev / "ports" / port / "state") for port in ports}
        # The first active port speaks for the device; a device with none active is down.
        port = next((p for p in ports if states[p].endswith("ACTIVE")), ports[0] if ports else "")
        layer = _read(dev / "ports" / port / "link_layer") if port else ""
        rate = _RATE.match(_read(dev / "ports" / port / "rate")) if port else None
        driver = os.path.basename(os.path.realpath(dev / "device" / "driver"))
        netdevs = sorted(_listdir(dev / "device" / "net"), key=_natural)
        if driver == "efa":
            kind = NicKind.EFA
        elif layer == "InfiniBand":
            kind = NicKind.INFINIBAND
        elif layer == "Ethernet":
            kind = NicKind.ROCE
        else:
            kind = NicKind.UNKNOWN
        speed = int(float(rate.group(1)) * 1000) if rate else 0
        if not speed and netdevs:
            speed = max(_int(_read(dev / "device" / "net" / netdevs[0] / "speed")) or 0, 0)
        return NicReading(
            name=name,
            kind=kind,
            netdev=netdevs[0] if netdevs else "",
            speed_mbps=speed,
            up=bool(port) and states[port].endswith("ACTIVE"),
            pci=self._pci_of(dev / "device"),
        )

    # --- PCI ------------------------------------------------------------------------------

    def pci_device(self, bus_id: str) -> PciDevice | None:
        """The PCI device with this address, or None when sysfs has none."""
        link = self.root / "bus" / "pci" / "devices" / normalise_bus_id(bus_id)
        if not link.exists():
            return None
        return self._pci_of(link)

    def _pci_of(self, path: Path) -> PciDevice | None:
        """The PCI device a sysfs path leads to (the nearest PCI function above it)."""
        if not path.exists():
            return None
        key = _link_key(path)
        place = self._places.get(key) if key else None
        if place is None:
            place = _locate(path)
            if place is None:
                return None
            if key:
                if len(self._places) >= _MAX_PLACES:
                    self._places.clear()  # devices come and go for ever: never grow unbounded
                self._places[key] = place
        device = place.device
        return replace(
            place.found,
            local_cpus=_cpulist(_read(device / "local_cpulist")),
            pcie_generation=_generation(_read(device / "current_link_speed")),
            pcie_width=_int(_read(device / "current_link_width")),
        )


# Far more PCI devices than a node has: the cache is emptied past this, never grows unbounded.
_MAX_PLACES = 4096


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a PCI device is, and what never changes for it (the rest filled in per read)."""

    device: Path
    found: PciDevice


def _link_key(path: Path) -> tuple[str, ...]:
    """`path` and the targets of the symlinks it goes through (itself and its parent, which is
    how sysfs links a device: `bus/pci/devices/<addr>`, `class/*/<name>/device`); () when
    one cannot be read, so nothing is kept."""
    try:
        parts = [str(path), os.readlink(path)]
        if path.parent.is_symlink():
            parts.append(os.readlink(path.parent))
    except OSError:
        return ()
    return tuple(parts)


def _locate(path: Path) -> _Place | None:
    """Resolve `path` to its PCI function; None when it is on no PCI bus."""
    parts = Path(os.path.realpath(path)).parts
    roots = [at for at, part in enumerate(parts) if _HOST_BRIDGE.match(part)]
    if not roots:
        return None  # not on a PCI bus (platform or virtual device)
    start = roots[-1]
    chain: list[str] = []
    for part in parts[start + 1 :]:
        if not _BDF.match(part):
            break  # below the PCI function: virtio2/net/eth0 and the like
        chain.append(part)
    if not chain:
        return None
    device = Path(*parts[: start + 1 + len(chain)])
    numa = _int(_read(device / "numa_node"))
    return _Place(
        device=device,
        found=PciDevice(
            bus_id=chain[-1],
            host_bridge=parts[start],
            chain=tuple(chain),
            numa_node=numa if numa is not None and numa >= 0 else None,
            pcie_max_generation=_generation(_read(device / "max_link_speed")),
            pcie_max_width=_int(_read(device / "max_link_width")),
        ),
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _generation(text: str) -> int | None:
    try:
        return pcie_generation(text) or None
    except ValueError:
        return None  # "Unknown", as sysfs says for a link that is not up


def _cpulist(text: str) -> str:
    try:
        parse_idlist(text)
    except ValueError:
        return ""
    return text
