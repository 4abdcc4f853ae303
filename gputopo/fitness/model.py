"""What the fitness filters read of Pods and Nodes, built once from the API's JSON.

A scenario is filtered many times (every pod against every node), so the JSON is read once into
small frozen values: `NodeFacts` (labels, taints, cordon, allocatable), `NodeUsage` (what the
pods already bound there request and which host ports they hold) and `PodFacts` (tolerations,
selectors, affinity, requests, host ports). Field names are the Kubernetes v1 JSON ones
(k8s.io/api `core/v1/types.go`); quantities become integers the way kube-scheduler counts them
(`quantity.py`). Input from the API server is trusted to be valid (it validated it); anything
odd that still gets here is read conservatively (an unparsable term matches nothing).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gputopo.fitness.quantity import QuantityError, milli_value, value

__all__ = [
    "CPU",
    "EPHEMERAL_STORAGE",
    "MEMORY",
    "PODS",
    "HostPort",
    "NodeFacts",
    "NodeUsage",
    "PodFacts",
    "Preference",
    "Requirement",
    "Taint",
    "Term",
    "Toleration",
    "UsageBook",
    "node_facts",
    "node_usage",
    "pod_facts",
    "pod_request",
]

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
# Pods in these phases hold nothing: kube-scheduler's cache never sees them (its informer of
# assigned pods selects `status.phase!=Succeeded,status.phase!=Failed`).
_DONE = frozenset({"Succeeded", "Failed"})
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _get(obj: Mapping[str, Any] | None, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _amount(name: str, quantity: Any) -> int:
    """CPU in millicores, everything else in whole units, rounded up as the scheduler does."""
    if isinstance(quantity, str):
        return _parsed(name == CPU, quantity)
    try:
        return milli_value(quantity) if name == CPU else value(quantity)
    except QuantityError:
        return 0


@functools.lru_cache(maxsize=4096)
def _parsed(milli: bool, text: str) -> int:
    """Clusters repeat a few quantities ("1", "8Gi") over thousands of pods: parse each once."""
    try:
        return milli_value(text) if milli else value(text)
    except QuantityError:
        return 0


def _resources(listing: Mapping[str, Any] | None) -> dict[str, int]:
    return {str(k): _amount(str(k), v) for k, v in (listing or {}).items()}


@dataclass(frozen=True, slots=True)
class Taint:
    """`key=value:effect` on a node."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod's toleration (an empty operator means Equal)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """`Toleration.ToleratesTaint` (k8s.io/api core/v1 `toleration.go`): an empty effect
        matches every effect, an empty key (with Exists) every key."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One `matchExpressions`/`matchFields` entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Term:
    """A node selector term: its expressions (on labels) and fields (on `metadata.name`)."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Preference:
    """A preferred node affinity term and its weight."""

    weight: int
    term: Term


@dataclass(frozen=True, slots=True, order=True)
class HostPort:
    """A host port a container binds: the IP ("0.0.0.0" for all), protocol and port."""

    ip: str
    protocol: str
    port: int


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the filters read of a Node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    allocatable: Mapping[str, int] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """What the pods bound to a node take: summed requests, their count, their host ports."""

    requested: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    pods: int = 0
    ports: frozenset[HostPort] = frozenset()


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the filters read of a Pod."""

    name: str
    node_name: str = ""
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # None: no required node affinity; a tuple: the terms, one of which must match.
    required_terms: tuple[Term, ...] | None = None
    preferred: tuple[Preference, ...] = ()
    request: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    ports: tuple[HostPort, ...] = ()


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """A Node's JSON read once."""
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
        for t in _get(node, "spec", "taints") or ()
    )
    return NodeFacts(
        name=str(_get(node, "metadata", "name") or ""),
        labels=MappingProxyType(dict(_get(node, "metadata", "labels") or {})),
        taints=taints,
        unschedulable=bool(_get(node, "spec", "unschedulable")),
        allocatable=MappingProxyType(_resources(_get(node, "status", "allocatable"))),
    )


def _container_ports(pod: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """Host ports of the app containers (kube-scheduler's NodePorts reads `spec.containers`
    only; an unset IP means all addresses and an unset protocol TCP)."""
    out = []
    for container in _get(pod, "spec", "containers") or ():
        for port in container.get("ports") or ():
            host_port = int(port.get("hostPort") or 0)
            if host_port > 0:
                ip = str(port.get("hostIP") or "0.0.0.0")
                out.append(HostPort(ip, str(port.get("protocol") or "TCP"), host_port))
    return tuple(out)


def pod_request(pod: Mapping[str, Any]) -> dict[str, int]:
    """What a pod asks of a node: the sum of its containers' requests, each resource raised to
    the largest init container's request, plus `spec.overhead`.

    kube-scheduler 1.20 counts a pod so both when it judges it (NodeResourcesFit
    `computePodResourceRequest`) and when it adds up the pods already on a node
    (`framework.NodeInfo`); the differential test holds both to the real scheduler (it caught
    an earlier reading of this code that left the bound pods' init containers out).
    """
    total: dict[str, int] = {}
    for container in _get(pod, "spec", "containers") or ():
        for name, amount in _resources(_get(container, "resources", "requests")).items():
            total[name] = total.get(name, 0) + amount
    for container in _get(pod, "spec", "initContainers") or ():
        for name, amount in _resources(_get(container, "resources", "requests")).items():
            total[name] = max(total.get(name, 0), amount)
    for name, amount in _resources(_get(pod, "spec", "overhead")).items():
        total[name] = total.get(name, 0) + amount
    return total


def _requirements(items: Iterable[Mapping[str, Any]] | None) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(
            str(r.get("key", "")),
            str(r.get("operator", "")),
            tuple(str(v) for v in r.get("values") or ()),
        )
        for r in items or ()
    )


def _term(data: Mapping[str, Any] | None) -> Term:
    return Term(
        _requirements(_get(data, "matchExpressions")), _requirements(_get(data, "matchFields"))
    )


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """A Pod's JSON read once."""
    spec = pod.get("spec") or {}
    tolerations = tuple(
        Toleration(
            str(t.get("key", "") or ""),
            str(t.get("operator", "") or "Equal"),
            str(t.get("value", "") or ""),
            str(t.get("effect", "") or ""),
        )
        for t in spec.get("tolerations") or ()
    )
    node_affinity = _get(spec, "affinity", "nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = None
    if required is not None:
        terms = tuple(_term(t) for t in required.get("nodeSelectorTerms") or ())
    preferred = tuple(
        Preference(int(p.get("weight") or 0), _term(p.get("preference")))
        for p in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    )
    meta = pod.get("metadata") or {}
    return PodFacts(
        name=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        node_name=str(spec.get("nodeName") or ""),
        tolerations=tolerations,
        node_selector=MappingProxyType(dict(spec.get("nodeSelector") or {})),
        required_terms=terms,
        preferred=preferred,
        request=MappingProxyType(pod_request(pod)),
        ports=_container_ports(pod),
    )


class UsageBook:
    """What the live pods bound to each node take, kept one pod at a time.

    A binder sees pods bound and finished all the time; summing every bound pod again for each
    decision cost a second at 40,000 pods. `put` and `remove` change only the pod's node.
    """

    def __init__(self) -> None:
        self._of: dict[str, tuple[str, dict[str, int], tuple[HostPort, ...]]] = {}
        self._requested: dict[str, Counter[str]] = {}
        self._pods: Counter[str] = Counter()
        self._ports: dict[str, Counter[HostPort]] = {}

    @classmethod
    def of(cls, bound_pods: Iterable[Mapping[str, Any]]) -> UsageBook:
        """A book of these pods (keyed by namespace/name)."""
        book = cls()
        for pod in bound_pods:
            meta = pod.get("metadata") or {}
            book.put(f"{meta.get('namespace', '')}/{meta.get('name', '')}", pod)
        return book

    def put(self, key: str, pod: Mapping[str, Any]) -> None:
        """Count `pod` (replacing what `key` counted before): nothing when it is unbound or
        finished."""
        self.remove(key)
        node = str(_get(pod, "spec", "nodeName") or "")
        if not node or _get(pod, "status", "phase") in _DONE:
            return
        request, ports = pod_request(pod), _container_ports(pod)
        self._of[key] = (node, request, ports)
        self._requested.setdefault(node, Counter()).update(request)
        self._pods[node] += 1
        self._ports.setdefault(node, Counter()).update(ports)

    def remove(self, key: str) -> None:
        """Forget what `key` counted."""
        old = self._of.pop(key, None)
        if old is None:
            return
        node, request, ports = old
        self._requested[node].subtract(request)
        self._pods[node] -= 1
        self._ports[node].subtract(ports)

    def usage(self, node: str) -> NodeUsage:
        """What the node's live bound pods take now."""
        requested = {k: v for k, v in (self._requested.get(node) or {}).items() if v}
        ports = frozenset(p for p, n in (self._ports.get(node) or {}).items() if n > 0)
        return NodeUsage(MappingProxyType(requested), self._pods[node], ports)


def node_usage(
    nodes: Iterable[str], bound_pods: Sequence[Mapping[str, Any]]
) -> dict[str, NodeUsage]:
    """node name -> what the live pods bound to it take (finished pods hold nothing)."""
    book = UsageBook.of(bound_pods)
    return {n: book.usage(n) for n in nodes}
