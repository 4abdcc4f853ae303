"""kube-scheduler v1.20's default node filters, and its "0/N nodes are available" message.

A pod may run on a node only if every filter passes. kube-scheduler runs its filters in a fixed
order and stops at the first that fails, so each rejected node is counted under exactly one
filter (NodeResourcesFit may give several reasons for one node: one per short resource). The
order and the reason strings are v1.20's (kubernetes/kubernetes v1.20
`pkg/scheduler/algorithmprovider/registry.go` `getDefaultConfig`, and each plugin's `ErrReason`
under `pkg/scheduler/framework/plugins/`); the differential test holds them to a real
kube-scheduler 1.20.2, message text included:

1. **NodeUnschedulable**: a cordoned node (`spec.unschedulable`), unless the pod tolerates the
   `node.kubernetes.io/unschedulable:NoSchedule` taint.
2. **NodeResourcesFit**: one more pod than `allocatable.pods` allows fails; then, if the pod
   requests anything at all, CPU, memory and ephemeral storage are each checked against
   allocatable minus what the node's pods request (checked even when this pod asks none of that
   resource: an overcommitted node fits no pod that asks for anything), and every other resource
   the pod requests likewise (one missing from allocatable counts as 0).
3. **NodeName**: `spec.nodeName`, when set, must be the node.
4. **NodePorts**: no wanted host port may be held on the node for the same protocol and an
   overlapping IP (0.0.0.0 overlaps every IP).
5. **NodeAffinity**: every `nodeSelector` label, and one of the required node affinity terms
   (expressions ANDed: In, NotIn, Exists, DoesNotExist, Gt, Lt; `matchFields` on
   `metadata.name`; an empty term matches nothing).
6. **TaintToleration**: every NoSchedule and NoExecute taint tolerated; the first one that is
   not is named in the reason.

Volume and inter-pod filters are not modelled: gputopo's pods are judged on the node's facts.
The preferred forms (preferred node affinity weights, untolerated PreferNoSchedule taints) are a
score for breaking ties between fit nodes, never a filter.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gputopo.fitness.model import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    PODS,
    NodeFacts,
    NodeUsage,
    PodFacts,
    Requirement,
    Taint,
    Term,
    UsageBook,
    node_facts,
    pod_facts,
)

__all__ = [
    "FILTERS",
    "Fitness",
    "FitnessView",
    "fit_error_message",
    "matches_term",
    "score",
]

UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
_FIT_RESOURCES = (CPU, MEMORY, EPHEMERAL_STORAGE)
_UNTOLERATED = "that the pod didn't tolerate"
_INT64 = re.compile(r"^[+-]?\d+$")
_MAX_INT64 = 2**63 - 1

Filter = Callable[[PodFacts, NodeFacts, NodeUsage], tuple[str, ...]]


def _tolerated(pod: PodFacts, taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in pod.tolerations)


def node_unschedulable(pod: PodFacts, node: NodeFacts, usage: NodeUsage) -> tuple[str, ...]:
    """A cordoned node takes only pods that tolerate the unschedulable taint."""
    if node.unschedulable and not _tolerated(pod, UNSCHEDULABLE_TAINT):
        return ("node(s) were unschedulable",)
    return ()


def node_resources_fit(pod: PodFacts, node: NodeFacts, usage: NodeUsage) -> tuple[str, ...]:
    """Requests against allocatable minus what the node's pods already request."""
    reasons = []
    if usage.pods + 1 > node.allocatable.get(PODS, 0):
        reasons.append("Too many pods")
    asked = {k: v for k, v in pod.request.items() if k != PODS}
    if not any(asked.get(r, 0) for r in _FIT_RESOURCES) and not any(
        k not in _FIT_RESOURCES for k in asked
    ):
        return tuple(reasons)
    for name in _FIT_RESOURCES:
        if node.allocatable.get(name, 0) < asked.get(name, 0) + usage.requested.get(name, 0):
            reasons.append(f"Insufficient {name}")
    for name in sorted(asked):
        if name in _FIT_RESOURCES:
            continue
        if node.allocatable.get(name, 0) < asked[name] + usage.requested.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return tuple(reasons)


def node_name(pod: PodFacts, node: NodeFacts, usage: NodeUsage) -> tuple[str, ...]:
    """A pod that names a node fits only there."""
    if pod.node_name and pod.node_name != node.name:
        return ("node(s) didn't match the requested hostname",)
    return ()


def _port_conflict(wanted_ip: str, protocol: str, port: int, usage: NodeUsage) -> bool:
    for held in usage.ports:
        if held.port != port or held.protocol != protocol:
            continue
        if wanted_ip == "0.0.0.0" or held.ip in ("0.0.0.0", wanted_ip):
            return True
    return False


def node_ports(pod: PodFacts, node: NodeFacts, usage: NodeUsage) -> tuple[str, ...]:
    """Host ports are per node: a port held for an overlapping IP and protocol conflicts."""
    for want in pod.ports:
        if _port_conflict(want.ip, want.protocol, want.port, usage):
            return ("node(s) didn't have free ports for the requested pod ports",)
    return ()


def _int64(text: str) -> int | None:
    if not _INT64.match(text):
        return None
    number = int(text)
    return number if -_MAX_INT64 - 1 <= number <= _MAX_INT64 else None


def _label_matches(req: Requirement, labels: Mapping[str, str]) -> bool | None:
    """labels.Requirement.Matches; None when the requirement itself is invalid."""
    present = req.key in labels
    if req.operator in ("In", "NotIn"):
        if not req.values:
            return None
        inside = present and labels[req.key] in req.values
        return inside if req.operator == "In" else not inside
    if req.operator in ("Exists", "DoesNotExist"):
        if req.values:
            return None
        return present if req.operator == "Exists" else not present
    if req.operator in ("Gt", "Lt"):
        bound = _int64(req.values[0]) if len(req.values) == 1 else None
        if bound is None:
            return None
        have = _int64(labels[req.key]) if present else None
        if have is None:
            return False
        return have > bound if req.operator == "Gt" else have < bound
    return None


def _field_matches(req: Requirement, name: str) -> bool | None:
    """matchFields: only `metadata.name` with In or NotIn and exactly one value."""
    if len(req.values) != 1 or req.operator not in ("In", "NotIn"):
        return None
    fields = {"metadata.name": name}
    if req.operator == "In":
        return fields.get(req.key, "") == req.values[0]
    return fields.get(req.key, "") != req.values[0]


def matches_term(term: Term, node: NodeFacts) -> bool:
    """One node selector term: every expression and every field (an empty term matches
    nothing; an invalid requirement fails its term)."""
    if not term.expressions and not term.fields:
        return False
    for req in term.expressions:
        if not _label_matches(req, node.labels):
            return False
    return all(_field_matches(req, node.name) for req in term.fields)


def node_affinity(pod: PodFacts, node: NodeFacts, usage: NodeUsage) -> tuple[str, ...]:
    """`nodeSelector` AND (any required node affinity term)."""
    reason = ("node(s) didn't match Pod's node affinity",)
    for key, want in pod.node_selector.items():
        if node.labels.get(key) != want:
            return reason
    if pod.required_terms is not None and not any(
        matches_term(t, node) for t in pod.required_terms
    ):
        return reason
    return ()


def taint_toleration(pod: PodFacts, node: NodeFacts, usage: NodeUsage) -> tuple[str, ...]:
    """Every NoSchedule/NoExecute taint tolerated; the reason names the first that is not."""
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not _tolerated(pod, taint):
            return (f"node(s) had taint {{{taint.key}: {taint.value}}}, {_UNTOLERATED}",)
    return ()


FILTERS: tuple[tuple[str, Filter], ...] = (
    ("NodeUnschedulable", node_unschedulable),
    ("NodeName", node_name),
    ("TaintToleration", taint_toleration),
    ("NodeAffinity", node_affinity),
    ("NodePorts", node_ports),
    ("NodeResourcesFit", node_resources_fit),
)


def score(pod: PodFacts, node: NodeFacts) -> tuple[int, int]:
    """The tie-break between fit nodes, higher first: the summed weights of the preferred node
    affinity terms the node matches, then minus its PreferNoSchedule taints the pod does not
    tolerate (as kube-scheduler's NodeAffinity and TaintToleration scores rank them)."""
    weight = sum(
        p.weight
        for p in pod.preferred
        if p.weight
        and all(_label_matches(r, node.labels) for r in p.term.expressions)
        and p.term.expressions
    )
    untolerated = sum(
        1 for t in node.taints if t.effect == "PreferNoSchedule" and not _tolerated(pod, t)
    )
    return weight, -untolerated


def fit_error_message(total: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's FitError text: `0/6 nodes are available: 1 node(s) had taint {k: v},
    that the pod didn't tolerate, 5 node(s) were unschedulable.` (each "count reason" sorted
    as a string, as `FitError.Error` does)."""
    if total == 0:
        return "no nodes available to schedule pods"
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{total} nodes are available: {', '.join(parts)}."


@dataclass(frozen=True, slots=True)
class Fitness:
    """Where one pod may run: the fit nodes (name order), how many nodes each filter rejected,
    the reason counts kube-scheduler would print, and each fit node's tie-break score."""

    pod: str
    total: int
    feasible: tuple[str, ...]
    rejected: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    reasons: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    scores: Mapping[str, tuple[int, int]] = field(default_factory=lambda: MappingProxyType({}))

    def message(self) -> str:
        """kube-scheduler's "0/N nodes are available: ..." for this pod."""
        return fit_error_message(self.total, self.reasons)

    def summary(self) -> str:
        """One line naming the filters and the nodes each rejected (for Events)."""
        parts = [f"{name}: {count}" for name, count in self.rejected.items() if count]
        return f"{len(self.feasible)}/{self.total} nodes fit" + (
            f" (rejected by {', '.join(parts)})" if parts else ""
        )


class FitnessView:
    """Nodes and the pods bound to them, read once; `check` judges any number of pods."""

    def __init__(
        self,
        nodes: Iterable[Mapping[str, Any] | NodeFacts],
        bound_pods: Sequence[Mapping[str, Any]] = (),
        *,
        usage: UsageBook | None = None,
    ) -> None:
        """Nodes as JSON or already read; what bound pods take from `usage` if given (a
        binder keeps one up to date), else summed from `bound_pods`."""
        facts = (n if isinstance(n, NodeFacts) else node_facts(n) for n in nodes)
        self.nodes: tuple[NodeFacts, ...] = tuple(sorted(facts, key=lambda n: n.name))
        book = usage if usage is not None else UsageBook.of(bound_pods)
        self.usage = {n.name: book.usage(n.name) for n in self.nodes}

    def check(self, pod: Mapping[str, Any] | PodFacts) -> Fitness:
        """Run the filters in kube-scheduler's order for every node."""
        facts = pod if isinstance(pod, PodFacts) else pod_facts(pod)
        feasible: list[str] = []
        rejected: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for node in self.nodes:
            usage = self.usage[node.name]
            for name, check in FILTERS:
                why = check(facts, node, usage)
                if why:
                    rejected[name] += 1
                    reasons.update(why)
                    break
            else:
                feasible.append(node.name)
        by_name = {n.name: n for n in self.nodes}
        return Fitness(
            pod=facts.name,
            total=len(self.nodes),
            feasible=tuple(feasible),
            rejected=MappingProxyType({name: rejected[name] for name, _ in FILTERS}),
            reasons=MappingProxyType(dict(reasons)),
            scores=MappingProxyType({n: score(facts, by_name[n]) for n in feasible}),
        )
