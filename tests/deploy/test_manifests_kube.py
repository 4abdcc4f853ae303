"""Every shipped overlay applied with server-side apply to the real test API server (1.20).

`kubectl apply --server-side -k deploy/overlays/NAME` sends each object as an apply patch; the
server validates it against its schema and defaults. The default overlay is applied with every
optional component switched on (the prometheus-operator and cert-manager CRDs installed from
their upstream files in tests/data/crds), the other two overlays as dry runs over it. Kinds a
1.20 server cannot serve are listed by name and skipped (their CEL is tested in
test_admission_policy.py); PodDisruptionBudgets go as policy/v1beta1, which 1.20 serves with
the same fields (README "Stand-ins"). The exporter's nvidia-runtime variant is applied as a dry
run (same object, other spec).
"""

from __future__ import annotations

import copy
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputopo.app.cli import main
from tests.aggregator.kubeutil import CRDS as CRD_DIR
from tests.deploy.manifests import (
    COMPONENTS,
    DEPLOY,
    KINDS,
    OVERLAYS,
    build,
    every_object,
    overlay,
    render,
    with_component,
)
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

pytestmark = pytest.mark.kube

# Served from 1.30 (admissionregistration.k8s.io/v1): absent from the 1.20 test server. And
# cert-manager's ClusterIssuer CRD, which 1.20 refuses to install: its list-map keys default to
# "" (`default: ""` on imagePullSecrets' name), which 1.20's CRD validation rejects, and
# without which it demands a default for every list-map key (newer servers accept it).
NOT_ON_1_20 = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterIssuer"}
APPLY = "application/apply-patch+yaml"
CRD_FILES = (
    "monitoring.coreos.com_podmonitors.yaml",
    "monitoring.coreos.com_servicemonitors.yaml",
    "cert-manager.io_certificates.yaml",
)


def _path(doc: dict[str, Any]) -> str:
    collection, namespaced = KINDS[doc["kind"]]
    ns = doc["metadata"].get("namespace", "")
    assert ns or not namespaced, f"{doc['kind']} {doc['metadata']['name']}: no namespace"
    return collection.format(ns=ns) + "/" + doc["metadata"]["name"]


def _apply(session: Any, doc: dict[str, Any], *, dry_run: bool = False) -> Any:
    if doc["kind"] == "PodDisruptionBudget":  # the stand-in: 1.20 serves policy/v1beta1
        assert doc["apiVersion"] == "policy/v1"
        doc = {**doc, "apiVersion": "policy/v1beta1"}
    query = "?fieldManager=gputopo-deploy-test&force=true" + ("&dryRun=All" if dry_run else "")
    return session.request("PATCH", _path(doc) + query, body=doc, content_type=APPLY)


def _without_empty_defaults(node: Any) -> Any:
    """The schema without `default: ""`, which controller-gen writes on every object
    reference's `name` since prometheus-operator v0.75 and which the 1.20 server's CRD
    validation refuses ("must be of type string: null"); newer servers accept it. Nothing
    else of the upstream schema is changed."""
    if isinstance(node, dict):
        return {
            k: _without_empty_defaults(v)
            for k, v in node.items()
            if not (k == "default" and v == "")
        }
    if isinstance(node, list):
        return [_without_empty_defaults(v) for v in node]
    return node


def _install_crds(kube: KubeApiServer, scope: KubeScope) -> None:
    """The upstream CRDs of the optional components' kinds, as tests/data/crds holds them."""
    with kube.json_session() as session:
        for name in CRD_FILES:
            crd = _without_empty_defaults(yaml.safe_load((CRD_DIR / name).read_text("utf-8")))
            crd["metadata"].setdefault("labels", {}).update(scope.labels)
            deadline = time.monotonic() + 60
            while True:
                # POST, as kubeutil.install_crds does: 1.20 drops the fields it does not
                # know (selectableFields, 1.30+), where an apply patch would refuse them.
                response = session.request(
                    "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
                )
                if response.status != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert response.ok, (name, str(response.body.get("message"))[-700:])
        for name in CRD_FILES:
            spec = yaml.safe_load((CRD_DIR / name).read_text("utf-8"))["spec"]
            path = f"/apis/{spec['group']}/v1/{spec['names']['plural']}"
            while session.request("GET", path).status != 200:
                assert time.monotonic() < deadline, f"{path} never served"
                time.sleep(0.1)


def test_every_manifest_applies_server_side(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    _install_crds(kube_apiserver, kube_scope)
    docs = [copy.deepcopy(d) for d in every_object()]
    skipped = sorted({d["kind"] for d in docs if d["kind"] in NOT_ON_1_20})
    assert skipped == sorted(NOT_ON_1_20), "the skip list names kinds deploy/ no longer has"
    docs = [d for d in docs if d["kind"] not in NOT_ON_1_20]
    for doc in docs:  # the scope deletes what it labels, cluster-scoped objects included
        doc["metadata"].setdefault("labels", {}).update(kube_scope.labels)
    order = {"Namespace": 0, "CustomResourceDefinition": 0}
    docs.sort(key=lambda d: order.get(d["kind"], 1))
    assert not any(d["kind"] == "ConfigMap" for d in docs), "local-config settings leaked"
    with kube_apiserver.json_session() as session:
        # cert-manager's own namespace, where its ClusterIssuers read their CA (it makes it).
        cert_manager = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "cert-manager", "labels": kube_scope.labels},
        }
        assert _apply(session, cert_manager).ok
        for doc in docs:
            deadline = time.monotonic() + 30
            while True:
                response = _apply(session, doc)
                # 409: a CRD of an earlier test is still being deleted
                if response.status != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert response.ok, (doc["kind"], doc["metadata"]["name"], response.body)
            managers = {m["manager"] for m in response.body["metadata"]["managedFields"]}
            assert "gputopo-deploy-test" in managers
        for doc in docs:
            got = session.request("GET", _path(doc))
            assert got.ok, (doc["kind"], doc["metadata"]["name"])
        # Defaults the server filled in show it read the workloads as we meant them.
        ds = session.request(
            "GET", "/apis/apps/v1/namespaces/gputopo-exporter/daemonsets/gputopo-exporter"
        ).body
        container = ds["spec"]["template"]["spec"]["containers"][0]
        assert container["securityContext"]["privileged"] is True
        assert (
            ds["spec"]["template"]["spec"]["volumes"][-1]["projected"]["sources"][0][
                "serviceAccountToken"
            ]["audience"]
            == "gputopo-aggregator"
        )
        variant = with_component(render("exporter"), DEPLOY / "exporter" / "nvidia-runtime")
        (daemonset,) = [d for d in variant if d["kind"] == "DaemonSet"]
        daemonset["metadata"].setdefault("labels", {}).update(kube_scope.labels)
        response = _apply(session, daemonset, dry_run=True)
        assert response.ok, response.body
        assert response.body["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
        # The other overlays, each as kubectl would send it, over what is there.
        for name in OVERLAYS[1:]:
            for doc in overlay(name, components=COMPONENTS):
                if doc["kind"] in NOT_ON_1_20:
                    continue
                doc["metadata"].setdefault("labels", {}).update(kube_scope.labels)
                response = _apply(session, doc, dry_run=True)
                assert response.ok, (name, doc["kind"], doc["metadata"]["name"], response.body)


def test_the_default_overlay_applies_with_its_namespaces_renamed_in_one_place(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    """settings.yaml alone changed, as an operator would: every object lands in the new
    namespaces and the server accepts them (the bindings' subjects and the exporters' address
    follow, test_overlays.py checks the fields)."""
    system, exporters = kube_scope.name("sys"), kube_scope.name("exp")
    root = tmp_path / "deploy"
    shutil.copytree(DEPLOY, root)
    settings = root / "overlays" / "default" / "settings.yaml"
    text = settings.read_text(encoding="utf-8")
    text = text.replace("namespace: gputopo-system", f"namespace: {system}")
    text = text.replace("exporterNamespace: gputopo-exporter", f"exporterNamespace: {exporters}")
    settings.write_text(text, encoding="utf-8")
    docs = build(root / "overlays" / "default")
    assert {d["metadata"].get("namespace") for d in docs} == {None, system, exporters}
    docs.sort(key=lambda d: 0 if d["kind"] == "Namespace" else 1)
    with kube_apiserver.json_session() as session:
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(kube_scope.labels)
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding", "PriorityClass"):
                continue  # cluster-wide and named as shipped: the other test applies them
            response = _apply(session, doc)
            assert response.ok, (doc["kind"], doc["metadata"]["name"], response.body)
        ds = session.request(
            "GET", f"/apis/apps/v1/namespaces/{exporters}/daemonsets/gputopo-exporter"
        ).body
        env = {
            e["name"]: e.get("value")
            for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["GPUTOPO_AGGREGATOR"] == f"gputopo-aggregator.{system}.svc:50051"
        # The Secrets `gputopo certs` writes for the same namespaces: accepted as kubernetes.io/tls
        # Secrets, one for every secret volume of the rendered workloads.
        out = tmp_path / "pki"
        argv = ["certs", "--out", str(out), "--namespace", system]
        assert main([*argv, "--exporter-namespace", exporters]) == 0
        secrets = [d for d in yaml.safe_load_all((out / "secrets.yaml").read_text()) if d]
        for secret in secrets:
            secret["metadata"]["labels"].update(kube_scope.labels)
            ns, name = secret["metadata"]["namespace"], secret["metadata"]["name"]
            response = session.request(
                "PATCH",
                f"/api/v1/namespaces/{ns}/secrets/{name}?fieldManager=gputopo-deploy-test",
                body=secret,
                content_type=APPLY,
            )
            assert response.ok, (ns, name, response.body)
        mounted = {
            (d["metadata"]["namespace"], v["secret"]["secretName"])
            for d in docs
            if d["kind"] in ("Deployment", "DaemonSet")
            for v in d["spec"]["template"]["spec"]["volumes"]
            if "secret" in v
        }
        assert mounted <= {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in secrets}
