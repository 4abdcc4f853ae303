"""Seeded random scenarios for the fitness differential test: Nodes, pods already bound to them
and pending pods, as Kubernetes JSON.

The draws aim at the edges of every filter: cordons with and without the unschedulable
toleration, taints of every effect against Equal/Exists/empty-key/empty-effect tolerations,
selectors and affinity terms with every operator (Gt/Lt against integer and non-integer label
values, matchFields on node names), requests of every resource against tight allocatables
(init containers larger than the containers, RuntimeClass overhead, a resource missing from
allocatable, `pods` limits of 2), and host ports on wildcard and specific IPs. Pods of one
scenario are independent: the extender answers no node, so none of them binds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RUNTIME_CLASSES", "SCENARIO_LABEL", "Scenario", "scenario"]

SCENARIO_LABEL = "gputopo.test/scenario"
# RuntimeClasses whose overhead the API server's RuntimeClass admission copies into the pods.
RUNTIME_CLASSES = {
    "small": {"cpu": "250m", "memory": "128Mi"},
    "big": {"cpu": "1", "memory": "1Gi"},
}
_GPU = "nvidia.com/gpu"
_FPGA = "example.com/fpga"
_TAINTS = [
    ("dedicated", "gpu", "NoSchedule"),
    ("dedicated", "infer", "NoExecute"),
    ("maintenance", "", "NoSchedule"),
    ("spot", "true", "PreferNoSchedule"),
    ("node.kubernetes.io/unschedulable", "", "NoSchedule"),
    ("flaky", "yes", "NoExecute"),
]
_TOLERATIONS: list[dict[str, Any]] = [
    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Exists"},
    {"key": "dedicated", "value": "infer"},
    {"operator": "Exists"},
    {"operator": "Exists", "effect": "NoSchedule"},
    {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Equal", "effect": "NoExecute"},
    {"key": "flaky", "operator": "Equal", "value": "no"},
    {"key": "spot", "operator": "Equal", "value": "true", "effect": "PreferNoSchedule"},
]
_LABELS: dict[str, list[str]] = {
    "gpu": ["a100", "h100", "l4"],
    "zone": ["a", "b", "c"],
    "rack": ["1", "7", "12", "30", "x9"],
    "pool": ["train", "serve"],
}


@dataclass
class Scenario:
    """One cluster: Nodes, pods bound to them (some finished), pending pods."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    bound: list[dict[str, Any]] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)  # bound pods to mark Succeeded
    pending: list[dict[str, Any]] = field(default_factory=list)


def _node(rng: random.Random, name: str, label: str) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, SCENARIO_LABEL: label}
    for key, values in _LABELS.items():
        if rng.random() < 0.75:
            labels[key] = rng.choice(values)
    allocatable = {
        "cpu": rng.choice(["2", "4", "8", "3500m"]),
        "memory": rng.choice(["4Gi", "16Gi", "8000Mi", "17179869184"]),
        "pods": rng.choice(["2", "3", "110"]),
    }
    if rng.random() < 0.7:
        allocatable["ephemeral-storage"] = rng.choice(["10Gi", "50G"])
    if rng.random() < 0.8:
        allocatable[_GPU] = rng.choice(["0", "4", "6", "8"])
    if rng.random() < 0.3:
        allocatable[_FPGA] = "2"
    taints = [
        {"key": k, "value": v, "effect": e} if v else {"key": k, "effect": e}
        for k, v, e in rng.sample(_TAINTS, rng.choice([0, 0, 1, 1, 2]))
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": rng.random() < 0.2, "taints": taints},
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _requests(rng: random.Random, scale: float) -> dict[str, str]:
    out: dict[str, str] = {}
    if rng.random() < 0.6:
        out["cpu"] = f"{rng.choice([100, 500, 1000, 1500, 2500]) * scale:.0f}m"
    if rng.random() < 0.6:
        out["memory"] = rng.choice(["512Mi", "2Gi", "6Gi", "1e9"])
    if rng.random() < 0.2:
        out["ephemeral-storage"] = rng.choice(["1Gi", "20Gi"])
    if rng.random() < 0.5:
        out[_GPU] = str(rng.choice([1, 2, 4, 6, 8]))
    if rng.random() < 0.1:
        out[_FPGA] = "1"
    return out


def _container(rng: random.Random, name: str, scale: float, *, ports: bool) -> dict[str, Any]:
    requests = _requests(rng, scale)
    resources: dict[str, Any] = {}
    if requests:
        # Extended resources must be limits (requests default to them); others as requests.
        limits = {k: v for k, v in requests.items() if k in (_GPU, _FPGA)}
        rest = {k: v for k, v in requests.items() if k not in limits}
        resources = {"limits": limits} if limits else {}
        if rest:
            resources["requests"] = rest
    container: dict[str, Any] = {"name": name, "image": "x", "resources": resources}
    if ports and rng.random() < 0.3:
        container["ports"] = [
            {
                "containerPort": 80 + i,
                "hostPort": rng.choice([8080, 9090]),
                "protocol": rng.choice(["TCP", "TCP", "UDP"]),
                **({"hostIP": ip} if (ip := rng.choice(["", "", "10.0.0.1", "10.0.0.2"])) else {}),
            }
            for i in range(rng.choice([1, 1, 2]))
        ]
    return container


def _spec(rng: random.Random, scale: float) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            _container(rng, f"c{i}", scale, ports=True) for i in range(rng.choice([1, 1, 2]))
        ]
    }
    if rng.random() < 0.25:
        spec["initContainers"] = [_container(rng, "init", scale * 3, ports=False)]
    if rng.random() < 0.15:
        spec["runtimeClassName"] = rng.choice(sorted(RUNTIME_CLASSES))
    _unique_host_ports(spec)
    return spec


def _unique_host_ports(spec: dict[str, Any]) -> None:
    """The API refuses a pod that binds one protocol/IP/host port twice: keep the first."""
    seen: set[tuple[str, str, int]] = set()
    for container in spec["containers"]:
        kept = []
        for port in container.get("ports", []):
            key = (port["protocol"], port.get("hostIP", ""), port["hostPort"])
            if key not in seen:
                seen.add(key)
                kept.append(port)
        if "ports" in container:
            container["ports"] = kept


def _expression(rng: random.Random) -> dict[str, Any]:
    key = rng.choice([*_LABELS, "missing"])
    operator = rng.choice(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"])
    if operator in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": operator}
    if operator in ("Gt", "Lt"):
        return {"key": "rack", "operator": operator, "values": [rng.choice(["0", "7", "12"])]}
    values = rng.sample(_LABELS.get(key, ["v"]), rng.choice([1, 2]) if key in _LABELS else 1)
    return {"key": key, "operator": operator, "values": values}


def _affinity(rng: random.Random, node_names: list[str]) -> dict[str, Any]:
    terms = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        term: dict[str, Any] = {}
        if rng.random() < 0.85:
            term["matchExpressions"] = [_expression(rng) for _ in range(rng.choice([1, 2, 3]))]
        if rng.random() < 0.2 or not term:
            term["matchFields"] = [
                {
                    "key": "metadata.name",
                    "operator": rng.choice(["In", "NotIn"]),
                    "values": [rng.choice(node_names)],
                }
            ]
        terms.append(term)
    affinity: dict[str, Any] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
    }
    if rng.random() < 0.3:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": rng.randint(1, 100), "preference": {"matchExpressions": [_expression(rng)]}}
        ]
    return {"nodeAffinity": affinity}


def _pod(name: str, namespace: str, spec: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def scenario(
    seed: int, *, prefix: str, namespace: str, scheduler: str, nodes: int, pods: int
) -> Scenario:
    """Scenario number `seed`: `nodes` Nodes named `{prefix}n{i}`, up to two bound pods on each,
    `pods` pending pods for `scheduler`."""
    rng = random.Random(seed)
    label = f"s{seed}"
    out = Scenario()
    names = [f"{prefix}n{i}" for i in range(nodes)]
    out.nodes = [_node(rng, name, label) for name in names]
    labels = {SCENARIO_LABEL: label}
    for i, node in enumerate(names):
        for j in range(rng.choice([0, 1, 1, 2])):
            spec = _spec(rng, 1.0) | {"nodeName": node, "schedulerName": scheduler}
            name = f"{prefix}b{i}-{j}"
            out.bound.append(_pod(name, namespace, spec, labels))
            if rng.random() < 0.15:
                out.finished.add(name)
    for k in range(pods):
        spec = _spec(rng, 0.5) | {"schedulerName": scheduler}
        if rng.random() < 0.6:
            spec["tolerations"] = rng.sample(_TOLERATIONS, rng.choice([1, 1, 2, 3]))
        if rng.random() < 0.3:
            spec["nodeSelector"] = {
                key: rng.choice(_LABELS[key]) for key in rng.sample(sorted(_LABELS), 1)
            }
        if rng.random() < 0.4:
            spec["affinity"] = _affinity(rng, names)
        out.pending.append(_pod(f"{prefix}p{k}", namespace, spec, labels))
    return out
