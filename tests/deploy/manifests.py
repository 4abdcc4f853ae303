"""deploy/ rendered the way `kubectl apply -k` would, for tests (no kustomize binary needed).

What our kustomizations use, and nothing more: `resources` (files), `namespace` (set on every
namespaced object), and the one Component's JSON 6902 patch (add/replace) of the DaemonSet.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = ("aggregator", "exporter", "scheduler")

# kind -> (API path of its collection, namespaced); every kind deploy/ holds.
KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("/api/v1/namespaces", False),
    "ServiceAccount": ("/api/v1/namespaces/{ns}/serviceaccounts", True),
    "Service": ("/api/v1/namespaces/{ns}/services", True),
    "Deployment": ("/apis/apps/v1/namespaces/{ns}/deployments", True),
    "DaemonSet": ("/apis/apps/v1/namespaces/{ns}/daemonsets", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1/clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", False),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        False,
    ),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        False,
    ),
}


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def render(component: str) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/<component>` sends."""
    base = DEPLOY / component
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text(encoding="utf-8"))
    namespace = kustomization.get("namespace")
    out = []
    for resource in kustomization["resources"]:
        for doc in _load(base / resource):
            if namespace and KINDS[doc["kind"]][1]:
                doc["metadata"]["namespace"] = namespace
            out.append(doc)
    return out


def optional() -> list[dict[str, Any]]:
    """deploy/*/optional/*.yaml, each applied on its own (`kubectl apply -n ... -f`)."""
    out = []
    for path in sorted(DEPLOY.glob("*/optional/*.yaml")):
        for doc in _load(path):
            if KINDS[doc["kind"]][1]:
                doc["metadata"].setdefault("namespace", "gputopo-system")
            out.append(doc)
    return out


def with_component(docs: list[dict[str, Any]], component: Path) -> list[dict[str, Any]]:
    """`docs` with a Component's JSON 6902 patches applied (add and replace, our only ops)."""
    spec = yaml.safe_load((component / "kustomization.yaml").read_text(encoding="utf-8"))
    out = copy.deepcopy(docs)
    for patch in spec["patches"]:
        target = patch["target"]
        for doc in out:
            if doc["kind"] != target["kind"] or doc["metadata"]["name"] != target["name"]:
                continue
            for op in yaml.safe_load(patch["patch"]):
                *parents, last = op["path"].strip("/").split("/")
                node: Any = doc
                for part in parents:
                    node = node[int(part)] if isinstance(node, list) else node[part]
                assert op["op"] in ("add", "replace"), op
                if op["op"] == "replace":
                    assert last in node, f"{op['path']}: nothing to replace"
                node[last] = op["value"]
    return out


def every_object() -> list[dict[str, Any]]:
    """Everything deploy/ holds, kustomizations and optional files."""
    return [d for c in KUSTOMIZATIONS for d in render(c)] + optional()
