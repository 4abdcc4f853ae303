"""Node topology messages (topology.proto) to and from the domain model: devices, links,
measurements, the fabric position, NVML status and the whole `NodeTopology`."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from gputopo import bounds
from gputopo.bounds import BoundsError
from gputopo.codec._base import CodecError, seconds, timestamp, wire_enum
from gputopo.links import LinkHealth, LinkKind
from gputopo.topology import (
    DeviceKind,
    DeviceRef,
    FabricPosition,
    FabricState,
    Gpu,
    GpuFabric,
    Link,
    Measurement,
    Nic,
    NicKind,
    NodeTopology,
    NumaNode,
    NvmlStatus,
)
from gputopo.v1 import topology_pb2 as tpb

__all__ = [
    "fabric_from_proto",
    "fabric_to_proto",
    "gpu_from_proto",
    "gpu_to_proto",
    "link_from_proto",
    "link_to_proto",
    "nic_from_proto",
    "nic_to_proto",
    "nvml_from_proto",
    "nvml_to_proto",
    "topology_from_proto",
    "topology_to_proto",
]

_CONFIDENCE = {
    "": tpb.CONFIDENCE_UNSPECIFIED,
    "high": tpb.CONFIDENCE_HIGH,
    "medium": tpb.CONFIDENCE_MEDIUM,
    "low": tpb.CONFIDENCE_LOW,
}
_CONFIDENCE_BACK = {v: k for k, v in _CONFIDENCE.items()}


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    """A figure beyond what hardware can be (`gputopo.bounds`) is a CodecError like any other."""
    try:
        yield
    except BoundsError as err:
        raise CodecError(err.field, err.reason) from None


def _ref_to_proto(ref: DeviceRef) -> tpb.DeviceRef:
    return tpb.DeviceRef(kind=tpb.DeviceKind.ValueType(ref.kind), index=ref.index)


def _ref_from_proto(msg: tpb.DeviceRef, path: str) -> DeviceRef:
    try:
        kind = DeviceKind(msg.kind)
    except ValueError:
        raise CodecError(f"{path}.kind", "device kind must be GPU, NIC or NUMA") from None
    return DeviceRef(kind, msg.index)


def _measurement_to_proto(m: Measurement) -> tpb.Measurement:
    msg = tpb.Measurement(
        gbps=m.gbps,
        method=m.method,
        size_bytes=m.size_bytes,
        duration_s=m.duration_s,
        measured_at=timestamp(m.measured_at),
    )
    if m.latency_us is not None:
        msg.latency_us = m.latency_us
    return msg


def _measurement_from_proto(msg: tpb.Measurement, path: str) -> Measurement:
    if not math.isfinite(msg.gbps) or msg.gbps < 0:
        raise CodecError(f"{path}.gbps", "must be a finite, non-negative number")
    with _bounded():
        bounds.check_number(f"{path}.gbps", msg.gbps, limit=bounds.MAX_GBPS)
        bounds.check_number(f"{path}.duration_s", msg.duration_s, limit=86_400.0)
        if msg.HasField("latency_us"):
            bounds.check_number(f"{path}.latency_us", msg.latency_us, limit=bounds.MAX_LATENCY_US)
        bounds.check_text(f"{path}.method", msg.method)
    return Measurement(
        gbps=msg.gbps,
        method=msg.method,
        size_bytes=msg.size_bytes,
        duration_s=msg.duration_s,
        measured_at=seconds(msg.measured_at, f"{path}.measured_at"),
        latency_us=msg.latency_us if msg.HasField("latency_us") else None,
    )


def link_to_proto(link: Link) -> tpb.Link:
    """A domain link as a message."""
    msg = tpb.Link(
        a=_ref_to_proto(link.a),
        b=_ref_to_proto(link.b),
        kind=tpb.LinkKind.ValueType(link.kind),
        lanes=link.lanes,
        max_lanes=link.max_lanes,
        generation=link.generation,
        via_switch=link.via_switch,
        nominal_gbps=link.nominal_gbps,
        health=tpb.LinkHealth.ValueType(link.health),
        health_reason=link.health_reason,
    )
    if link.measured is not None:
        msg.measured.CopyFrom(_measurement_to_proto(link.measured))
    return msg


def link_from_proto(msg: tpb.Link, path: str = "link") -> Link:
    """A link message as a domain link; CodecError for unknown kinds or bad figures."""
    kind = wire_enum(LinkKind, msg.kind, f"{path}.kind")
    if not math.isfinite(msg.nominal_gbps) or msg.nominal_gbps < 0:
        raise CodecError(f"{path}.nominal_gbps", "must be a finite, non-negative number")
    a, b = _ref_from_proto(msg.a, f"{path}.a"), _ref_from_proto(msg.b, f"{path}.b")
    if a == b:
        raise CodecError(path, f"links {a} to itself")
    with _bounded():
        bounds.check_number(f"{path}.nominal_gbps", msg.nominal_gbps, limit=bounds.MAX_GBPS)
        bounds.check_number(f"{path}.lanes", msg.lanes, limit=bounds.MAX_LANES)
        bounds.check_number(f"{path}.max_lanes", msg.max_lanes, limit=bounds.MAX_LANES)
        bounds.check_text(f"{path}.health_reason", msg.health_reason)
    return Link(
        a=a,
        b=b,
        kind=kind,
        lanes=msg.lanes,
        max_lanes=msg.max_lanes,
        generation=msg.generation,
        via_switch=msg.via_switch,
        nominal_gbps=msg.nominal_gbps,
        measured=_measurement_from_proto(msg.measured, f"{path}.measured")
        if msg.HasField("measured")
        else None,
        health=wire_enum(LinkHealth, msg.health, f"{path}.health") if msg.health else LinkHealth.OK,
        health_reason=msg.health_reason,
    )


def gpu_to_proto(g: Gpu) -> tpb.Gpu:
    """A domain GPU as a message."""
    msg = tpb.Gpu(
        index=g.index,
        uuid=g.uuid,
        pci_bus_id=g.pci_bus_id,
        name=g.name,
        memory_mib=g.memory_mib,
        cpu_affinity=g.cpu_affinity,
        compute_capability=g.compute_capability,
        nvlink_generation=g.nvlink_generation,
        nvlink_lanes=g.nvlink_lanes,
        nvlink_max_lanes=g.nvlink_max_lanes,
        pcie_generation=g.pcie_generation,
        pcie_width=g.pcie_width,
        pcie_max_generation=g.pcie_max_generation,
        pcie_max_width=g.pcie_max_width,
        health=tpb.LinkHealth.ValueType(g.health),
        health_reason=g.health_reason,
    )
    if g.numa_node is not None:
        msg.numa_node = g.numa_node
    if g.fabric is not None:
        msg.fabric.CopyFrom(
            tpb.GpuFabric(
                cluster_uuid=g.fabric.cluster_uuid,
                clique_id=g.fabric.clique_id,
                state=tpb.FabricState.ValueType(g.fabric.state),
                health_mask=g.fabric.health_mask,
            )
        )
    return msg


def gpu_from_proto(msg: tpb.Gpu, path: str = "gpu") -> Gpu:
    """A GPU message as a domain GPU."""
    with _bounded():
        bounds.check_number(f"{path}.memory_mib", msg.memory_mib, limit=bounds.MAX_MEMORY_MIB)
        bounds.check_number(f"{path}.nvlink_lanes", msg.nvlink_lanes, limit=bounds.MAX_LANES)
        bounds.check_number(
            f"{path}.nvlink_max_lanes", msg.nvlink_max_lanes, limit=bounds.MAX_LANES
        )
        for name in ("uuid", "pci_bus_id", "name", "cpu_affinity", "compute_capability"):
            bounds.check_text(f"{path}.{name}", getattr(msg, name))
    fabric = None
    if msg.HasField("fabric"):
        fabric = GpuFabric(
            msg.fabric.cluster_uuid,
            msg.fabric.clique_id,
            wire_enum(FabricState, msg.fabric.state, f"{path}.fabric.state"),
            msg.fabric.health_mask,
        )
    return Gpu(
        index=msg.index,
        uuid=msg.uuid,
        pci_bus_id=msg.pci_bus_id,
        name=msg.name,
        memory_mib=msg.memory_mib,
        numa_node=msg.numa_node if msg.HasField("numa_node") else None,
        cpu_affinity=msg.cpu_affinity,
        compute_capability=msg.compute_capability,
        nvlink_generation=msg.nvlink_generation,
        nvlink_lanes=msg.nvlink_lanes,
        nvlink_max_lanes=msg.nvlink_max_lanes,
        pcie_generation=msg.pcie_generation,
        pcie_width=msg.pcie_width,
        pcie_max_generation=msg.pcie_max_generation,
        pcie_max_width=msg.pcie_max_width,
        fabric=fabric,
        health=wire_enum(LinkHealth, msg.health, f"{path}.health") if msg.health else LinkHealth.OK,
        health_reason=msg.health_reason,
    )


def nic_to_proto(n: Nic) -> tpb.Nic:
    """A domain NIC as a message."""
    msg = tpb.Nic(
        index=n.index,
        name=n.name,
        kind=tpb.NicKind.ValueType(n.kind),
        netdev=n.netdev,
        speed_mbps=n.speed_mbps,
        up=n.up,
        pci_bus_id=n.pci_bus_id,
    )
    if n.numa_node is not None:
        msg.numa_node = n.numa_node
    return msg


def nic_from_proto(msg: tpb.Nic, path: str = "nic") -> Nic:
    """A NIC message as a domain NIC."""
    if not msg.name:
        raise CodecError(f"{path}.name", "is required")
    with _bounded():
        # 1.6 Tb/s is the fastest Ethernet on any roadmap; a hundred times that is no NIC.
        bounds.check_number(f"{path}.speed_mbps", msg.speed_mbps, limit=160_000_000)
        for name in ("name", "netdev", "pci_bus_id"):
            bounds.check_text(f"{path}.{name}", getattr(msg, name))
    return Nic(
        index=msg.index,
        name=msg.name,
        kind=wire_enum(NicKind, msg.kind, f"{path}.kind"),
        netdev=msg.netdev,
        speed_mbps=msg.speed_mbps,
        up=msg.up,
        numa_node=msg.numa_node if msg.HasField("numa_node") else None,
        pci_bus_id=msg.pci_bus_id,
    )


def fabric_to_proto(f: FabricPosition) -> tpb.FabricPosition:
    """A fabric position as a message."""
    return tpb.FabricPosition(
        tiers=list(f.tiers),
        accelerator_domain=f.accelerator_domain,
        accelerator_sub_domain=f.accelerator_sub_domain,
        zone=f.zone,
        source=f.source,
        confidence=_CONFIDENCE[f.confidence],
    )


def fabric_from_proto(msg: tpb.FabricPosition) -> FabricPosition:
    """A fabric position message as a domain value."""
    with _bounded():
        bounds.check_count("fabric.tiers", len(msg.tiers), bounds.MAX_FABRIC_TIERS)
        for i, tier in enumerate(msg.tiers):
            bounds.check_text(f"fabric.tiers[{i}]", tier)
    return FabricPosition(
        tiers=tuple(msg.tiers),
        accelerator_domain=msg.accelerator_domain,
        accelerator_sub_domain=msg.accelerator_sub_domain,
        zone=msg.zone,
        source=msg.source,
        confidence=_CONFIDENCE_BACK.get(msg.confidence, ""),  # type: ignore[arg-type]
    )


def nvml_to_proto(s: NvmlStatus) -> tpb.NvmlStatus:
    """NVML status as a message."""
    return tpb.NvmlStatus(
        up=s.up, driver_version=s.driver_version, cuda_version=s.cuda_version, reason=s.reason
    )


def nvml_from_proto(msg: tpb.NvmlStatus, path: str = "nvml") -> NvmlStatus:
    """NVML status message as a domain value; CodecError naming an over-long string."""
    with _bounded():
        for name in ("driver_version", "cuda_version", "reason"):
            bounds.check_text(f"{path}.{name}", getattr(msg, name))
    return NvmlStatus(
        up=msg.up,
        driver_version=msg.driver_version,
        cuda_version=msg.cuda_version,
        reason=msg.reason,
    )


def topology_to_proto(t: NodeTopology, *, observed_at: float | None = None) -> tpb.NodeTopology:
    """A node topology as a message."""
    msg = tpb.NodeTopology(
        name=t.name,
        gpus=[gpu_to_proto(g) for g in t.gpus],
        nics=[nic_to_proto(n) for n in t.nics],
        numa_nodes=[
            tpb.NumaNode(id=n.id, cpus=n.cpus, memory_mib=n.memory_mib, distances=list(n.distances))
            for n in t.numa_nodes
        ],
        links=[link_to_proto(lk) for lk in t.links],
        fabric=fabric_to_proto(t.fabric),
        machine=t.machine,
        profile=t.profile,
        nvml=nvml_to_proto(t.nvml),
        partial=t.partial,
        problems=list(t.problems),
    )
    if observed_at is not None:
        msg.observed_at.CopyFrom(timestamp(observed_at))
    return msg


def topology_from_proto(msg: tpb.NodeTopology, path: str = "topology") -> NodeTopology:
    """A node topology message as a domain value, validated for consistency."""
    if not msg.name:
        raise CodecError(f"{path}.name", "is required")
    with _bounded():  # counts first: nothing of a 10,000-GPU claim is built
        bounds.check_text(f"{path}.name", msg.name)
        bounds.check_count(f"{path}.gpus", len(msg.gpus), bounds.MAX_GPUS_PER_NODE)
        bounds.check_count(f"{path}.nics", len(msg.nics), bounds.MAX_NICS_PER_NODE)
        bounds.check_count(f"{path}.numa_nodes", len(msg.numa_nodes), bounds.MAX_NUMA_NODES)
        bounds.check_count(f"{path}.links", len(msg.links), bounds.MAX_LINKS_PER_NODE)
        bounds.check_count(f"{path}.problems", len(msg.problems), bounds.MAX_PROBLEMS)
        bounds.check_count(f"{path}.fabric.tiers", len(msg.fabric.tiers), bounds.MAX_FABRIC_TIERS)
        # Free text is stored and served back in every dump: a 16 MiB "machine" or problem
        # would be kept and re-sent to every dashboard, so each string is bounded like a name.
        bounds.check_text(f"{path}.machine", msg.machine)
        bounds.check_text(f"{path}.profile", msg.profile)
        for i, problem in enumerate(msg.problems):
            bounds.check_text(f"{path}.problems[{i}]", problem)
        uuids = [g.uuid for g in msg.gpus if g.uuid]
        if len(set(uuids)) != len(uuids):
            raise BoundsError(f"{path}.gpus", "two GPUs report the same UUID")
    gpus = tuple(gpu_from_proto(g, f"{path}.gpus[{i}]") for i, g in enumerate(msg.gpus))
    for i, g in enumerate(gpus):
        if g.index != i:
            raise CodecError(f"{path}.gpus[{i}].index", f"is {g.index}; GPUs must be listed 0..n-1")
    nics = tuple(nic_from_proto(n, f"{path}.nics[{i}]") for i, n in enumerate(msg.nics))
    for i, n in enumerate(nics):
        if n.index != i:
            raise CodecError(f"{path}.nics[{i}].index", f"is {n.index}; NICs must be listed 0..n-1")
    numa = tuple(NumaNode(n.id, n.cpus, n.memory_mib, tuple(n.distances)) for n in msg.numa_nodes)
    counts = {DeviceKind.GPU: len(gpus), DeviceKind.NIC: len(nics)}
    numa_ids = {n.id for n in numa}
    links = []
    for i, lm in enumerate(msg.links):
        link = link_from_proto(lm, f"{path}.links[{i}]")
        for end, ref in (("a", link.a), ("b", link.b)):
            known = (
                ref.index in numa_ids
                if ref.kind is DeviceKind.NUMA
                else (ref.index < counts[ref.kind])
            )
            if not known:
                raise CodecError(f"{path}.links[{i}].{end}", f"no such device {ref}")
        links.append(link)
    return NodeTopology(
        name=msg.name,
        gpus=gpus,
        nics=nics,
        numa_nodes=numa,
        links=tuple(links),
        fabric=fabric_from_proto(msg.fabric),
        machine=msg.machine,
        profile=msg.profile,
        nvml=nvml_from_proto(msg.nvml, f"{path}.nvml"),
        partial=msg.partial,
        problems=tuple(msg.problems),
    )
