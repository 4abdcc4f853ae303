"""Every object in deploy/ applied with server-side apply to the real test API server (1.20).

`kubectl apply --server-side -k` sends each object as an apply patch; the server validates it
against its schema and defaults. Kinds a 1.20 server cannot serve are listed by name and skipped
(their CEL is tested in test_admission_policy.py). The exporter's nvidia-runtime variant is
applied as a dry run (same object, other spec).
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest

from tests.deploy.manifests import DEPLOY, KINDS, every_object, render, with_component
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

pytestmark = pytest.mark.kube

# Served from 1.30 (admissionregistration.k8s.io/v1): absent from the 1.20 test server.
NOT_ON_1_20 = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
APPLY = "application/apply-patch+yaml"


def _path(doc: dict[str, Any]) -> str:
    collection, namespaced = KINDS[doc["kind"]]
    ns = doc["metadata"].get("namespace", "")
    assert ns or not namespaced, f"{doc['kind']} {doc['metadata']['name']}: no namespace"
    return collection.format(ns=ns) + "/" + doc["metadata"]["name"]


def _apply(session: Any, doc: dict[str, Any], *, dry_run: bool = False) -> Any:
    query = "?fieldManager=gputopo-deploy-test&force=true" + ("&dryRun=All" if dry_run else "")
    return session.request("PATCH", _path(doc) + query, body=doc, content_type=APPLY)


def test_every_manifest_applies_server_side(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    docs = [copy.deepcopy(d) for d in every_object()]
    skipped = sorted({d["kind"] for d in docs if d["kind"] in NOT_ON_1_20})
    assert skipped == sorted(NOT_ON_1_20), "the skip list names kinds deploy/ no longer has"
    docs = [d for d in docs if d["kind"] not in NOT_ON_1_20]
    for doc in docs:  # the scope deletes what it labels, cluster-scoped objects included
        doc["metadata"].setdefault("labels", {}).update(kube_scope.labels)
        if doc["kind"] == "NetworkPolicy":  # the documented placeholder, as an operator fills it
            text = json.dumps(doc).replace("NODE_CIDR", "10.0.0.0/16")
            doc.clear()
            doc.update(json.loads(text))
    order = {"Namespace": 0, "CustomResourceDefinition": 0}
    docs.sort(key=lambda d: order.get(d["kind"], 1))
    with kube_apiserver.json_session() as session:
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
