"""The deploy/aggregator manifests: valid for the API server, and least privilege that is
enough (the aggregator works as its ServiceAccount) and no more (the rest is refused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.server import LEADER_POD_LABEL, KubeOptions
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.kube import KubeClient, KubeError
from gputopo.runtime.leader import LeaseConfig
from gputopo.runtime.placement_client import PlacementClient
from tests.aggregator.kubeutil import (
    aggregator,
    create_nodes,
    create_pods,
    eventually,
    exporters,
    fast_publisher,
    install_crds,
    install_rbac,
    read_nodes,
    run,
)
from tests.builders import fabric_cluster
from tests.deploy.manifests import overlay
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

DEPLOY = Path(__file__).parent.parent.parent / "deploy" / "aggregator"
NAME = "gputopo-aggregator"
EIGHT = request_from_mapping(
    {"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]}
)


def manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = []
    for resource in kustomization["resources"]:
        docs += [
            d for d in yaml.safe_load_all((DEPLOY / resource).read_text(encoding="utf-8")) if d
        ]
    return docs


def test_the_kustomization_lists_every_manifest_and_the_parts_fit() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    kinds = sorted(d["kind"] for d in manifests())
    assert kinds == sorted(
        [
            "Namespace",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "Service",
            "PriorityClass",
            "PodDisruptionBudget",
        ]
    )
    by_kind = {d["kind"]: d for d in manifests()}
    deployment = by_kind["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == NAME
    args = pod["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args
    assert f"--lease-name={NAME}" in args
    leader_service = next(
        d for d in manifests() if d["kind"] == "Service" and d["metadata"]["name"] == NAME
    )
    assert leader_service["spec"]["selector"][LEADER_POD_LABEL] == "leader"
    lease_rule = next(r for r in by_kind["Role"]["rules"] if r.get("resourceNames"))
    assert lease_rule["resourceNames"] == [NAME]


def test_the_workloads_pass_the_api_servers_validation(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    namespace = kube_scope.namespace
    with kube_apiserver.json_session() as session:
        for doc in manifests():
            if doc["kind"] not in {"Deployment", "Service"}:
                continue
            api = "/apis/apps/v1" if doc["kind"] == "Deployment" else "/api/v1"
            plural = doc["kind"].lower() + "s"
            path = f"{api}/namespaces/{namespace}/{plural}?dryRun=All"
            response = session.request("POST", path, body=doc)
            assert response.ok, (doc["kind"], doc["metadata"]["name"], response.body)


def test_the_aggregator_works_as_its_service_account_and_is_refused_the_rest(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(
        kube_scope,
        "kueue-topologies.yaml",
        "volcano-hypernodes.yaml",
        str(DEPLOY / "crd-gpureservations.yaml"),
    )
    account = install_rbac(kube_scope, kube_apiserver, manifests(), NAME)
    topologies = fabric_cluster(
        spines=1, leaves_per_spine=2, nodes_per_leaf=2, prefix=kube_scope.name("g")
    )
    pod = kube_scope.name("aggregator-0")
    create_pods(kube_apiserver, kube_scope, [pod])
    options = KubeOptions(
        publisher=fast_publisher(),
        scheduler_objects=("kueue", "volcano"),
        lease=LeaseConfig(
            namespace=kube_scope.namespace,
            name=NAME,
            lease_duration_s=3,
            renew_deadline_s=2,
            retry_period_s=0.25,
        ),
        identity=pod,
        pod_name=pod,
        pod_namespace=kube_scope.namespace,
        reservations_namespace=kube_scope.namespace,
    )

    async def body() -> None:
        await create_nodes(kube_apiserver, [t.name for t in topologies])
        async with aggregator(kube_apiserver, options=options, impersonate=account) as agg:
            await eventually(lambda: _true(agg.leading), timeout_s=10, what="the SA can lead")
            async with exporters(agg, topologies):
                assert agg.publisher is not None
                await agg.publisher.wait_idle(30)
                assert agg.publisher.stats.errors == 0
                nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
                assert all(n.labels.get("gputopo.io/gpu-count") == "8" for n in nodes.values())
                writer = agg.scheduler_objects
                assert writer is not None
                await writer.sync()
                assert writer.writes >= 2
                assert writer.missing_crds == set()
                # Promises are kept as GpuReservations: create, patch, list, delete all allowed.
                await eventually(
                    lambda: _true(agg.placement.ready.is_set()), timeout_s=10, what="restored"
                )
                async with grpcio.channel(agg.grpc_target) as channel:
                    client_ = PlacementClient(channel)
                    held = await client_.place(EIGHT)  # type: ignore[arg-type]
                    assert held.reservation is not None
                    await client_.commit(held.reservation.id, owner="binder")
                    await client_.release(held.reservation.id)
            with kube_apiserver.json_session() as session:
                got = session.request(
                    "GET", f"/api/v1/namespaces/{kube_scope.namespace}/pods/{pod}"
                ).body
            assert got["metadata"]["labels"][LEADER_POD_LABEL] == "leader"

        client = KubeClient(kube_apiserver.api_client(impersonate=account))
        try:
            refused = {
                "create a node": client.create_node(kube_scope.name("x"), labels={}),
                "delete a node": client.request("DELETE", f"/api/v1/nodes/{topologies[0].name}"),
                "read secrets": client.request(
                    "GET", f"/api/v1/namespaces/{kube_scope.namespace}/secrets"
                ),
                "another lease": client.get_lease(kube_scope.namespace, "someone-elses"),
                "a lease elsewhere": client.get_lease("default", NAME),
                "delete pods": client.request(
                    "DELETE", f"/api/v1/namespaces/{kube_scope.namespace}/pods/{pod}"
                ),
            }
            for what, call in refused.items():
                with pytest.raises(KubeError) as info:
                    await call
                assert info.value.status == 403, what
        finally:
            client.close()

    run(body())


async def _true(value: bool) -> bool:
    return value


def test_the_network_policy_passes_the_api_servers_validation(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    """The optional component as the default overlay renders it: valid as shipped (its node
    CIDR comes from the overlay's settings), and a bad CIDR is refused."""
    (doc,) = [
        d
        for d in overlay("default", components=("optional/networkpolicy",))
        if d["kind"] == "NetworkPolicy"
    ]
    assert doc["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": NAME}
    del doc["metadata"]["namespace"]
    path = (
        f"/apis/networking.k8s.io/v1/namespaces/{kube_scope.namespace}/networkpolicies?dryRun=All"
    )
    with kube_apiserver.json_session() as session:
        response = session.request("POST", path, body=doc)
        assert response.ok, response.body
        doc["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"] = "not-a-cidr"
        assert not session.request("POST", path, body=doc).ok
