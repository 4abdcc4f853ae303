"""Which pods form a gang, what communication graph it asks for, and which pod goes where.

Pure functions over the API's JSON, so the binder's decisions are table-tested without a server.
A group comes from what users already write, in this order:

1. the coscheduling `PodGroup` (`scheduling.x-k8s.io/v1alpha1`, scheduler-plugins): pods carry
   the label `scheduling.x-k8s.io/pod-group: NAME`, the PodGroup's `spec.minMember` is the gang's
   minimum (CRD: scheduler-plugins `config/crd/bases/scheduling.x-k8s.io_podgroups.yaml`);
2. the native `scheduling.k8s.io/v1beta1` PodGroup (Kubernetes 1.35+ Workload API): pods carry
   `spec.schedulingGroup.podGroupName`, the minimum is `spec.schedulingPolicy.gang.minCount` and
   `spec.schedulingConstraints.topology[0].key` names the domain every pod must share (field
   names from k8s.io/api `scheduling/v1beta1/types.go`);
3. otherwise a pod is a group of one.

The communication graph is the group object's `gputopo.io/request` annotation (a lone pod's own),
in the schema of `gputopo place --request`; pods say which of its groups they fill with the label
`gputopo.io/group`. Without the annotation the default is one all-reduce group of `minimum` pods,
each with the GPUs its containers ask for, within the topology key's domain when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.request import (
    Constraint,
    Group,
    Pattern,
    PlacementRequest,
    RequestError,
    Scope,
    request_from_mapping,
)

__all__ = [
    "COSCHEDULING_LABEL",
    "GPUS_ANNOTATION",
    "GROUP_LABEL",
    "NODE_ANNOTATION",
    "RECORD_KEYS",
    "REQUEST_ANNOTATION",
    "RESERVATION_ANNOTATION",
    "SIZE_ANNOTATION",
    "UUIDS_ANNOTATION",
    "GroupKey",
    "GroupSpec",
    "assign",
    "build_request",
    "explain_rejections",
    "group_key",
    "missing",
    "pod_gpus",
    "pod_key",
    "record_annotations",
    "scope_of_topology_key",
    "spec_from_coscheduling",
    "spec_from_native",
    "spec_of_lone_pod",
    "stray_label",
]

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
GROUP_LABEL = "gputopo.io/group"
REQUEST_ANNOTATION = "gputopo.io/request"
# What the binder records on each pod before it binds any (restart-safety reads these back).
RESERVATION_ANNOTATION = "gputopo.io/reservation"
NODE_ANNOTATION = "gputopo.io/node"
GPUS_ANNOTATION = "gputopo.io/gpus"
SIZE_ANNOTATION = "gputopo.io/gang-size"
UUIDS_ANNOTATION = "gputopo.io/gpu-uuids"
_PLACE_KEYS = ("gputopo.io/replica", "gputopo.io/pod", "gputopo.io/rank")
RECORD_KEYS: tuple[str, ...] = (
    RESERVATION_ANNOTATION,
    NODE_ANNOTATION,
    GPUS_ANNOTATION,
    SIZE_ANNOTATION,
    UUIDS_ANNOTATION,
    *_PLACE_KEYS,
)
GPU_RESOURCES = ("nvidia.com/gpu",)
_DEFAULT_GROUP = "pods"

# A topology key (a node label) -> the scope gputopo checks. Keys gputopo publishes itself
# (`gputopo.io/leaf`, ...) and the well-known ones; anything else is treated as a node label
# gputopo cannot reason about and asked as a node selector-free preference for the cluster.
_TOPOLOGY_SCOPES = {
    "kubernetes.io/hostname": Scope.NODE,
    "topology.kubernetes.io/zone": Scope.ZONE,
    "topology.kubernetes.io/rack": Scope.LEAF,
    "topology.kubernetes.io/block": Scope.SPINE,
    "gputopo.io/nvlink-domain": Scope.NVLINK,
    "nvidia.com/gpu.clique": Scope.NVLINK,
    "gputopo.io/leaf": Scope.LEAF,
    "gputopo.io/spine": Scope.SPINE,
    "gputopo.io/core": Scope.CORE,
}


@dataclass(frozen=True, slots=True, order=True)
class GroupKey:
    """A gang: its namespace, where it was declared (`podgroup`, `workload`, `pod`) and name."""

    namespace: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What a gang asks: at least `minimum` pods, the request text if any, a topology key."""

    key: GroupKey
    minimum: int
    request_text: str = ""
    topology_key: str = ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def pod_key(pod: Mapping[str, Any]) -> str:
    """namespace/name."""
    return f"{_meta(pod).get('namespace', '')}/{_meta(pod).get('name', '')}"


def group_key(pod: Mapping[str, Any]) -> GroupKey:
    """The gang a pod belongs to (see the module docstring for the order)."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace", ""))
    label = (meta.get("labels") or {}).get(COSCHEDULING_LABEL)
    if label:
        return GroupKey(namespace, "podgroup", str(label))
    native = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    if native:
        return GroupKey(namespace, "workload", str(native))
    return GroupKey(namespace, "pod", str(meta.get("name", "")))


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod's containers ask for (limits, else requests), as the device plugin counts."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        for name in GPU_RESOURCES:
            value = (res.get("limits") or {}).get(name, (res.get("requests") or {}).get(name, 0))
            try:
                total += int(str(value))
            except ValueError:
                continue
    return total


def spec_from_coscheduling(obj: Mapping[str, Any]) -> GroupSpec:
    """A scheduler-plugins PodGroup: `spec.minMember` (default 1)."""
    meta = _meta(obj)
    key = GroupKey(str(meta.get("namespace", "")), "podgroup", str(meta.get("name", "")))
    minimum = int((obj.get("spec") or {}).get("minMember") or 1)
    text = str((meta.get("annotations") or {}).get(REQUEST_ANNOTATION, ""))
    return GroupSpec(key, max(minimum, 1), text)


def spec_from_native(obj: Mapping[str, Any]) -> GroupSpec:
    """A `scheduling.k8s.io/v1beta1` PodGroup: gang `minCount` (basic policy: 1) and the first
    topology constraint's key."""
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    key = GroupKey(str(meta.get("namespace", "")), "workload", str(meta.get("name", "")))
    gang = (spec.get("schedulingPolicy") or {}).get("gang") or {}
    minimum = int(gang.get("minCount") or 1)
    topology = (spec.get("schedulingConstraints") or {}).get("topology") or []
    topology_key = str(topology[0].get("key", "")) if topology else ""
    text = str((meta.get("annotations") or {}).get(REQUEST_ANNOTATION, ""))
    return GroupSpec(key, max(minimum, 1), text, topology_key)


def spec_of_lone_pod(pod: Mapping[str, Any]) -> GroupSpec:
    """A pod with no group: a gang of one, its own `gputopo.io/request` if it has one."""
    meta = _meta(pod)
    text = str((meta.get("annotations") or {}).get(REQUEST_ANNOTATION, ""))
    return GroupSpec(group_key(pod), 1, text)


def scope_of_topology_key(key: str) -> Scope | None:
    """The scope a topology key stands for, or None when gputopo does not know the key."""
    return _TOPOLOGY_SCOPES.get(key)


def build_request(spec: GroupSpec, pods: Sequence[Mapping[str, Any]]) -> PlacementRequest:
    """The communication graph to place for a gang.

    Raises `RequestError` whose field starts with `gputopo.io/request` when the annotation is
    not a valid request, so the Event names the field the user must fix.
    """
    if spec.request_text:
        try:
            data = yaml.safe_load(spec.request_text)
        except yaml.YAMLError as err:
            raise RequestError(REQUEST_ANNOTATION, f"not YAML or JSON: {err}") from None
        try:
            request = request_from_mapping(data)
        except RequestError as err:
            raise RequestError(f"{REQUEST_ANNOTATION}: {err.field}", err.reason) from None
    else:
        gpus = max((pod_gpus(p) for p in pods), default=0)
        if gpus < 1:
            raise RequestError("spec.containers[].resources.limits", "asks for no nvidia.com/gpu")
        scope = Constraint()
        if spec.topology_key:
            found = scope_of_topology_key(spec.topology_key)
            if found is None:
                raise RequestError(
                    "spec.schedulingConstraints.topology[0].key",
                    f"unknown topology key {spec.topology_key!r}",
                )
            scope = Constraint(required=found)
        group = Group(
            name=_DEFAULT_GROUP,
            pods=spec.minimum,
            gpus_per_pod=gpus,
            pattern=Pattern.ALL_REDUCE if spec.minimum * gpus > 1 else Pattern.NONE,
            scope=scope,
        )
        request = PlacementRequest(groups=(group,))
    return replace(request, job=request.job or spec.key.name, namespace=spec.key.namespace)


def _members(request: PlacementRequest, pods: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The pods of each request group, by name order: the `gputopo.io/group` label picks the
    group; with a single request group an unlabelled pod fills it."""
    names = [g.name for g in request.groups]
    out: dict[str, list[Any]] = {name: [] for name in names}
    for pod in sorted(pods, key=pod_key):
        label = (_meta(pod).get("labels") or {}).get(GROUP_LABEL)
        if label in out:
            out[str(label)].append(pod)
        elif label is None and len(names) == 1:
            out[names[0]].append(pod)
    return out


def stray_label(request: PlacementRequest, pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a pod's `gputopo.io/group` label fills no group of the request (one line naming the
    label and the pod), or None. Without this such a pod was never counted, and its gang waited
    for its minimum forever without a word."""
    names = [g.name for g in request.groups]
    for pod in sorted(pods, key=pod_key):
        label = (_meta(pod).get("labels") or {}).get(GROUP_LABEL)
        if label is not None and label not in names:
            return (
                f"{GROUP_LABEL}: {label!r} of pod {pod_key(pod)} names no group of the request"
                f" (its groups: {', '.join(names)})"
            )
    return None


def missing(request: PlacementRequest, pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Request group -> pods it still lacks (empty when the gang's minimum is reached)."""
    members = _members(request, pods)
    out = {}
    for g in request.groups:
        lack = g.replicas * g.pods - len(members[g.name])
        if lack > 0:
            out[g.name] = lack
    return out


def assign(
    request: PlacementRequest, result: PlacementResult, pods: Sequence[Mapping[str, Any]]
) -> dict[str, PodPlacement]:
    """pod key -> its placement: a group's pods in name order take its placed pods in
    (replica, pod) order. Pods beyond the minimum get none (they wait for another round)."""
    members = _members(request, pods)
    out: dict[str, PodPlacement] = {}
    for name, group_pods in members.items():
        placed = sorted(
            (p for p in result.pods if p.group == name), key=lambda p: (p.replica, p.pod)
        )
        if len(group_pods) < len(placed):
            raise ValueError(f"group {name}: {len(placed)} placed, {len(group_pods)} pods")
        for pod, where in zip(group_pods, placed, strict=False):
            out[pod_key(pod)] = where
    return out


def record_annotations(
    reservation: str, where: PodPlacement, size: int, uuids: Mapping[int, str] | None = None
) -> dict[str, str]:
    """What the binder writes on a pod before binding it (and reads back after a restart):
    the GPU UUIDs too when the aggregator knows them, in the order of the indices."""
    out = {
        RESERVATION_ANNOTATION: reservation,
        NODE_ANNOTATION: where.node,
        GPUS_ANNOTATION: ",".join(str(g) for g in where.gpus),
        SIZE_ANNOTATION: str(size),
        "gputopo.io/replica": str(where.replica),
        "gputopo.io/pod": str(where.pod),
        "gputopo.io/rank": str(where.rank),
    }
    if uuids and all(g in uuids for g in where.gpus):
        out[UUIDS_ANNOTATION] = ",".join(uuids[g] for g in where.gpus)
    return out


def explain_rejections(result: PlacementResult, *, limit: int = 6) -> str:
    """One line: the reason and the first rejected domains with their codes."""
    parts = [f"{r.domain}: {r.code.value}: {r.message}" for r in result.rejections[:limit]]
    more = len(result.rejections) - limit
    if more > 0:
        parts.append(f"... {more} more")
    text = result.reason or "not placed"
    return text + (" [" + "; ".join(parts) + "]" if parts else "")
