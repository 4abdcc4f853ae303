"""A gang whose pods finish one by one keeps its running pods and its reservation until the last
one ends (found by the simulator's consistency test: the binder used to take the survivors for a
half-recorded gang, delete them and release the reservation while they still ran)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from scheduler.binder import BinderConfig
from tests.aggregator.kubeutil import eventually, install_crds, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.kubeutil import PODGROUPS, binder_cluster, create, gpu_pod, pod_group, pods_of

GANG = {"groups": [{"name": "train", "pods": 2, "gpus_per_pod": 8, "pattern": "all_reduce"}]}


def test_a_gang_finishing_pod_by_pod_keeps_its_running_pods_and_reservation(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("f")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("fin")
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=0.2, resync_s=0.2)

    async def phase(kube: object, pod: str, value: str) -> None:
        await kube.request(  # type: ignore[attr-defined]
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{pod}/status",
            body={"status": {"phase": value}},
            content_type="application/strategic-merge-patch+json",
        )

    async def body() -> None:
        async with binder_cluster(kube_apiserver, nodes, config) as (kube, agg):
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "g", 2, GANG))
            for i in range(2):
                pod = gpu_pod(ns, f"g-{i}", 8, scheduler=name, pod_group="g")
                await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)

            async def bound() -> bool:
                return sum(1 for p in await pods_of(kube, ns) if p["spec"].get("nodeName")) == 2

            await eventually(bound, timeout_s=20, what="the gang bound")
            rid = (await pods_of(kube, ns))[0]["metadata"]["annotations"]["gputopo.io/reservation"]
            for i in range(2):
                await phase(kube, f"g-{i}", "Running")
            await phase(kube, "g-0", "Succeeded")
            await asyncio.sleep(2.0)  # ten binder passes
            names = {p["metadata"]["name"] for p in await pods_of(kube, ns)}
            assert "g-1" in names, "the gang's running pod was deleted"
            assert agg.state.reservation(rid) is not None, "released while a pod still runs"
            await phase(kube, "g-1", "Succeeded")

            async def released() -> bool:
                return agg.state.reservation(rid) is None

            await eventually(released, timeout_s=20, what="the reservation released at the end")

    run(body(), timeout_s=120)
