"""Nominal bandwidth and latency of links, from published figures, when nothing was measured.

Units everywhere in gputopo: bandwidth in GB/s (10^9 bytes per second) **per direction**, latency
in microseconds. Vendors quote NVLink bidirectionally ("900 GB/s" for H100); we store half of that
(450), which is what one copy in one direction can reach at line rate.

Sources:
- NVLink per link per direction: 20 GB/s for NVLink 1 (P100), 25 GB/s for NVLink 2-4
  (V100, A100: 12 links = 300 GB/s/dir; H100: 18 links = 450 GB/s/dir), 50 GB/s for NVLink 5
  (B200/GB200: 18 links = 900 GB/s/dir). `nvidia-smi nvlink -s` shows 25 GB/s per A100 link.
- Grace C2C: 900 GB/s bidirectional -> 450 per direction (nvbandwidth#41).
- PCIe per lane per direction after line coding: Gen1 0.25, Gen2 0.5, Gen3 0.985, Gen4 1.969,
  Gen5 3.938, Gen6 7.563 GB/s.
- GPU peer traffic over PCIe does not reach the link rate, and less so the further it travels.
  Measured fractions of the x16 link rate: same switch 0.83 and across switches 0.70 (A6000 Gen4,
  26.3 and ~22 GB/s, nvbandwidth#50); through the CPU across sockets 0.59 (H100 Gen5 host-staged
  ~37 GB/s, nccl#1264). PHB and NODE are interpolated between those.
- Host memory copies (copy engines, pinned memory, the GPU's own NUMA node) are not peer
  traffic: they reach 0.87 of the x16 link rate. A real H100 80GB HBM3 at Gen5 x16 (63.0 GB/s)
  copied 54.25 GB/s host-to-device and 53.93 back (nvbandwidth v0.8 memcpy CE, 256 MiB), 54.6 and
  53.9 with PyTorch, 54.8-55.3 over three runs with every tool (tests/data/
  nvbandwidth_h100_vm_256mib.txt, torch_copy_bandwidth_h100_vm.json). Host memory on another
  socket adds the socket interconnect; no recording measures it, so it pays the same penalty
  that peer traffic pays from PHB to SYS (0.59 / 0.66), an assumption.
- Device-local copies (one GPU, memory to memory, bytes copied per second in one direction):
  1491 GB/s for an H100 80GB HBM3 (nvbandwidth device_local_copy 1492.86; PyTorch 1430-1464),
  by product name; unknown products have no figure.
- NICs: line rate / 8 (NDR 400 Gb/s -> 50 GB/s, HDR 200 -> 25, EFA/RoCE 100 -> 12.5). A NIC
  whose speed the kernel does not report (virtio, some VFs: speed -1) has no figure: 0, unknown.
"""

from __future__ import annotations

from gputopo.links import LinkKind

__all__ = [
    "C2C_GBPS",
    "HOST_COPY_EFFICIENCY",
    "NVLINK_GBPS_PER_LANE",
    "NVLINK_MAX_LANES",
    "ceiling_gbps",
    "device_local_gbps",
    "host_path_gbps",
    "latency_us",
    "nic_gbps",
    "nvlink_gbps",
    "pcie_gbps",
    "pcie_path_gbps",
]

# NVLink generation (marketing number: 1 = P100 ... 5 = Blackwell) -> GB/s per link per direction.
NVLINK_GBPS_PER_LANE: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0, 6: 100.0}
# Used when the generation is unknown: NVLink 4 is the most common generation in clusters today.
_DEFAULT_NVLINK_GENERATION = 4

C2C_GBPS = 450.0

_PCIE_GBPS_PER_LANE: dict[int, float] = {
    1: 0.25,
    2: 0.5,
    3: 0.985,
    4: 1.969,
    5: 3.938,
    6: 7.563,
}

# Fraction of the PCIe link rate that GPU peer traffic reaches along each path class.
_PCIE_PATH_EFFICIENCY: dict[LinkKind, float] = {
    LinkKind.PIX: 0.83,
    LinkKind.PXB: 0.70,
    LinkKind.PHB: 0.66,
    LinkKind.NODE: 0.62,
    LinkKind.SYS: 0.59,
}

# Fraction of the PCIe link rate that copy-engine copies to and from pinned host memory reach,
# on the GPU's own NUMA node (see the module docstring for the recordings).
HOST_COPY_EFFICIENCY = 0.87
_REMOTE_HOST_PENALTY = _PCIE_PATH_EFFICIENCY[LinkKind.SYS] / _PCIE_PATH_EFFICIENCY[LinkKind.PHB]

# Device-local copy bandwidth by GPU product name (nvidia-smi's / NVML's name).
_DEVICE_LOCAL_GBPS: dict[str, float] = {"NVIDIA H100 80GB HBM3": 1491.0}

# Per-hop latency used by the cost model's alpha term (microseconds). NVLink and C2C are a few
# hundred ns of wire plus protocol; NCCL's own tuning model charges a few microseconds per ring
# step on NVLink and more over PCIe and the network, which is what these reflect.
_LATENCY_US: dict[LinkKind, float] = {
    LinkKind.NVLINK: 2.0,
    LinkKind.C2C: 2.0,
    LinkKind.PIX: 3.0,
    LinkKind.PXB: 3.5,
    LinkKind.PHB: 4.0,
    LinkKind.NODE: 4.5,
    LinkKind.SYS: 6.0,
    LinkKind.NET: 8.0,
}


# Most NVLinks one GPU of a generation has (P100 4, V100 6, A100 12, H100 and Blackwell 18):
# all of them may join two GPUs through NVSwitch, so this bounds any pair.
NVLINK_MAX_LANES: dict[int, int] = {1: 4, 2: 6, 3: 12, 4: 18, 5: 18, 6: 18}
# Beyond any link of these kinds: PCIe Gen6 x16 (121 GB/s), a 1.6 Tb/s NIC (200 GB/s).
_PCIE_CEILING_GBPS = 7.563 * 16
_NET_CEILING_GBPS = 200.0


def ceiling_gbps(kind: LinkKind, *, nvlink_generation: int | None) -> float:
    """The most a link of this kind can carry per direction; for NVLink, of that generation
    (all of a GPU's lanes), or of the fastest one when the generation is unknown. A reported
    or measured figure above it is not a fact about the link (`gputopo.nominal.plausible`)."""
    if kind is LinkKind.NVLINK:
        gen = nvlink_generation if nvlink_generation in NVLINK_MAX_LANES else max(NVLINK_MAX_LANES)
        return NVLINK_MAX_LANES[gen] * NVLINK_GBPS_PER_LANE[gen]
    if kind is LinkKind.C2C:
        return C2C_GBPS
    if kind is LinkKind.NET:
        return _NET_CEILING_GBPS
    return _PCIE_CEILING_GBPS


def nvlink_gbps(*, lanes: int, generation: int | None) -> float:
    """Nominal one-direction bandwidth of `lanes` bonded NVLinks of a generation."""
    gen = generation if generation in NVLINK_GBPS_PER_LANE else _DEFAULT_NVLINK_GENERATION
    return lanes * NVLINK_GBPS_PER_LANE[gen]


def pcie_gbps(*, generation: int, width: int) -> float:
    """Line rate of a PCIe link per direction; 0 when the link is unknown."""
    if width <= 0 or generation not in _PCIE_GBPS_PER_LANE:
        return 0.0
    return _PCIE_GBPS_PER_LANE[generation] * width


def pcie_path_gbps(kind: LinkKind, *, link_gbps: float) -> float:
    """Expected GPU peer bandwidth along a PCIe path class, given the narrower endpoint link."""
    if not kind.is_pcie:
        raise ValueError(f"{kind.name} is not a PCIe path class")
    return round(link_gbps * _PCIE_PATH_EFFICIENCY[kind], 3)


def host_path_gbps(kind: LinkKind, *, link_gbps: float) -> float:
    """Expected copy bandwidth between a GPU and host memory: its own NUMA node (PHB or closer)
    or another socket's (NODE, SYS), given the GPU's PCIe link rate."""
    if not kind.is_pcie:
        raise ValueError(f"{kind.name} is not a PCIe path class")
    remote = kind > LinkKind.PHB
    return round(link_gbps * HOST_COPY_EFFICIENCY * (_REMOTE_HOST_PENALTY if remote else 1.0), 3)


def device_local_gbps(product: str) -> float:
    """Device-local copy bandwidth of a GPU product; 0 when no recording gives one."""
    return _DEVICE_LOCAL_GBPS.get(product, 0.0)


def nic_gbps(speed_mbps: int) -> float:
    """A NIC's line rate (Mb/s, as sysfs and NCCL report it) in GB/s."""
    return max(speed_mbps, 0) / 8000.0


def latency_us(kind: LinkKind) -> float:
    """Per-hop latency charged for one step over a link of this kind."""
    return _LATENCY_US[kind]
