"""The exporter's report stream (reporter.proto): topology deltas and peer probe results."""

from __future__ import annotations

from gputopo import bounds
from gputopo.codec._base import CodecError
from gputopo.codec.topology import (
    _bounded,
    _measurement_from_proto,
    _measurement_to_proto,
    _ref_from_proto,
    _ref_to_proto,
    fabric_from_proto,
    fabric_to_proto,
    gpu_from_proto,
    gpu_to_proto,
    link_from_proto,
    link_to_proto,
    nic_from_proto,
    nic_to_proto,
    nvml_from_proto,
    nvml_to_proto,
)
from gputopo.delta import NodeDelta
from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.topology import Measurement
from gputopo.v1 import reporter_pb2 as rpb

__all__ = [
    "delta_from_proto",
    "delta_to_proto",
    "gpu_use_from_proto",
    "gpu_use_to_proto",
    "peer_probe_from_proto",
    "peer_probe_to_proto",
]


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
    with _bounded():
        bounds.check_text(f"{path}.peer", msg.peer)
    return msg.peer, _measurement_from_proto(msg.measured, f"{path}.measured")


def delta_from_proto(msg: rpb.Delta, path: str = "delta") -> NodeDelta:
    """A Delta message as a domain delta; CodecError naming the field if malformed or absurd."""
    with _bounded():  # counts first, as for a snapshot: nothing of an absurd delta is built
        for name, count, limit in (
            ("gpus", len(msg.gpus), bounds.MAX_GPUS_PER_NODE),
            ("nics", len(msg.nics), bounds.MAX_NICS_PER_NODE),
            ("links", len(msg.links), bounds.MAX_LINKS_PER_NODE),
            ("removed_links", len(msg.removed_links), bounds.MAX_LINKS_PER_NODE),
            ("problems", len(msg.problems), bounds.MAX_PROBLEMS),
        ):
            bounds.check_count(f"{path}.{name}", count, limit)
        for i, problem in enumerate(msg.problems):
            bounds.check_text(f"{path}.problems[{i}]", problem)
    return _delta_from_proto(msg, path)


def _delta_from_proto(msg: rpb.Delta, path: str) -> NodeDelta:
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
        nvml=nvml_from_proto(msg.nvml, f"{path}.nvml") if msg.HasField("nvml") else None,
        problems=tuple(msg.problems) if msg.problems_changed else None,
    )


def gpu_use_to_proto(use: GpuUse) -> rpb.KubeletGpuUse:
    """What the kubelet says is held, as a message."""
    return rpb.KubeletGpuUse(
        known=use.known,
        reason=use.reason,
        held=[
            rpb.GpuHolder(
                gpu=gpu, namespace=h.namespace, pod=h.pod, container=h.container, via=h.via
            )
            for gpu, h in sorted(use.held.items())
        ],
        allocatable=sorted(use.allocatable or ()),
        allocatable_known=use.allocatable is not None,
        unmapped=list(use.unmapped),
    )


def gpu_use_from_proto(msg: rpb.KubeletGpuUse, path: str = "gpu_use") -> GpuUse:
    """A KubeletGpuUse message as the domain object; CodecError naming the field if malformed."""
    if not msg.known:
        return GpuUse(reason=msg.reason or "the exporter could not ask the kubelet")
    held: dict[int, GpuHolder] = {}
    for i, h in enumerate(msg.held):
        if h.gpu in held:
            raise CodecError(f"{path}.held[{i}].gpu", f"GPU {h.gpu} is held twice")
        held[h.gpu] = GpuHolder(h.namespace, h.pod, h.container, h.via)
    return GpuUse(
        held=held,
        allocatable=frozenset(msg.allocatable) if msg.allocatable_known else None,
        unmapped=tuple(msg.unmapped),
    )
