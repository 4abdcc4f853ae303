"""The aggregator's RBAC names the Topology objects it may update and delete: someone else's
Kueue Topology is refused to its ServiceAccount, while its own are not (real API server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gputopo.runtime.kube import KubeClient, KubeError
from tests.aggregator.kubeutil import install_crds, install_rbac, run
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

pytestmark = pytest.mark.kube

DEPLOY = Path(__file__).parent.parent.parent / "deploy" / "aggregator"
TOPOLOGIES = "/apis/kueue.x-k8s.io/v1beta2/topologies"


def _docs(*files: str) -> list[dict[str, Any]]:
    return [
        d
        for name in files
        for d in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8"))
        if d
    ]


def _topology(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]},
    }


def test_only_gputopos_own_topologies_can_be_updated_or_deleted(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, "kueue-topologies.yaml")
    account = install_rbac(
        kube_scope, kube_apiserver, _docs("serviceaccount.yaml", "rbac.yaml"), "gputopo-aggregator"
    )
    theirs = kube_scope.name("their-topology")
    with kube_apiserver.json_session() as session:
        for name in (theirs, "gputopo-fabric"):
            response = session.request("POST", TOPOLOGIES, body=_topology(name))
            assert response.ok or response.status == 409, response.body

    async def body() -> None:
        client = KubeClient(kube_apiserver.api_client(impersonate=account))
        try:
            current = await client.request("GET", f"{TOPOLOGIES}/{theirs}")
            for what, call in {
                "update": client.request("PUT", f"{TOPOLOGIES}/{theirs}", body=current),
                "delete": client.request("DELETE", f"{TOPOLOGIES}/{theirs}"),
            }.items():
                with pytest.raises(KubeError) as info:
                    await call
                assert info.value.status == 403, what
            ours = await client.request("GET", f"{TOPOLOGIES}/gputopo-fabric")
            await client.request("PUT", f"{TOPOLOGIES}/gputopo-fabric", body=ours)
            await client.request("DELETE", f"{TOPOLOGIES}/gputopo-fabric")
        finally:
            client.close()

    run(body())
