"""Translate between `gputopo.v1` protobuf messages and domain objects.

Protobuf stays at the edge: services decode what arrives with these functions and the core only
ever sees domain values. Decoding validates what the wire format cannot (indices in range, names
present) and raises `CodecError` naming the field, which servers return as INVALID_ARGUMENT.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from gputopo.cluster import NodeState
from gputopo.delta import NodeDelta
from gputopo.links import LinkHealth, LinkKind
from gputopo.placement.result import (
    EdgePrediction,
    GroupPrediction,
    PlacementResult,
    PodPlacement,
    Prediction,
    Rejection,
    RejectionCode,
)
from gputopo.request import (
    DEFAULT_MESSAGE_BYTES,
    Constraint,
    Edge,
    Group,
    Pairing,
    Pattern,
    PlacementRequest,
    Scope,
    Spread,
)
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
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import topology_pb2 as tpb

__all__ = [
    "CodecError",
    "delta_from_proto",
    "delta_to_proto",
    "gpu_from_proto",
    "gpu_to_proto",
    "link_from_proto",
    "link_to_proto",
    "nic_from_proto",
    "nic_to_proto",
    "node_state_to_proto",
    "peer_probe_from_proto",
    "peer_probe_to_proto",
    "request_from_proto",
    "request_to_proto",
    "result_from_proto",
    "result_to_proto",
    "timestamp",
    "topology_from_proto",
    "topology_to_proto",
]


class CodecError(ValueError):
    """A message that is well-formed protobuf but not a valid value; `field` names where."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


_CONFIDENCE = {
    "": tpb.CONFIDENCE_UNSPECIFIED,
    "high": tpb.CONFIDENCE_HIGH,
    "medium": tpb.CONFIDENCE_MEDIUM,
    "low": tpb.CONFIDENCE_LOW,
}
_CONFIDENCE_BACK = {v: k for k, v in _CONFIDENCE.items()}


_E = TypeVar("_E", bound=enum.IntEnum)


def timestamp(seconds: float) -> Timestamp:
    """A protobuf Timestamp from unix seconds."""
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _seconds(ts: Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9


# --- topology -----------------------------------------------------------------------------------


def _enum(cls: type[_E], value: int, path: str) -> _E:
    """An enum member from a wire value; proto3 enums are open, so unknown numbers arrive."""
    try:
        return cls(value)
    except ValueError:
        known = ", ".join(m.name for m in cls)
        raise CodecError(path, f"unknown value {value} (known: {known})") from None


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
    return Measurement(
        gbps=msg.gbps,
        method=msg.method,
        size_bytes=msg.size_bytes,
        duration_s=msg.duration_s,
        measured_at=_seconds(msg.measured_at),
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
    kind = _enum(LinkKind, msg.kind, f"{path}.kind")
    if not math.isfinite(msg.nominal_gbps) or msg.nominal_gbps < 0:
        raise CodecError(f"{path}.nominal_gbps", "must be a finite, non-negative number")
    a, b = _ref_from_proto(msg.a, f"{path}.a"), _ref_from_proto(msg.b, f"{path}.b")
    if a == b:
        raise CodecError(path, f"links {a} to itself")
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
        health=_enum(LinkHealth, msg.health, f"{path}.health") if msg.health else LinkHealth.OK,
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
    fabric = None
    if msg.HasField("fabric"):
        fabric = GpuFabric(
            msg.fabric.cluster_uuid,
            msg.fabric.clique_id,
            _enum(FabricState, msg.fabric.state, f"{path}.fabric.state"),
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
        health=_enum(LinkHealth, msg.health, f"{path}.health") if msg.health else LinkHealth.OK,
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
    return Nic(
        index=msg.index,
        name=msg.name,
        kind=_enum(NicKind, msg.kind, f"{path}.kind"),
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


def nvml_from_proto(msg: tpb.NvmlStatus) -> NvmlStatus:
    """NVML status message as a domain value."""
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
        nvml=nvml_from_proto(msg.nvml),
        partial=msg.partial,
        problems=tuple(msg.problems),
    )


def node_state_to_proto(
    state: NodeState,
    *,
    generation: int = 0,
    last_report: float | None = None,
    reserved: Iterable[int] = (),
    include_links: bool = True,
) -> tpb.NodeState:
    """A node in a snapshot as a message. GPUs not free and not reserved are allocated."""
    topo = topology_to_proto(state.topology)
    if not include_links:
        del topo.links[:]
    reserved_set = set(reserved)
    allocated = [
        g for g in range(state.topology.gpu_count) if g not in state.free and g not in reserved_set
    ]
    msg = tpb.NodeState(
        topology=topo,
        stale=not state.placeable and state.reason == "stale",
        placeable=state.placeable,
        free_gpus=sorted(state.free),
        reserved_gpus=sorted(reserved_set),
        allocated_gpus=allocated,
        generation=generation,
        labels=dict(state.labels),
    )
    if last_report is not None:
        msg.last_report.CopyFrom(timestamp(last_report))
    return msg


# --- reporter deltas ----------------------------------------------------------------------------


def delta_to_proto(delta: NodeDelta) -> rpb.Delta:
    """A domain delta as a Delta message."""
    msg = rpb.Delta(
        gpus=[gpu_to_proto(g) for g in delta.gpus],
        nics=[nic_to_proto(n) for n in delta.nics],
        links=[link_to_proto(lk) for lk in delta.links],
        removed_links=[
            rpb.LinkKey(a=_ref_to_proto(a), b=_ref_to_proto(b)) for a, b in delta.removed_links
        ],
    )
    if delta.fabric is not None:
        msg.fabric.CopyFrom(fabric_to_proto(delta.fabric))
    if delta.nvml is not None:
        msg.nvml.CopyFrom(nvml_to_proto(delta.nvml))
    if delta.problems is not None:
        msg.problems.extend(delta.problems)
        msg.problems_changed = True
    return msg


def peer_probe_to_proto(peer: str, measured: Measurement) -> rpb.PeerProbe:
    """One exporter-to-exporter probe result (peer node name, measurement) as a PeerProbe."""
    return rpb.PeerProbe(peer=peer, measured=_measurement_to_proto(measured))


def peer_probe_from_proto(msg: rpb.PeerProbe, path: str = "peer_probe") -> tuple[str, Measurement]:
    """A PeerProbe message as (peer node name, measurement); CodecError naming the field."""
    if not msg.peer:
        raise CodecError(f"{path}.peer", "is required")
    return msg.peer, _measurement_from_proto(msg.measured, f"{path}.measured")


def delta_from_proto(msg: rpb.Delta, path: str = "delta") -> NodeDelta:
    """A Delta message as a domain delta; CodecError naming the field when invalid."""
    removed = tuple(
        (
            _ref_from_proto(key.a, f"{path}.removed_links[{i}].a"),
            _ref_from_proto(key.b, f"{path}.removed_links[{i}].b"),
        )
        for i, key in enumerate(msg.removed_links)
    )
    return NodeDelta(
        gpus=tuple(gpu_from_proto(g, f"{path}.gpus[{i}]") for i, g in enumerate(msg.gpus)),
        nics=tuple(nic_from_proto(n, f"{path}.nics[{i}]") for i, n in enumerate(msg.nics)),
        links=tuple(link_from_proto(lk, f"{path}.links[{i}]") for i, lk in enumerate(msg.links)),
        removed_links=removed,
        fabric=fabric_from_proto(msg.fabric) if msg.HasField("fabric") else None,
        nvml=nvml_from_proto(msg.nvml) if msg.HasField("nvml") else None,
        problems=tuple(msg.problems) if msg.problems_changed else None,
    )


# --- placement ----------------------------------------------------------------------------------

_PATTERN_TO = {
    Pattern.NONE: ppb.PATTERN_NONE,
    Pattern.ALL_REDUCE: ppb.PATTERN_ALL_REDUCE,
    Pattern.ALL_TO_ALL: ppb.PATTERN_ALL_TO_ALL,
    Pattern.PIPELINE: ppb.PATTERN_PIPELINE,
}
_PATTERN_FROM = {v: k for k, v in _PATTERN_TO.items()} | {ppb.PATTERN_UNSPECIFIED: Pattern.NONE}


def _scope_from(value: int, path: str) -> Scope | None:
    return None if value == ppb.SCOPE_UNSPECIFIED else _enum(Scope, value, path)


def _scope_to(scope: Scope | None) -> ppb.Scope.ValueType:
    return ppb.Scope.ValueType(int(scope) if scope else 0)


def _constraint_to(c: Constraint) -> ppb.Constraint:
    return ppb.Constraint(
        required=_scope_to(c.required),
        preferred=_scope_to(c.preferred),
    )


def _constraint_from(msg: ppb.Constraint, path: str) -> Constraint:
    return Constraint(
        _scope_from(msg.required, f"{path}.required"),
        _scope_from(msg.preferred, f"{path}.preferred"),
    )


def request_to_proto(r: PlacementRequest) -> ppb.PlacementRequest:
    """A placement request as a message."""
    groups = []
    for g in r.groups:
        gm = ppb.Group(
            name=g.name,
            replicas=g.replicas,
            pods=g.pods,
            gpus_per_pod=g.gpus_per_pod,
            pattern=_PATTERN_TO[g.pattern],
            message_bytes=g.message_bytes,
            scope=_constraint_to(g.scope),
            node_selector=dict(g.node_selector),
        )
        if g.spread is not None:
            gm.spread.CopyFrom(
                ppb.Spread(across=_scope_to(g.spread.across), required=g.spread.required)
            )
        groups.append(gm)
    edges = [
        ppb.Edge(
            source=e.source,
            target=e.target,
            min_gbps=e.min_gbps,
            max_transfer_seconds=e.max_transfer_seconds,
            transfer_bytes=e.transfer_bytes,
            pairing=ppb.PAIRING_ONE_TO_ONE if e.pairing is Pairing.ONE_TO_ONE else ppb.PAIRING_ALL,
        )
        for e in r.edges
    ]
    return ppb.PlacementRequest(
        job=r.job,
        namespace=r.namespace,
        groups=groups,
        edges=edges,
        scope=_constraint_to(r.scope),
        node_selector=dict(r.node_selector),
        priority=r.priority,
        policy=r.policy,
    )


def request_from_proto(msg: ppb.PlacementRequest, path: str = "request") -> PlacementRequest:
    """A request message as a domain request (not yet validated: call `validate`)."""
    groups = []
    for i, gm in enumerate(msg.groups):
        gpath = f"{path}.groups[{i}]"
        spread = None
        if gm.HasField("spread"):
            across = _scope_from(gm.spread.across, f"{gpath}.spread.across")
            if across is None:
                raise CodecError(f"{gpath}.spread.across", "is required when spread is set")
            spread = Spread(across, gm.spread.required)
        try:
            pattern = _PATTERN_FROM[gm.pattern]
        except KeyError:
            raise CodecError(f"{gpath}.pattern", f"unknown pattern {gm.pattern}") from None
        groups.append(
            Group(
                name=gm.name,
                replicas=gm.replicas or 1,
                pods=gm.pods,
                gpus_per_pod=gm.gpus_per_pod,
                pattern=pattern,
                message_bytes=gm.message_bytes or DEFAULT_MESSAGE_BYTES,
                scope=_constraint_from(gm.scope, f"{gpath}.scope"),
                spread=spread,
                node_selector=dict(gm.node_selector),
            )
        )
    edges = [
        Edge(
            source=em.source,
            target=em.target,
            min_gbps=em.min_gbps,
            max_transfer_seconds=em.max_transfer_seconds,
            transfer_bytes=em.transfer_bytes,
            pairing=Pairing.ONE_TO_ONE if em.pairing == ppb.PAIRING_ONE_TO_ONE else Pairing.ALL,
        )
        for em in msg.edges
    ]
    return PlacementRequest(
        groups=tuple(groups),
        edges=tuple(edges),
        job=msg.job,
        namespace=msg.namespace,
        scope=_constraint_from(msg.scope, f"{path}.scope"),
        node_selector=dict(msg.node_selector),
        priority=msg.priority,
        policy=msg.policy,
    )


def _finite(x: float) -> float:
    """Protobuf doubles carry inf, but JSON mirrors do not: cap unbounded figures at 0."""
    return x if math.isfinite(x) else 0.0


def result_to_proto(
    result: PlacementResult,
    *,
    uuids: Mapping[str, tuple[str, ...]] | None = None,
    nics: Mapping[tuple[str, int], str] | None = None,
) -> ppb.PlaceResponse:
    """A placement result as a response (reservation fields are the service's to fill)."""
    msg = ppb.PlaceResponse(placed=result.placed, reason=result.reason, policy=result.policy)
    for p in result.pods:
        node_uuids = (uuids or {}).get(p.node, ())
        msg.assignments.append(
            ppb.PodAssignment(
                group=p.group,
                replica=p.replica,
                pod=p.pod,
                rank=p.rank,
                node=p.node,
                gpus=list(p.gpus),
                gpu_uuids=[node_uuids[g] for g in p.gpus if g < len(node_uuids)],
                nics=sorted({(nics or {}).get((p.node, g), "") for g in p.gpus} - {""}),
            )
        )
    if result.prediction is not None:
        pred = result.prediction
        msg.predicted.CopyFrom(
            ppb.Prediction(
                groups=[
                    ppb.GroupPrediction(
                        group=g.group,
                        bus_gbps=_finite(g.bus_gbps),
                        collective_seconds=_finite(g.collective_seconds),
                        bottleneck=g.bottleneck,
                        span=_scope_to(g.span),
                        message_bytes=g.message_bytes,
                    )
                    for g in pred.groups
                ],
                edges=[
                    ppb.EdgePrediction(
                        source=e.source,
                        target=e.target,
                        gbps=_finite(e.gbps),
                        transfer_seconds=_finite(e.transfer_seconds),
                        satisfied=e.satisfied,
                    )
                    for e in pred.edges
                ],
                communication_seconds=_finite(pred.communication_seconds),
                bottleneck_gbps=_finite(pred.bottleneck_gbps),
            )
        )
    msg.rejections.extend(
        ppb.Rejection(domain=r.domain, code=r.code, message=r.message) for r in result.rejections
    )
    return msg


def result_from_proto(msg: ppb.PlaceResponse) -> PlacementResult:
    """A response as a placement result (for clients and tests)."""
    pods = tuple(
        PodPlacement(a.group, a.replica, a.pod, a.rank, a.node, tuple(a.gpus))
        for a in msg.assignments
    )
    prediction = None
    if msg.HasField("predicted"):
        p = msg.predicted
        prediction = Prediction(
            groups=tuple(
                GroupPrediction(
                    g.group,
                    g.bus_gbps,
                    g.collective_seconds,
                    g.bottleneck,
                    Scope(g.span) if g.span else Scope.CLUSTER,
                    g.message_bytes,
                )
                for g in p.groups
            ),
            edges=tuple(
                EdgePrediction(e.source, e.target, e.gbps, e.transfer_seconds, e.satisfied)
                for e in p.edges
            ),
            communication_seconds=p.communication_seconds,
            bottleneck_gbps=p.bottleneck_gbps,
        )
    return PlacementResult(
        placed=msg.placed,
        policy=msg.policy,
        pods=pods,
        prediction=prediction,
        reason=msg.reason,
        rejections=tuple(
            Rejection(r.domain, RejectionCode(r.code), r.message) for r in msg.rejections
        ),
    )
