"""Which GPUs of a node the kubelet has handed to containers, as the exporter reports it.

The exporter reads the kubelet's PodResources API (`exporter.podresources`) and sends this in
its report; the aggregator takes these GPUs out of the node's free ones, exactly, where pod counts
(`aggregator.occupancy`) can only say how many. A plain model: no I/O, no protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GpuHolder", "GpuUse"]


@dataclass(frozen=True, slots=True, order=True)
class GpuHolder:
    """A container that holds a GPU, and how it got it (a resource name or a DRA claim)."""

    namespace: str
    pod: str
    container: str
    via: str

    @property
    def pod_key(self) -> str:
        """`namespace/pod`, as pod objects are keyed."""
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class GpuUse:
    """The kubelet's answer for one node: held GPUs by index, what it can allocate, how many
    devices did not map to a GPU, and `reason` when it could not be asked (nothing is known)."""

    held: dict[int, GpuHolder] = field(default_factory=dict)
    allocatable: frozenset[int] | None = None
    unmapped: tuple[str, ...] = ()
    reason: str = ""

    @property
    def known(self) -> bool:
        """Whether the kubelet answered."""
        return not self.reason
