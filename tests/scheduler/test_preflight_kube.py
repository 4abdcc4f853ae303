"""`gputopo scheduler` on a cluster without its namespace or RBAC says in one line what is
missing and how to fix it, instead of starting and warning every 2 s; with the manifests'
RBAC it starts. Against the real test API server."""

from __future__ import annotations

import asyncio

import pytest

from gputopo.app.cli import main
from gputopo.runtime.kube import KubeClient
from scheduler.preflight import missing
from tests.aggregator.kubeutil import install_rbac
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.test_deploy_kube import NAME, manifests


def _missing(kube: KubeApiServer, namespace: str, *, impersonate: str | None = None) -> str | None:
    async def body() -> str | None:
        client = KubeClient(kube.api_client(impersonate=impersonate))
        try:
            return await missing(client, namespace=namespace, leader_election=True)
        finally:
            client.close()

    return asyncio.run(asyncio.wait_for(body(), timeout=60))


def test_a_missing_namespace_is_named_with_the_fix(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = kube_scope.name("absent")
    argv = ["scheduler", "--kubeconfig", str(kube_apiserver.kubeconfig_path), "--insecure"]
    code = main([*argv, "--aggregator", "127.0.0.1:1", "--namespace", namespace])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    problems = [line for line in err if line.startswith("gputopo scheduler:")]
    assert problems == [
        f"gputopo scheduler: namespace {namespace} does not exist (--namespace): apply the"
        " manifests: kubectl apply --server-side -k deploy/overlays/default"
    ]


def test_missing_rbac_is_named_and_the_manifests_rbac_is_enough(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    nobody = f"system:serviceaccount:{kube_scope.namespace}:nobody"
    problem = _missing(kube_apiserver, kube_scope.namespace, impersonate=nobody)
    assert problem is not None
    assert problem.startswith("RBAC: this account may not list pods cluster-wide")
    assert "deploy/scheduler/rbac.yaml" in problem
    user = install_rbac(kube_scope, kube_apiserver, manifests(), NAME)
    assert _missing(kube_apiserver, kube_scope.namespace, impersonate=user) is None
