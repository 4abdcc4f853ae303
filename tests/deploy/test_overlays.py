"""The overlays in deploy/overlays: what each changes, and the one place the namespaces live.

The renderer in manifests.py is held to kustomize itself (`kubectl kustomize`, kustomize v5)
first, on every overlay with and without every optional component; the other tests then read
the renderer's output. Server-side apply of each overlay is in test_manifests_kube.py.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import COMPONENTS, DEPLOY, OVERLAYS, build, enable, overlay

TLS_FLAGS = ("--tls-cert=", "--tls-key=", "--tls-ca=")
GPUTOPO = ("aggregator", "scheduler", "exporter")  # the containers running gputopo itself


def _kubectl() -> str:
    found = os.environ.get("GPUTOPO_KUBECTL") or shutil.which("kubectl")
    if not found:
        pytest.fail(
            "kubectl (>= 1.27, with kustomize v5) not found: the overlays are checked against"
            " kustomize itself; install kubectl or point GPUTOPO_KUBECTL at one"
        )
    return found


def _canonical(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(d, sort_keys=True) for d in docs)


@pytest.mark.parametrize("components", [(), COMPONENTS], ids=["as shipped", "every component"])
def test_the_renderer_agrees_with_kustomize(tmp_path: Path, components: tuple[str, ...]) -> None:
    root = tmp_path / "deploy"
    shutil.copytree(DEPLOY, root)
    if components:
        enable(root, components)
    for name in OVERLAYS:
        out = subprocess.run(
            [_kubectl(), "kustomize", str(root / "overlays" / name)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        theirs = [d for d in yaml.safe_load_all(out) if d]
        assert _canonical(build(root / "overlays" / name)) == _canonical(theirs), name


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        c["name"]: c
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _expanded(container: dict[str, Any], namespace: str) -> list[str]:
    """Args as the kubelet expands $(VAR), the downward API's namespace included."""
    env = _env(container) | {"POD_NAMESPACE": namespace}
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def _namespaces_everywhere(node: Any, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "namespace" and isinstance(value, str):
                out.add(value)
            _namespaces_everywhere(value, out)
    elif isinstance(node, list):
        for value in node:
            _namespaces_everywhere(value, out)
    return out


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_namespaces_change_in_one_place(tmp_path: Path, name: str) -> None:
    root = tmp_path / "deploy"
    shutil.copytree(DEPLOY, root)
    enable(root, COMPONENTS)
    settings = root / "overlays" / "default" / "settings.yaml"
    text = settings.read_text(encoding="utf-8")
    text = text.replace("namespace: gputopo-system", "namespace: ml-infra")
    text = text.replace("exporterNamespace: gputopo-exporter", "exporterNamespace: ml-nodes")
    settings.write_text(text, encoding="utf-8")
    docs = build(root / "overlays" / name)
    dumped = json.dumps(docs)
    assert "gputopo-system" not in dumped
    # gputopo-exporter stays the name of objects; never a namespace.
    assert _namespaces_everywhere(docs, set()) == {"ml-infra", "ml-nodes", "cert-manager"}
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"} == {
        "ml-infra",
        "ml-nodes",
    }
    containers = _containers(docs)
    assert _env(containers["exporter"])["GPUTOPO_AGGREGATOR"] == (
        "gputopo-aggregator.ml-infra.svc:50051"
    )
    assert "--exporter-account=ml-nodes:gputopo-exporter" in _expanded(
        containers["aggregator"], "ml-infra"
    )
    assert "--aggregator=gputopo-aggregator.ml-infra.svc:50051" in _expanded(
        containers["scheduler"], "ml-infra"
    )
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    (policy,) = by_kind["NetworkPolicy"]
    selector = policy["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"]
    assert selector == {"kubernetes.io/metadata.name": "ml-nodes"}
    for vap in by_kind["ValidatingAdmissionPolicy"]:
        (condition,) = vap["spec"]["matchConditions"]
        assert '"system:serviceaccount:ml-infra:gputopo-aggregator"' in condition["expression"]
    certs = {c["metadata"]["name"]: c for c in by_kind["Certificate"]}
    assert "gputopo-aggregator.ml-infra.svc" in certs["gputopo-aggregator"]["spec"]["dnsNames"]
    assert "gputopo-exporter.ml-nodes.svc" in certs["gputopo-exporter"]["spec"]["dnsNames"]


def test_no_tls_dev_swaps_only_the_tls_flags_and_keeps_every_other_flag() -> None:
    default = _containers(overlay("default"))
    plain_docs = overlay("no-tls-dev")
    plain = _containers(plain_docs)
    assert set(plain) == set(default) >= set(GPUTOPO)
    for name in GPUTOPO:
        container = default[name]
        kept = [a for a in container["args"] if not a.startswith(TLS_FLAGS)]
        assert len(kept) == len(container["args"]) - 3, name
        assert [a for a in plain[name]["args"] if a != "--insecure"] == kept, name
        assert "--insecure" in plain[name]["args"]
    for doc in plain_docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            (tls,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
            assert tls["secret"]["optional"] is True, doc["metadata"]["name"]


def test_scheduler_objects_adds_one_flag_to_the_aggregator() -> None:
    default = _containers(overlay("default"))
    objects = _containers(overlay("scheduler-objects"))
    assert objects["aggregator"]["args"] == [
        *default["aggregator"]["args"],
        "--scheduler-objects=kueue,kai,volcano",
    ]
    assert objects["scheduler"] == default["scheduler"]


def test_the_central_pods_have_a_budget_and_a_priority() -> None:
    docs = overlay("default")
    classes = {d["metadata"]["name"] for d in docs if d["kind"] == "PriorityClass"}
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]
        assert pod["spec"]["priorityClassName"] in classes, doc["metadata"]["name"]
        (budget,) = [
            b
            for b in budgets
            if b["metadata"]["namespace"] == doc["metadata"]["namespace"]
            and b["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ]
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["maxUnavailable"] < doc["spec"]["replicas"]


def test_the_network_policy_ships_a_cidr_the_server_accepts() -> None:
    docs = overlay("default", components=("optional/networkpolicy",))
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    cidr = policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"]
    settings = yaml.safe_load(
        (DEPLOY / "overlays" / "default" / "settings.yaml").read_text(encoding="utf-8")
    )
    assert cidr == settings["data"]["nodeCIDR"]
    ipaddress.ip_network(cidr)  # raises on a placeholder
    assert "NODE_CIDR" not in json.dumps(docs)


def test_the_exporter_node_label_component_selects_the_label_of_the_settings() -> None:
    default = [d for d in overlay("default") if d["kind"] == "DaemonSet"]
    docs = overlay("default", components=("optional/exporter-node-label",))
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
            ]
        }
    ]
    # As shipped: GFD's label or NFD's, either one.
    (shipped,) = default
    keys = [
        t["matchExpressions"][0]["key"]
        for t in shipped["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
    ]
    assert keys == ["nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"]


def test_no_tls_dev_args_parse_as_plain_text() -> None:
    from gputopo.app.cli import _parser

    plain = _containers(overlay("no-tls-dev"))
    for name in GPUTOPO:
        args = _expanded(plain[name], "gputopo-system")
        parsed = _parser().parse_args(args)
        assert parsed.insecure, name
        assert (parsed.tls_cert, parsed.tls_key, parsed.tls_ca) == (None, None, None), name
