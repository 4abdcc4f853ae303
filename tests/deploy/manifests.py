"""deploy/ rendered the way `kubectl kustomize` would, for tests (no kustomize binary needed).

What our kustomizations use, and nothing more:
- `resources` (files and directories, each directory built on its own first);
- `components` (their resources join the parent's, then their patches and replacements run on
  everything accumulated so far);
- `namespace` (set on every namespaced object);
- `patches`: JSON 6902 ops add (with `-` to append), replace and remove, on a target kind/name;
- `replacements`: a source field copied to target fields selected by kind, name and namespace,
  with `options.delimiter`/`options.index` (one part of a delimited value) and `options.create`;
  field paths with dotted keys, list indexes, `[name=x]` items, `[=value]` scalars and
  `[dotted.key]` map keys;
- objects annotated `config.kubernetes.io/local-config: "true"` are read, never emitted.

`tests/deploy/test_overlays.py` holds this renderer to kustomize itself (`kubectl kustomize`)
on every overlay with every component, so a construct it misreads fails there, not in a cluster.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("default", "scheduler-objects", "no-tls-dev")
KUSTOMIZATIONS = ("aggregator", "exporter", "scheduler")
COMPONENTS = (
    "optional/cert-manager",
    "optional/prometheus-operator",
    "optional/networkpolicy",
    "optional/admission-policy",
    "optional/exporter-node-label",
)
LOCAL_CONFIG = "config.kubernetes.io/local-config"

# kind -> (API path of its collection, namespaced); every kind deploy/ holds.
KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("/api/v1/namespaces", False),
    "ConfigMap": ("/api/v1/namespaces/{ns}/configmaps", True),
    "DevSettings": ("", True),  # local-config only
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
    "PriorityClass": ("/apis/scheduling.k8s.io/v1/priorityclasses", False),
    # policy/v1 from 1.21; the 1.20 test server serves the same fields as v1beta1.
    "PodDisruptionBudget": ("/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        False,
    ),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors", True),
    "PodMonitor": ("/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors", True),
    "Certificate": ("/apis/cert-manager.io/v1/namespaces/{ns}/certificates", True),
    "ClusterIssuer": ("/apis/cert-manager.io/v1/clusterissuers", False),
}


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _local(doc: dict[str, Any]) -> bool:
    annotations = doc["metadata"].get("annotations") or {}
    return str(annotations.get(LOCAL_CONFIG, "")).lower() == "true"


def build(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIRECTORY` prints (local-config ones left out)."""
    return [d for d in _build(directory) if not _local(d)]


def _build(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    docs: list[dict[str, Any]] = []
    for resource in spec.get("resources") or []:
        path = (directory / resource).resolve()
        docs += _build(path) if path.is_dir() else _load(path)
    for component in spec.get("components") or []:
        docs = _apply_component((directory / component).resolve(), docs)
    return _transform(spec, docs)


def _apply_component(directory: Path, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    assert spec["kind"] == "Component", directory
    added = [d for r in spec.get("resources") or [] for d in _load(directory / r)]
    return _transform(spec, docs + added)


def _transform(spec: dict[str, Any], docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    namespace = spec.get("namespace")
    if namespace:
        for doc in docs:
            if KINDS[doc["kind"]][1]:
                doc["metadata"]["namespace"] = namespace
    for patch in spec.get("patches") or []:
        target = patch["target"]
        for doc in docs:
            if _selected(doc, target):
                _json6902(doc, yaml.safe_load(patch["patch"]))
    for replacement in spec.get("replacements") or []:
        _replace(replacement, docs)
    return docs


def _selected(doc: dict[str, Any], select: dict[str, Any]) -> bool:
    meta = doc["metadata"]
    return (
        select.get("kind", doc["kind"]) == doc["kind"]
        and select.get("name", meta["name"]) == meta["name"]
        and select.get("namespace", meta.get("namespace")) == meta.get("namespace")
    )


def _json6902(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            if last == "-":
                node.append(op["value"])
            elif op["op"] == "add":
                node.insert(int(last), op["value"])
            else:
                node[int(last)] = op["value"]
        else:
            assert op["op"] in ("add", "replace"), op
            if op["op"] == "replace":
                assert last in node, f"{op['path']}: nothing to replace"
            node[last] = op["value"]


_SEGMENT = re.compile(r"\[[^\]]*\]|[^.\[]+")


def _segments(field_path: str) -> list[str]:
    return _SEGMENT.findall(field_path)


def _step(node: Any, segment: str, *, create: bool) -> Any:
    """The child `segment` names; KeyError when absent (and not created)."""
    if segment.startswith("[") and "=" in segment:
        key, value = segment[1:-1].split("=", 1)
        assert isinstance(node, list), segment
        for i, item in enumerate(node):
            if (key == "" and str(item) == value) or (
                key and isinstance(item, dict) and str(item.get(key)) == value
            ):
                return i
        raise KeyError(segment)
    if isinstance(node, list):
        return int(segment)
    key = segment[1:-1] if segment.startswith("[") else segment
    if key not in node:
        if not create:
            raise KeyError(segment)
        node[key] = {}
    return key


def _get(doc: dict[str, Any], field_path: str) -> Any:
    node: Any = doc
    for segment in _segments(field_path):
        node = node[_step(node, segment, create=False)]
    return node


def _set(doc: dict[str, Any], field_path: str, value: Any, options: dict[str, Any]) -> None:
    *parents, last = _segments(field_path)
    create = bool(options.get("create"))
    node: Any = doc
    for segment in parents:
        node = node[_step(node, segment, create=create)]
    key = _step(node, last, create=create)
    if "delimiter" in options:
        parts = str(node[key]).split(options["delimiter"])
        parts[int(options.get("index", 0))] = str(value)
        value = options["delimiter"].join(parts)
    node[key] = copy.deepcopy(value)


def _replace(replacement: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    source = replacement["source"]
    (origin,) = [d for d in docs if _selected(d, source)]
    value = _get(origin, source.get("fieldPath", "metadata.name"))
    for target in replacement["targets"]:
        for doc in docs:
            if doc is origin or not _selected(doc, target["select"]):
                continue
            for field_path in target["fieldPaths"]:
                try:
                    _set(doc, field_path, value, target.get("options") or {})
                except KeyError:
                    raise AssertionError(
                        f"{doc['kind']} {doc['metadata']['name']}: no {field_path}"
                    ) from None


def overlay(name: str, *, components: tuple[str, ...] = (), root: Path = DEPLOY) -> list[Any]:
    """The objects `kubectl kustomize deploy/overlays/NAME` prints, with `components` (paths
    under deploy/) switched on in the default overlay, as an operator uncomments them."""
    if not components:
        return build(root / "overlays" / name)
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        copy_root = Path(tmp) / "deploy"
        shutil.copytree(root, copy_root)
        enable(copy_root, components)
        return build(copy_root / "overlays" / name)


def enable(root: Path, components: tuple[str, ...]) -> None:
    """Switch `components` on in ROOT/overlays/default/kustomization.yaml, in its text."""
    path = root / "overlays" / "default" / "kustomization.yaml"
    text = path.read_text(encoding="utf-8")
    listed = "".join(f"  - ../../{c}\n" for c in components)
    assert "components: []\n" in text
    path.write_text(text.replace("components: []\n", "components:\n" + listed), encoding="utf-8")


def render(component: str) -> list[dict[str, Any]]:
    """The objects of one base, `kubectl kustomize deploy/<component>`."""
    return build(DEPLOY / component)


def with_component(docs: list[dict[str, Any]], component: Path) -> list[dict[str, Any]]:
    """`docs` with a Component's patches applied (as a parent kustomization would)."""
    return _apply_component(component, copy.deepcopy(docs))


def every_object() -> list[dict[str, Any]]:
    """Everything the default overlay ships, with every optional component switched on."""
    return overlay("default", components=COMPONENTS)
