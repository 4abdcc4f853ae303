"""What the hardware said, before it means anything: plain values read from NVML and sysfs.

The NVML adapter (`exporter.nvml`) and the sysfs reader (`exporter.sysfs`) fill these; discovery
(`exporter.discovery`) and health (`exporter.health`) turn them into a `NodeTopology`. Keeping
the raw reading separate from the model lets discovery be a pure function, table-tested without
hardware, and lets metrics show what NVML said (the PCIe generation an idle GPU dropped to, the
P2P status of a pair) even where the model records something else.

A field NVML or sysfs could not give is None (or empty); the reason is one line in `problems`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gputopo.topology import NicKind, NumaNode, NvmlStatus

__all__ = [
    "NVLINK_ERROR_COUNTERS",
    "FabricReading",
    "GpuActivity",
    "GpuReading",
    "NicReading",
    "NvLinkReading",
    "NvmlReading",
    "P2pStatus",
    "PairReading",
    "PciDevice",
    "RemoteType",
    "SysfsReading",
    "is_nvidia_device",
    "normalise_bus_id",
    "nvlink_generation",
]

# NVML's NVLink version enum (NVML_NVLINK_VERSION_*) -> NVLink generation as NVIDIA markets it
# (and as `gputopo.bandwidth` counts): 1.0 P100, 2.0/2.2 V100, 3.0/3.1 A100, 4.0 H100, 5.0 B200.
_NVLINK_GENERATIONS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

_NVIDIA_VENDOR = 0x10DE

# nvmlDeviceGetNvLinkErrorCounter counters we watch (NVML_NVLINK_ERROR_DL_*), by name.
NVLINK_ERROR_COUNTERS: dict[str, int] = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


def nvlink_generation(nvml_version: int | None) -> int:
    """NVLink generation of an NVML version enum value; 0 when unknown."""
    return _NVLINK_GENERATIONS.get(nvml_version or 0, 0)


def normalise_bus_id(bus_id: str) -> str:
    """PCI address as sysfs writes it (`0000:18:00.0`): NVML pads the domain to 8 digits.

    Text that is not a PCI address comes back lower-cased and stripped, unchanged otherwise.
    """
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3 and "." in parts[2]:
        domain, bus, devfn = parts
        try:
            return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{devfn}"
        except ValueError:
            return text
    if len(parts) == 2 and "." in parts[1]:  # no domain: domain 0
        return f"0000:{text}"
    return text


def is_nvidia_device(device_id: int) -> bool:
    """True when a `pciDeviceId` as NVML gives it (device << 16 | vendor) names NVIDIA's device."""
    return device_id & 0xFFFF == _NVIDIA_VENDOR


class RemoteType(enum.IntEnum):
    """What is at the far end of an NVLink (NVML_NVLINK_DEVICE_TYPE_*)."""

    GPU = 0
    IBMNPU = 1
    SWITCH = 2
    UNKNOWN = 0xFF


class P2pStatus(enum.IntEnum):
    """nvmlDeviceGetP2PStatus answers (NVML_P2P_STATUS_*), as `nvidia-smi topo -p2p` prints."""

    OK = 0
    CHIPSET_NOT_SUPPORTED = 1
    GPU_NOT_SUPPORTED = 2
    TOPOLOGY_NOT_SUPPORTED = 3
    DISABLED_BY_REGKEY = 4
    NOT_SUPPORTED = 5
    UNKNOWN = 6

    @property
    def code(self) -> str:
        """nvidia-smi's short code (OK, CNS, GNS, TNS, DR, NS, U)."""
        return ("OK", "CNS", "GNS", "TNS", "DR", "NS", "U")[self.value]


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    """One NVLink of a GPU. `remote_type` is None when NVML could not say (old drivers)."""

    link: int
    active: bool
    version: int | None = None
    remote_bus_id: str = ""
    remote_device_id: int = 0  # pciDeviceId of the far end: device << 16 | vendor
    remote_type: RemoteType | None = None
    errors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FabricReading:
    """nvmlDeviceGetGpuFabricInfo(V): multi-node NVLink registration of a GPU."""

    cluster_uuid: str
    clique_id: int
    state: int
    status: int = 0  # NVML return code of the registration; 0 is success
    health_mask: int = 0


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as NVML described it. Unknown numbers are None."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""
    memory_mib: int | None = None
    numa_node: int | None = None
    cpu_affinity: str = ""
    compute_capability: str = ""
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    nvlinks: tuple[NvLinkReading, ...] = ()
    fabric: FabricReading | None = None
    utilization_percent: int | None = None


@dataclass(frozen=True, slots=True)
class PairReading:
    """What NVML says about a GPU pair (a < b): the PCIe common ancestor and P2P read status."""

    a: int
    b: int
    common_ancestor: int | None = None
    p2p_read: P2pStatus | None = None


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """Everything one pass over NVML found. `errors` counts calls that failed unexpectedly."""

    status: NvmlStatus
    gpus: tuple[GpuReading, ...] = ()
    pairs: tuple[PairReading, ...] = ()
    problems: tuple[str, ...] = ()
    errors: int = 0

    def pair(self, a: int, b: int) -> PairReading | None:
        """The reading of a GPU pair, in either order."""
        lo, hi = min(a, b), max(a, b)
        return next((p for p in self.pairs if (p.a, p.b) == (lo, hi)), None)


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """How busy a GPU is right now, for probes that must stay out of the way."""

    index: int
    utilization_percent: int | None
    processes: int | None


@dataclass(frozen=True, slots=True)
class PciDevice:
    """Where a PCI function sits: its host bridge (`pci0000:00`) and the chain of PCI
    addresses from the root port down to itself, with what sysfs says about its link."""

    bus_id: str
    host_bridge: str
    chain: tuple[str, ...]
    numa_node: int | None = None
    local_cpus: str = ""
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None


@dataclass(frozen=True, slots=True)
class NicReading:
    """A network adapter as sysfs shows it (an RDMA device, or a plain netdev)."""

    name: str
    kind: NicKind
    netdev: str = ""
    speed_mbps: int = 0
    up: bool = False
    pci: PciDevice | None = None


@dataclass(frozen=True, slots=True)
class SysfsReading:
    """NUMA nodes, NICs and the PCI devices asked about, read from one sysfs root."""

    numa_nodes: tuple[NumaNode, ...] = ()
    nics: tuple[NicReading, ...] = ()
    pci: dict[str, PciDevice] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    errors: int = 0
