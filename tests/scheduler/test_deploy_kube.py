"""The deploy/scheduler manifests: valid for the API server, and least privilege that is enough
(the elected scheduler binds a gang as its ServiceAccount) and no more (the rest is refused)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.server import KubeOptions
from gputopo.runtime.kube import KubeClient, KubeError
from gputopo.runtime.leader import LeaseConfig
from scheduler.binder import BinderConfig
from scheduler.server import SchedulerProcess, SchedulerProcessConfig
from tests.aggregator.kubeutil import (
    aggregator,
    eventually,
    exporters,
    install_crds,
    install_rbac,
    run,
)
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.kubeutil import (
    PODGROUPS,
    create,
    events_of,
    gpu_pod,
    pod_group,
    pods_of,
    ready_nodes,
)

DEPLOY = Path(__file__).parent.parent.parent / "deploy" / "scheduler"
NAME = "gputopo-scheduler"


def manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = []
    for resource in kustomization["resources"]:
        text = (DEPLOY / resource).read_text(encoding="utf-8")
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def test_the_kustomization_lists_every_manifest_and_the_deployment_follows_the_conventions() -> (
    None
):
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    assert set(kustomization["resources"]) == {p.name for p in DEPLOY.glob("*.yaml")} - {
        "kustomization.yaml"
    }
    assert kustomization["namespace"] == "gputopo-system"
    (deployment,) = [d for d in manifests() if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/gputopo/gputopo:0.1.0"
    # The aggregator's Service in the scheduler's own namespace (the kubelet expands it).
    assert "--aggregator=gputopo-aggregator.$(POD_NAMESPACE).svc:50051" in container["args"]
    assert {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]
    assert "--lease-name=gputopo-scheduler" in container["args"]


def test_the_deployment_passes_the_api_servers_validation(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    with kube_apiserver.json_session() as session:
        (doc,) = [d for d in manifests() if d["kind"] == "Deployment"]
        path = f"/apis/apps/v1/namespaces/{kube_scope.namespace}/deployments?dryRun=All"
        response = session.request("POST", path, body=doc)
        assert response.ok, response.body


@pytest.mark.slow
def test_the_elected_scheduler_binds_as_its_service_account_and_is_refused_the_rest(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    user = install_rbac(kube_scope, kube_apiserver, manifests(), NAME)
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=3, gpus=8, prefix=kube_scope.name("d")
    )
    ns = kube_scope.namespace
    sched = kube_scope.name("sa")
    lease = LeaseConfig(
        namespace=ns, name=NAME, lease_duration_s=4.0, renew_deadline_s=3.0, retry_period_s=0.5
    )

    async def body() -> None:
        await ready_nodes(kube_apiserver, [n.name for n in nodes])
        admin = KubeClient(kube_apiserver.api_client())
        as_sa = KubeClient(kube_apiserver.api_client(impersonate=user))
        try:
            options = KubeOptions(publish_labels=False)
            async with aggregator(kube_apiserver, options=options) as agg, exporters(agg, nodes):
                config = SchedulerProcessConfig(
                    aggregator=agg.grpc_target,
                    binder=BinderConfig(scheduler_name=sched, undo_grace_s=0),
                    lease=lease,
                    identity="replica-0",
                )
                process = SchedulerProcess(config, as_sa)
                task = asyncio.create_task(process.run())
                try:
                    await create(admin, PODGROUPS.format(ns=ns), pod_group(ns, "t", 2))
                    for i in range(2):
                        pod = gpu_pod(ns, f"t-{i}", 8, scheduler=sched, pod_group="t")
                        await create(admin, f"/api/v1/namespaces/{ns}/pods", pod)

                    async def bound() -> bool:
                        pods = await pods_of(admin, ns)
                        return len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)

                    await eventually(bound, timeout_s=30, what="the gang bound by the SA")

                    async def told() -> bool:  # the binder writes its Event after the Binding
                        events = await events_of(admin, ns)
                        return "Scheduled" in {e["reason"] for e in events}  # events: create

                    await eventually(told, timeout_s=30, what="the Scheduled Event by the SA")
                    holder = await admin.get_lease(ns, NAME)
                    assert holder is not None
                    assert holder.holder == "replica-0"
                    refused = {
                        "secrets": as_sa.request("GET", f"/api/v1/namespaces/{ns}/secrets"),
                        "create a node": as_sa.create_node(kube_scope.name("x"), labels={}),
                        "another lease": as_sa.get_lease(ns, "someone-elses"),
                        "patch a node": as_sa.request(
                            "PATCH",
                            f"/api/v1/nodes/{nodes[0].name}",
                            body={"metadata": {"labels": {"a": "b"}}},
                            content_type="application/merge-patch+json",
                        ),
                    }
                    for what, call in refused.items():
                        with pytest.raises(KubeError) as err:
                            await call
                        assert err.value.status == 403, what
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            admin.close()
            as_sa.close()

    run(body(), timeout_s=120)
