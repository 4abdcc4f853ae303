"""Every object gputopo writes is recorded under the field manager `gputopo`, on a real API server.

The Kubernetes client library names itself `OpenAPI-Generator` unless told otherwise; then
`kubectl get -o yaml --show-managed-fields` cannot tell gputopo's writes from any other script's.
One write of each shape the adapter makes (create, replace, merge patch) is checked here.
"""

from __future__ import annotations

import asyncio

from aggregator.exports import KUEUE_TOPOLOGY
from gputopo.runtime.kube import FIELD_MANAGER, KubeClient, LeaseRecord
from tests.aggregator.kubeutil import install_crds
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope


def _managers(obj: dict[str, object]) -> set[str]:
    entries = obj["metadata"]["managedFields"]  # type: ignore[index]
    return {e["manager"] for e in entries}


def test_objects_gputopo_writes_are_managed_by_gputopo(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, "kueue-topologies.yaml")
    ns = kube_scope.namespace
    topology = {
        "apiVersion": KUEUE_TOPOLOGY.group_version,
        "kind": "Topology",
        "metadata": {"name": kube_scope.name("fm"), "labels": dict(kube_scope.labels)},
        "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fm"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }

    async def body() -> None:
        client = KubeClient(kube_apiserver.api_client())
        try:
            gv, plural = KUEUE_TOPOLOGY.group_version, KUEUE_TOPOLOGY.plural
            created = await client.create_object(gv, plural, topology)
            assert _managers(created) == {FIELD_MANAGER}
            created["metadata"]["labels"]["gputopo.io/x"] = "1"
            replaced = await client.replace_object(gv, plural, created)
            assert _managers(replaced) == {FIELD_MANAGER}
            await client.create_lease(ns, "fm", LeaseRecord(holder="a", duration_s=15))
            lease = await client.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/fm"
            )
            assert _managers(lease) == {FIELD_MANAGER}
            await client.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)
            await client.set_pod_label(ns, "fm", "gputopo.io/role", "leader")
            got = await client.get_pod(ns, "fm")
            assert _managers(got) == {FIELD_MANAGER}
            await client.create_event(got, reason="Test", message="m")
            events = await client.request("GET", f"/api/v1/namespaces/{ns}/events")
            assert [_managers(e) for e in events["items"]] == [{FIELD_MANAGER}]
        finally:
            client.close()

    asyncio.run(asyncio.wait_for(body(), timeout=60))
