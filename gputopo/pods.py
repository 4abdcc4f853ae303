"""The pod vocabulary every process speaks: `gputopo.io/*` keys, the GPU count, the pod record.

Pods are the one contract between processes that is not protobuf: the binder writes what it
chose on each pod before binding it, the aggregator reads those records to know which GPUs a
bound pod holds, and the scheduler extender reads the steering annotations. Written once here,
on the model floor (standard library only), so the three can never drift apart again: two
copies of the GPU-count rule once disagreed (one ignored init containers), and a pod whose init
container asked for more GPUs was placed at one size and counted at another.

The GPU count follows Kubernetes' own rule for a pod's effective request
(k8s.io/component-helpers `resource/helpers.go`, `PodRequests`):

1. every regular container's GPUs, summed, plus every sidecar's (an init container with
   `restartPolicy: Always` keeps running beside the regular ones);
2. each plain init container runs alone beside the sidecars started before it: the pod needs
   at least its GPUs plus theirs, so the larger of (1) and the largest of these counts;
3. plus the pod's `spec.overhead`, when it names a GPU resource.

GPU resources are whole GPUs (`nvidia.com/gpu`), time-slicing replicas (`nvidia.com/gpu.shared`)
and MIG slices (`nvidia.com/mig-*`), each of the latter two counted as holding a GPU.

A container asks with its limits (requests when no limit is given: Kubernetes defaults one to
the other for extended resources, and they must be equal).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputopo.request import (
    DEFAULT_MESSAGE_BYTES,
    DEFAULT_PATTERN,
    Pattern,
    RequestError,
    Scope,
    pattern_from_text,
    scope_from_text,
)

__all__ = [
    "GPUS_ANNOTATION",
    "GPU_RESOURCES",
    "GROUP_LABEL",
    "MESSAGE_BYTES_ANNOTATION",
    "MIG_RESOURCE_PREFIX",
    "NODE_ANNOTATION",
    "PATTERN_ANNOTATION",
    "PLACE_KEYS",
    "PREFIX",
    "RECORD_KEYS",
    "REQUEST_ANNOTATION",
    "RESERVATION_ANNOTATION",
    "SCOPE_ANNOTATION",
    "SIZE_ANNOTATION",
    "UUIDS_ANNOTATION",
    "PodAsk",
    "PodRecord",
    "annotations_of",
    "decode_gpus",
    "pod_ask",
    "pod_gpus",
    "pod_key",
]

PREFIX = "gputopo.io/"
# Whole GPUs, and time-slicing replicas of NVIDIA's plugin renamed (renameByDefault): a replica
# holds (a share of) one GPU, which is then not free for a whole-GPU placement.
GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
# MIG slices (nvidia.com/mig-<profile>) each hold a piece of some GPU: counted as one GPU each,
# conservatively, where nothing says which GPU.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

# Set by users.
GROUP_LABEL = PREFIX + "group"  # which group of the gang's request a pod fills
REQUEST_ANNOTATION = PREFIX + "request"  # the gang's communication graph (YAML or JSON)
SCOPE_ANNOTATION = PREFIX + "scope"  # extender: `nvlink` keeps a pod's GPUs on one island
PATTERN_ANNOTATION = PREFIX + "pattern"  # extender: the collective to predict
MESSAGE_BYTES_ANNOTATION = PREFIX + "message-bytes"  # extender: its message size

# Written by the binder on each pod before it binds any (`PodRecord`); read back by the binder
# after a restart, by the aggregator's occupancy and by the extender.
RESERVATION_ANNOTATION = PREFIX + "reservation"
NODE_ANNOTATION = PREFIX + "node"
GPUS_ANNOTATION = PREFIX + "gpus"  # "0,1,2,3"
SIZE_ANNOTATION = PREFIX + "gang-size"
UUIDS_ANNOTATION = PREFIX + "gpu-uuids"  # in the order of the indices
PLACE_KEYS: tuple[str, ...] = (PREFIX + "replica", PREFIX + "pod", PREFIX + "rank")
RECORD_KEYS: tuple[str, ...] = (
    RESERVATION_ANNOTATION,
    NODE_ANNOTATION,
    GPUS_ANNOTATION,
    SIZE_ANNOTATION,
    UUIDS_ANNOTATION,
    *PLACE_KEYS,
)


def pod_key(pod: Mapping[str, Any]) -> str:
    """namespace/name."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    """A pod's annotations as text (none: empty)."""
    found = (pod.get("metadata") or {}).get("annotations") or {}
    return {str(k): str(v) for k, v in found.items()}


def _asked(resources: Mapping[str, Any] | None, names: Collection[str]) -> int:
    """GPUs of the given resource names in a ResourceList; what is not a whole number asks for
    none (an extended resource is always a whole number, so that is a malformed object)."""
    total = 0
    for name in names:
        value = (resources or {}).get(name)
        if value is None:
            continue
        try:
            total += int(str(value))
        except ValueError:
            continue
    return total


def _container_gpus(container: Mapping[str, Any], names: Collection[str]) -> int:
    res = container.get("resources") or {}
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    mig = sorted({str(n) for n in (*limits, *requests) if str(n).startswith(MIG_RESOURCE_PREFIX)})
    return sum(_asked(limits if name in limits else requests, (name,)) for name in (*names, *mig))


def pod_gpus(pod: Mapping[str, Any], resources: Collection[str] = GPU_RESOURCES) -> int:
    """GPUs a pod holds as Kubernetes counts its effective request (module docstring)."""
    spec = pod.get("spec") or {}
    total = sum(_container_gpus(c, resources) for c in spec.get("containers") or [])
    sidecars = 0
    init_peak = 0
    for c in spec.get("initContainers") or []:
        asked = _container_gpus(c, resources)
        if c.get("restartPolicy") == "Always":
            sidecars += asked
            total += asked
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, asked + sidecars)
    return max(total, init_peak) + _asked(spec.get("overhead"), resources)


def decode_gpus(text: str, count: int | None = None) -> frozenset[int]:
    """The GPU indices of a `gputopo.io/gpus` record; empty when absent or malformed, or (with
    `count`) when they are not `count` distinct indices: a record that does not match the pod
    locates nothing, and the pod is counted instead."""
    try:
        indices = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return frozenset()
    if any(i < 0 for i in indices) or (count is not None and len(indices) != count):
        return frozenset()
    return indices


@dataclass(frozen=True, slots=True)
class PodRecord:
    """Where the binder put one pod of a placement, as it writes it on the pod."""

    reservation: str
    node: str
    gpus: tuple[int, ...]
    size: int  # pods in the gang
    replica: int = 0
    pod: int = 0
    rank: int = 0
    uuids: tuple[str, ...] = ()  # in the order of `gpus`, when the aggregator knew them

    def annotations(self) -> dict[str, str]:
        """The record as pod annotations."""
        out = {
            RESERVATION_ANNOTATION: self.reservation,
            NODE_ANNOTATION: self.node,
            GPUS_ANNOTATION: ",".join(str(g) for g in self.gpus),
            SIZE_ANNOTATION: str(self.size),
            PLACE_KEYS[0]: str(self.replica),
            PLACE_KEYS[1]: str(self.pod),
            PLACE_KEYS[2]: str(self.rank),
        }
        if self.uuids and len(self.uuids) == len(self.gpus):
            out[UUIDS_ANNOTATION] = ",".join(self.uuids)
        return out

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> PodRecord | None:
        """The record written on a pod, or None when it carries none (no reservation) or one
        that is not whole (a field that is not a number): a partial record is no record."""
        rid = annotations.get(RESERVATION_ANNOTATION, "")
        if not rid:
            return None
        try:
            gpus = tuple(
                int(p) for p in annotations.get(GPUS_ANNOTATION, "").split(",") if p.strip()
            )
            numbers = [int(annotations.get(k) or 0) for k in PLACE_KEYS]
            size = int(annotations.get(SIZE_ANNOTATION) or 0)
        except ValueError:
            return None
        uuids: Sequence[str] = [u for u in annotations.get(UUIDS_ANNOTATION, "").split(",") if u]
        return cls(
            reservation=rid,
            node=annotations.get(NODE_ANNOTATION, ""),
            gpus=gpus,
            size=size,
            replica=numbers[0],
            pod=numbers[1],
            rank=numbers[2],
            uuids=tuple(uuids) if len(uuids) == len(gpus) else (),
        )


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What one pod asks of a node, as the scheduler extender reads it from the pod: its GPUs,
    the reservation it belongs to (and which of its pods it is), and the steering annotations."""

    gpus: int
    reservation: str = ""
    # Which pod of the reservation's placement this is (None: any), as the annotations say.
    group: str | None = None
    replica: str | None = None
    pod: str | None = None
    island: bool = False  # `gputopo.io/scope: nvlink`: its GPUs share one NVLink island
    pattern: Pattern = Pattern.ALL_REDUCE
    message_bytes: int = DEFAULT_MESSAGE_BYTES


def pod_ask(pod: Mapping[str, Any], resources: Collection[str] = GPU_RESOURCES) -> PodAsk:
    """A pod's ask; unknown patterns and malformed sizes fall back to the defaults (an all-reduce
    of 256 MiB), as a scheduler must still judge a pod whose hints are wrong."""
    annotations = annotations_of(pod)
    # Either spelling (`all-reduce`, `PATTERN_ALL_REDUCE`; `nvlink`, `SCOPE_NVLINK`), as in every
    # form of a request; an absent or unreadable one is what a request without it gets.
    try:
        island = scope_from_text("scope", annotations.get(SCOPE_ANNOTATION, "")) is Scope.NVLINK
    except RequestError:
        island = False
    try:
        pattern = pattern_from_text("pattern", annotations.get(PATTERN_ANNOTATION))
    except RequestError:
        pattern = DEFAULT_PATTERN
    try:
        size = int(annotations.get(MESSAGE_BYTES_ANNOTATION, DEFAULT_MESSAGE_BYTES))
    except ValueError:
        size = DEFAULT_MESSAGE_BYTES
    return PodAsk(
        gpus=pod_gpus(pod, resources),
        reservation=annotations.get(RESERVATION_ANNOTATION, ""),
        group=annotations.get(GROUP_LABEL),
        replica=annotations.get(PLACE_KEYS[0]),
        pod=annotations.get(PLACE_KEYS[1]),
        island=island,
        pattern=pattern,
        message_bytes=max(size, 0),
    )
