"""What hardware can be: the bounds a reported or requested figure must lie within.

A report claiming 10,000 GPUs on one node, 12,000 fabric tiers, NVLink at 10^12 GB/s or a NaN
latency is not a fact about a cluster; accepting it grew the aggregator by gigabytes and drew
honest placements onto a fake node. Every limit here is generous beyond any machine built or
announced, with the reason beside it, so that a real node never meets one and an absurd one
always does. `check` raises `BoundsError` naming the field; decoders call it before anything
is applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

__all__ = [
    "MAX_CPULIST",
    "MAX_FABRIC_TIERS",
    "MAX_GBPS",
    "MAX_GPUS_PER_NODE",
    "MAX_LANES",
    "MAX_LATENCY_US",
    "MAX_LINKS_PER_NODE",
    "MAX_MEMORY_MIB",
    "MAX_NICS_PER_NODE",
    "MAX_NUMA_NODES",
    "MAX_PROBLEMS",
    "MAX_TEXT",
    "NODE_MEMORY_BUDGET",
    "REPORT_LIMITS",
    "BoundsError",
    "Limit",
    "check_count",
    "check_node_memory",
    "check_number",
    "check_text",
    "node_memory",
]

# The largest single nodes have 16-20 GPUs (DGX-2 class, PCIe servers); 128 leaves room for
# anything announced (an NVL72 rack is 18 nodes of 4, not one node).
MAX_GPUS_PER_NODE = 128
# Eight NICs per node is typical, 18 on some GB200 trays (4 CX-7 x 2 ports + DPUs); 64 is ample.
MAX_NICS_PER_NODE = 64
# 4x GH200 shows 36 NUMA nodes (GPU memory is a NUMA node each); 256 is ample.
MAX_NUMA_NODES = 256
# Every pair of devices once, and then some: (128 + 64 + 256)^2 / 2 would be 100k; no discovery
# reports more than GPU pairs, GPU-NIC and GPU-NUMA paths: well under 20,000.
MAX_LINKS_PER_NODE = 20_000
# Leaf, spine, core, super-spine, zone, region: 16 is far past any fabric.
MAX_FABRIC_TIERS = 16
# NVLink 5 bonds 18 lanes between a GPU and its NVSwitches; 72 leaves room for two generations.
MAX_LANES = 72
# 192 GB of HBM today (B200 192 GB, MI300X 192 GB); 4 TiB per GPU is far ahead of any roadmap.
MAX_MEMORY_MIB = 4 * 1024 * 1024
# NVLink 5 is 900 GB/s per direction per GPU, C2C 450; 10 TB/s per direction per link is ample.
MAX_GBPS = 10_000.0
# A probe's latency: ten seconds is no link.
MAX_LATENCY_US = 10_000_000.0
# Names, UUIDs, bus ids, labels: Kubernetes' longest name is 253 bytes; a reason a little more.
MAX_TEXT = 1024
MAX_PROBLEMS = 256
# A kernel cpulist ("0-31,64-95"); 1,024 CPUs listed one by one at worst alternate ("0,2,4,...")
# in under 4,096 characters.
MAX_CPULIST = 4096
# Kubernetes names: a Node or Pod name is a DNS subdomain (253), a namespace or container a label.
_K8S_NAME = 253
_K8S_LABEL = 63
# Linux numbers at most 1,024 NUMA nodes (CONFIG_NODES_SHIFT=10); ids may be sparse.
_NUMA_ID = 1023
# PCIe 7 is the newest generation announced and x32 the widest link the spec defines; NVLink 5
# the newest NVLink. 16 leaves room for many.
_GENERATION = 16
_PCIE_WIDTH = 32
# A probe method or a short machine fact ("cuda-memcpy-peer-ce", "12.4"): 64 is ample.
_SHORT = 64


class Limit(NamedTuple):
    """The bound of one report field: `items` for a repeated field, `chars` for a string (each
    element's, for a repeated string), `value` for an integer (each element's when repeated)."""

    items: int = 0
    chars: int = 0
    value: int = 0


# Every repeated field and string a report (reporter.proto's ReportRequest and all it holds) can
# carry, by protobuf full name, and integers whose type allows what no hardware has. A field
# missing here is refused (tests/test_report_limits.py checks the table against the
# descriptors, so a new field without a bound fails there first). The README lists it.
REPORT_LIMITS: Mapping[str, Limit] = MappingProxyType(
    {
        "gputopo.v1.ReportRequest.node_name": Limit(chars=_K8S_NAME),
        "gputopo.v1.ReportRequest.exporter_version": Limit(chars=_SHORT),
        "gputopo.v1.ReportRequest.probe_address": Limit(chars=_K8S_NAME + 6),
        "gputopo.v1.NodeTopology.name": Limit(chars=_K8S_NAME),
        "gputopo.v1.NodeTopology.gpus": Limit(items=MAX_GPUS_PER_NODE),
        "gputopo.v1.NodeTopology.nics": Limit(items=MAX_NICS_PER_NODE),
        "gputopo.v1.NodeTopology.numa_nodes": Limit(items=MAX_NUMA_NODES),
        "gputopo.v1.NodeTopology.links": Limit(items=MAX_LINKS_PER_NODE),
        "gputopo.v1.NodeTopology.machine": Limit(chars=MAX_TEXT),
        "gputopo.v1.NodeTopology.profile": Limit(chars=MAX_TEXT),
        "gputopo.v1.NodeTopology.problems": Limit(items=MAX_PROBLEMS, chars=MAX_TEXT),
        "gputopo.v1.Gpu.index": Limit(value=MAX_GPUS_PER_NODE - 1),
        "gputopo.v1.Gpu.uuid": Limit(chars=MAX_TEXT),
        "gputopo.v1.Gpu.pci_bus_id": Limit(chars=_SHORT),
        "gputopo.v1.Gpu.name": Limit(chars=MAX_TEXT),
        "gputopo.v1.Gpu.numa_node": Limit(value=_NUMA_ID),
        "gputopo.v1.Gpu.cpu_affinity": Limit(chars=MAX_CPULIST),
        "gputopo.v1.Gpu.compute_capability": Limit(chars=_SHORT),
        "gputopo.v1.Gpu.nvlink_generation": Limit(value=_GENERATION),
        "gputopo.v1.Gpu.pcie_generation": Limit(value=_GENERATION),
        "gputopo.v1.Gpu.pcie_max_generation": Limit(value=_GENERATION),
        "gputopo.v1.Gpu.pcie_width": Limit(value=_PCIE_WIDTH),
        "gputopo.v1.Gpu.pcie_max_width": Limit(value=_PCIE_WIDTH),
        "gputopo.v1.Gpu.health_reason": Limit(chars=MAX_TEXT),
        "gputopo.v1.GpuFabric.cluster_uuid": Limit(chars=_SHORT),
        "gputopo.v1.Nic.index": Limit(value=MAX_NICS_PER_NODE - 1),
        "gputopo.v1.Nic.name": Limit(chars=_K8S_NAME),
        "gputopo.v1.Nic.netdev": Limit(chars=_K8S_NAME),
        "gputopo.v1.Nic.numa_node": Limit(value=_NUMA_ID),
        "gputopo.v1.Nic.pci_bus_id": Limit(chars=_SHORT),
        "gputopo.v1.NumaNode.id": Limit(value=_NUMA_ID),
        "gputopo.v1.NumaNode.cpus": Limit(chars=MAX_CPULIST),
        # one SLIT distance per NUMA node; ACPI SLIT entries are one byte
        "gputopo.v1.NumaNode.distances": Limit(items=MAX_NUMA_NODES, value=255),
        "gputopo.v1.DeviceRef.index": Limit(value=max(MAX_NUMA_NODES, _NUMA_ID)),
        "gputopo.v1.Link.generation": Limit(value=_GENERATION),
        "gputopo.v1.Link.health_reason": Limit(chars=MAX_TEXT),
        "gputopo.v1.Measurement.method": Limit(chars=_SHORT),
        "gputopo.v1.FabricPosition.tiers": Limit(items=MAX_FABRIC_TIERS, chars=MAX_TEXT),
        "gputopo.v1.FabricPosition.accelerator_domain": Limit(chars=MAX_TEXT),
        "gputopo.v1.FabricPosition.accelerator_sub_domain": Limit(chars=MAX_TEXT),
        "gputopo.v1.FabricPosition.zone": Limit(chars=MAX_TEXT),
        "gputopo.v1.FabricPosition.source": Limit(chars=_SHORT),
        "gputopo.v1.NvmlStatus.driver_version": Limit(chars=_SHORT),
        "gputopo.v1.NvmlStatus.cuda_version": Limit(chars=_SHORT),
        "gputopo.v1.NvmlStatus.reason": Limit(chars=MAX_TEXT),
        "gputopo.v1.KubeletGpuUse.reason": Limit(chars=MAX_TEXT),
        "gputopo.v1.KubeletGpuUse.held": Limit(items=MAX_GPUS_PER_NODE),
        "gputopo.v1.KubeletGpuUse.allocatable": Limit(
            items=MAX_GPUS_PER_NODE, value=MAX_GPUS_PER_NODE - 1
        ),
        "gputopo.v1.KubeletGpuUse.unmapped": Limit(items=MAX_PROBLEMS, chars=MAX_TEXT),
        "gputopo.v1.GpuHolder.gpu": Limit(value=MAX_GPUS_PER_NODE - 1),
        "gputopo.v1.GpuHolder.namespace": Limit(chars=_K8S_LABEL),
        "gputopo.v1.GpuHolder.pod": Limit(chars=_K8S_NAME),
        "gputopo.v1.GpuHolder.container": Limit(chars=_K8S_LABEL),
        "gputopo.v1.GpuHolder.via": Limit(chars=_SHORT),
        "gputopo.v1.Delta.gpus": Limit(items=MAX_GPUS_PER_NODE),
        "gputopo.v1.Delta.nics": Limit(items=MAX_NICS_PER_NODE),
        "gputopo.v1.Delta.links": Limit(items=MAX_LINKS_PER_NODE),
        "gputopo.v1.Delta.removed_links": Limit(items=MAX_LINKS_PER_NODE),
        "gputopo.v1.Delta.problems": Limit(items=MAX_PROBLEMS, chars=MAX_TEXT),
        # one probe per peer the aggregator named; it names a few per heartbeat
        "gputopo.v1.Delta.peer_probes": Limit(items=MAX_PROBLEMS),
        "gputopo.v1.PeerProbe.peer": Limit(chars=_K8S_NAME),
    }
)


# What the aggregator may keep for one node. It keeps the decoded topology (a link about 600
# bytes with its index entry and a measurement), the node's interned shape (n x n bandwidths
# and kinds, about 96 bytes a pair) and per-GPU and per-NIC records. Measured over gRPC
# (tests/aggregator/test_node_memory.py): a 128-GPU PCIe node of 10,560 links (288 KB on the
# wire) costs 5.1 MiB, estimated at 8.1; with every link measured, 6.4 MiB against 8.5. With
# every node under the budget, aggregator memory is at most nodes x NODE_MEMORY_BUDGET plus its
# own.
NODE_MEMORY_BUDGET = 16 << 20


def node_memory(*, gpus: int, nics: int, numa_nodes: int, links: int, wire_bytes: int) -> int:
    """Bytes the aggregator keeps for a node of these counts (an estimate that errs high)."""
    return 600 * links + 96 * gpus * gpus + 2048 * gpus + 1024 * (nics + numa_nodes) + wire_bytes


def check_node_memory(field: str, estimate: int, budget: int = NODE_MEMORY_BUDGET) -> None:
    """At most `budget` bytes kept for one node."""
    if estimate > budget:
        raise BoundsError(
            field,
            f"would keep about {estimate / (1 << 20):.1f} MiB for one node, more than the"
            f" per-node budget of {budget / (1 << 20):.0f} MiB",
        )


class BoundsError(ValueError):
    """A figure outside what hardware can be; `field` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check_count(field: str, count: int, limit: int) -> None:
    """At most `limit` items."""
    if count > limit:
        raise BoundsError(field, f"{count} items, more than any node has ({limit} at most)")


def check_number(field: str, value: float, *, limit: float, allow_zero: bool = True) -> None:
    """A finite number in [0, limit] (or (0, limit] without `allow_zero`)."""
    if not math.isfinite(value):
        raise BoundsError(field, f"must be a finite number, not {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise BoundsError(field, f"must be {'non-negative' if allow_zero else 'positive'}")
    if value > limit:
        raise BoundsError(field, f"{value:g} is beyond what hardware can be ({limit:g} at most)")


def check_text(field: str, text: str) -> None:
    """A string no longer than `MAX_TEXT` characters."""
    if len(text) > MAX_TEXT:
        raise BoundsError(field, f"{len(text)} characters, {MAX_TEXT} at most")
