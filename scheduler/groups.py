"""Which pods form a gang, what communication graph it asks for, and which pod goes where.

Pure functions over the API's JSON, so the binder's decisions are table-tested without a server.
A group comes from what users already write, in this order:

1. the coscheduling `PodGroup` (`scheduling.x-k8s.io/v1alpha1`, scheduler-plugins): pods carry
   the label `scheduling.x-k8s.io/pod-group: NAME`, the PodGroup's `spec.minMember` is the gang's
   minimum (CRD: scheduler-plugins `config/crd/bases/scheduling.x-k8s.io_podgroups.yaml`);
2. the native `PodGroup` of `scheduling.k8s.io` (Kubernetes 1.36 serves it as v1alpha2, 1.37 as
   v1beta1; the binder finds which by API discovery, `scheduler/native.py`): pods carry
   `spec.schedulingGroup.podGroupName`, the minimum is `spec.schedulingPolicy.gang.minCount` and
   `spec.schedulingConstraints.topology[0].key` names the node label whose value every pod must
   share (field names from k8s.io/api `scheduling/v1beta1/types.go`);
3. the 1.35 `Workload` (`scheduling.k8s.io/v1alpha1`, no PodGroup object yet): pods carry
   `spec.workloadRef {name, podGroup, podGroupReplicaKey}`, the minimum is the named entry of
   the Workload's `spec.podGroups[].policy.gang.minCount`, one gang per replica key;
4. otherwise a pod is a group of one.

Every value read from a user-writable object is checked here: a malformed one raises
`RequestError` naming the field, so the binder refuses that group with an Event and goes on.

The communication graph is the group object's `gputopo.io/request` annotation (a lone pod's own),
in the schema of `gputopo place --request`; pods say which of its groups they fill with the label
`gputopo.io/group`. Without the annotation the default is one all-reduce group of `minimum` pods,
each with the GPUs its containers ask for, within the topology key's domain when there is one.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from gputopo.placement.result import PlacementResult, PodPlacement

# The pod vocabulary (labels, the record the binder writes with each Binding and reads back) is
# the one every process speaks.
from gputopo.pods import (
    GPUS_ANNOTATION,
    GROUP_LABEL,
    NODE_ANNOTATION,
    RECORD_KEYS,
    REQUEST_ANNOTATION,
    RESERVATION_ANNOTATION,
    SIZE_ANNOTATION,
    UUIDS_ANNOTATION,
)
from gputopo.pods import pod_gpus as shared_pod_gpus
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
    "HOSTNAME_KEY",
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
    "gang_size",
    "group_key",
    "missing",
    "pod_gpus",
    "pod_key",
    "record_annotations",
    "spec_from_coscheduling",
    "spec_from_native",
    "spec_from_workload_v1alpha1",
    "spec_of_lone_pod",
    "stray_label",
    "topology_scope",
]

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
# A gang's placement asks for whole GPUs: a pod's `nvidia.com/gpu` (and MIG slices, one GPU
# each, as `gputopo.pods` counts them).
GPU_RESOURCES = ("nvidia.com/gpu",)
_DEFAULT_GROUP = "pods"

# A topology key is a node label and its domains are that label's values (the upstream
# contract: "key specifies the key of the node label representing the topology domain"). The
# binder places such a gang once per value with a node selector (`scheduler/binder.py`); only
# the hostname key, whose domains are exactly single nodes, maps onto a placement scope.
HOSTNAME_KEY = "kubernetes.io/hostname"
# k8s-label-key: an optional DNS-subdomain prefix and a name of <= 63 characters.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes caps an int32 field; a gang of more pods than this is a typo, not a job.
_MAX_INT32 = 2**31 - 1


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
    # coscheduling `spec.scheduleTimeoutSeconds`: how long the gang may wait for its minimum
    # and a placement before its waiting pods are told it timed out (None: no limit).
    timeout_s: float | None = None


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
    spec = pod.get("spec") or {}
    native = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if native:
        return GroupKey(namespace, "workload", str(native))
    ref = spec.get("workloadRef") or {}
    if ref.get("name") and ref.get("podGroup"):
        parts = [str(ref["name"]), str(ref["podGroup"])]
        if ref.get("podGroupReplicaKey"):
            parts.append(str(ref["podGroupReplicaKey"]))
        return GroupKey(namespace, "workloadref", "/".join(parts))
    return GroupKey(namespace, "pod", str(meta.get("name", "")))


def _whole(value: Any, field: str, *, minimum: int = 0) -> int:
    """An integer field of a user-writable object, or `RequestError` naming it. Booleans and
    fractions are refused (YAML `true` is an int to Python; `2.5` pods is no count)."""
    if isinstance(value, bool):
        raise RequestError(field, f"must be an integer, not {value!r}")
    number: int | None = value if isinstance(value, int) else None
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # int(): "¹" passes str.isdigit(), is no integer
            number = int(value)
    if number is None:
        raise RequestError(field, f"must be an integer, not {value!r}"[:200])
    if not minimum <= number <= _MAX_INT32:
        raise RequestError(field, f"must be between {minimum} and {_MAX_INT32}, not {number}")
    return number


def _container_gpus(containers: Any, field: str) -> list[int]:
    out = []
    for i, container in enumerate(containers or []):
        res = (container or {}).get("resources") or {}
        gpus = 0
        for name in GPU_RESOURCES:
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            if name in limits:
                gpus += _whole(str(limits[name]), f"{field}[{i}].resources.limits[{name}]")
            elif name in requests:
                gpus += _whole(str(requests[name]), f"{field}[{i}].resources.requests[{name}]")
        out.append(gpus)
    return out


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod asks for, as Kubernetes counts a pod's request: the larger of the sum over
    its containers and the largest init container (init containers run one at a time, before
    the others). Limits, else requests, as the device plugin counts. A value that is not a
    whole number raises `RequestError` naming the container's field."""
    spec = pod.get("spec") or {}
    _container_gpus(spec.get("containers"), "spec.containers")  # a malformed count is refused
    _container_gpus(spec.get("initContainers"), "spec.initContainers")
    # Then Kubernetes' rule, shared with the aggregator and the extender (sidecars run beside
    # the containers, overhead that names GPUs adds to them): `gputopo.pods.pod_gpus`.
    return shared_pod_gpus(pod, GPU_RESOURCES)


def _annotation(obj: Mapping[str, Any], key: str) -> str:
    value = (_meta(obj).get("annotations") or {}).get(key, "")
    if not isinstance(value, str):
        raise RequestError(f"metadata.annotations[{key}]", "must be a string")
    return value


def _timeout(spec: Mapping[str, Any]) -> float | None:
    value = spec.get("scheduleTimeoutSeconds")
    if value is None:
        return None
    return float(_whole(value, "spec.scheduleTimeoutSeconds", minimum=1))


def spec_from_coscheduling(obj: Mapping[str, Any]) -> GroupSpec:
    """A scheduler-plugins PodGroup: `spec.minMember` (default 1; scheduler-plugins treats 0 as
    1 too) and `spec.scheduleTimeoutSeconds`."""
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise RequestError("spec", "must be an object")
    key = GroupKey(str(meta.get("namespace", "")), "podgroup", str(meta.get("name", "")))
    raw = spec.get("minMember")
    minimum = 1 if raw is None else _whole(raw, "spec.minMember")
    text = _annotation(obj, REQUEST_ANNOTATION)
    return GroupSpec(key, max(minimum, 1), text, timeout_s=_timeout(spec))


def _gang_minimum(policy: Any, field: str) -> int:
    """`gang.minCount` of a scheduling policy; a `basic` policy is a gang of one."""
    if not isinstance(policy, Mapping):
        raise RequestError(field, "must be an object with basic or gang")
    gang = policy.get("gang")
    if gang is None:
        return 1
    if not isinstance(gang, Mapping):
        raise RequestError(f"{field}.gang", "must be an object")
    return _whole(gang.get("minCount"), f"{field}.gang.minCount", minimum=1)


def _topology_key(constraints: Any, field: str) -> str:
    if constraints is None:
        return ""
    if not isinstance(constraints, Mapping):
        raise RequestError(field, "must be an object")
    topology = constraints.get("topology") or []
    if not isinstance(topology, list) or len(topology) > 1:
        raise RequestError(f"{field}.topology", "must be a list of at most one constraint")
    if not topology:
        return ""
    key = (topology[0] or {}).get("key") if isinstance(topology[0], Mapping) else None
    where = f"{field}.topology[0].key"
    if not isinstance(key, str) or not _label_key_ok(key):
        raise RequestError(where, f"must be a node label key, not {key!r}"[:200])
    return key


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def spec_from_native(obj: Mapping[str, Any]) -> GroupSpec:
    """A native `PodGroup` (`scheduling.k8s.io` v1alpha2 or v1beta1, the same fields): gang
    `minCount` (basic policy: 1) and the first topology constraint's key."""
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise RequestError("spec", "must be an object")
    key = GroupKey(str(meta.get("namespace", "")), "workload", str(meta.get("name", "")))
    minimum = _gang_minimum(spec.get("schedulingPolicy") or {}, "spec.schedulingPolicy")
    topology_key = _topology_key(spec.get("schedulingConstraints"), "spec.schedulingConstraints")
    return GroupSpec(key, minimum, _annotation(obj, REQUEST_ANNOTATION), topology_key)


def spec_from_workload_v1alpha1(obj: Mapping[str, Any], key: GroupKey) -> GroupSpec:
    """The entry of a 1.35 `Workload`'s `spec.podGroups` that `key` names (`workload/group`
    or `workload/group/replica`): its gang `minCount` (basic policy: 1)."""
    group = key.name.split("/")[1]
    entries = (obj.get("spec") or {}).get("podGroups") or []
    if not isinstance(entries, list):
        raise RequestError("spec.podGroups", "must be a list")
    for i, entry in enumerate(entries):
        if isinstance(entry, Mapping) and entry.get("name") == group:
            minimum = _gang_minimum(entry.get("policy") or {}, f"spec.podGroups[{i}].policy")
            return GroupSpec(key, minimum, _annotation(obj, REQUEST_ANNOTATION))
    raise RequestError("spec.podGroups", f"has no group {group!r} (spec.workloadRef.podGroup)")


def spec_of_lone_pod(pod: Mapping[str, Any]) -> GroupSpec:
    """A pod with no group: a gang of one, its own `gputopo.io/request` if it has one."""
    return GroupSpec(group_key(pod), 1, _annotation(pod, REQUEST_ANNOTATION))


def topology_scope(key: str) -> Scope | None:
    """The placement scope a topology key is exactly, or None: the key is then a node label
    whose values the binder places in one at a time."""
    return Scope.NODE if key == HOSTNAME_KEY else None


def gang_size(pod: Mapping[str, Any]) -> int:
    """The `gputopo.io/gang-size` a pod records, or `RequestError` naming the annotation."""
    return _whole(
        _annotation(pod, SIZE_ANNOTATION), f"metadata.annotations[{SIZE_ANNOTATION}]", minimum=1
    )


def build_request(spec: GroupSpec, pods: Sequence[Mapping[str, Any]]) -> PlacementRequest:
    """The communication graph to place for a gang.

    Raises `RequestError` whose field starts with `gputopo.io/request` when the annotation is
    not a valid request, so the Event names the field the user must fix. A topology key other
    than the hostname's is left to the caller (it places once per value of that label).
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
        except (TypeError, ValueError, AttributeError) as err:
            raise RequestError(REQUEST_ANNOTATION, f"not a request: {err}"[:300]) from None
    else:
        gpus = max((pod_gpus(p) for p in pods), default=0)
        if gpus < 1:
            raise RequestError("spec.containers[].resources.limits", "asks for no nvidia.com/gpu")
        found = topology_scope(spec.topology_key)
        group = Group(
            name=_DEFAULT_GROUP,
            pods=spec.minimum,
            gpus_per_pod=gpus,
            pattern=Pattern.ALL_REDUCE if spec.minimum * gpus > 1 else Pattern.NONE,
            scope=Constraint(required=found) if found is not None else Constraint(),
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
