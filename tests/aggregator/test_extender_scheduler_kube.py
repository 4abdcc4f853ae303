"""Beside a real kube-scheduler: a gang placed through gputopo binds on GPUs no one else holds.

The failure this guards against, as it was seen: kube-scheduler bound pods holding GPUs,
gputopo still counted every GPU free, reserved a node that was already full, and one pod of a
4-pod job stayed Pending for good. Here one kube-scheduler (no extender) binds filler pods over
part of the cluster; then a 4 x 8-GPU job is placed with a reservation through gputopo's
Placement API and its pods are bound by a second kube-scheduler that uses gputopo as its
extender (configured as the README says). All 4 must bind, each on the node gputopo reserved,
and no node may end up with more GPUs asked than it has.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aggregator.server import KubeOptions
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.kube import MERGE_PATCH, KubeClient
from gputopo.runtime.placement_client import PlacementClient
from tests.aggregator.kubeutil import aggregator, create_nodes, eventually, exporters, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scheduler import KubeScheduler
from tests.harness.kube_scope import KubeScope

GANG = request_from_mapping(
    {
        "job": "train",
        "groups": [
            {"name": "train", "pods": 4, "gpus_per_pod": 8, "pattern": "all_reduce"},
        ],
    }
)


def _pod(
    namespace: str, name: str, gpus: int, *, scheduler: str, annotations: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


async def _give_capacity(kube: KubeClient, node: str, gpus: int) -> None:
    """What a kubelet with NVIDIA's device plugin reports: allocatable GPUs, and Ready."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    status = {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    }
    await kube.request(
        "PATCH", f"/api/v1/nodes/{node}/status", body={"status": status}, content_type=MERGE_PATCH
    )
    # The API server taints a new Node not-ready; the node lifecycle controller (not run here)
    # lifts that once its kubelet reports Ready.
    await kube.request(
        "PATCH", f"/api/v1/nodes/{node}", body={"spec": {"taints": None}}, content_type=MERGE_PATCH
    )


def test_a_4x8_job_binds_whole_beside_pods_kube_scheduler_bound_alone(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=2, nodes_per_leaf=5, gpus=8, prefix=kube_scope.name("s")
    )
    namespace = kube_scope.namespace
    plain, extended = kube_scope.name("plain"), kube_scope.name("gputopo")

    async def body() -> None:
        await create_nodes(kube_apiserver, [n.name for n in nodes])
        kube = KubeClient(kube_apiserver.api_client())
        try:
            await asyncio.gather(*(_give_capacity(kube, n.name, 8) for n in nodes))
            options = KubeOptions(publish_labels=False)
            async with (
                aggregator(kube_apiserver, options=options, http_port=0) as agg,
                exporters(agg, nodes),
            ):
                assert agg.pods is not None
                await agg.pods.synced.wait()
                fillers = {f"fill-8-{i}": 8 for i in range(2)} | {
                    f"fill-4-{i}": 4 for i in range(3)
                }
                with KubeScheduler(kube_apiserver, tmp_path, name=plain):
                    for name, gpus in fillers.items():
                        await kube.request(
                            "POST",
                            f"/api/v1/namespaces/{namespace}/pods",
                            body=_pod(namespace, name, gpus, scheduler=plain, annotations={}),
                        )

                    async def fillers_bound() -> bool:
                        nodes_of = [await _node_of(kube, namespace, name) for name in fillers]
                        return all(nodes_of)

                    await eventually(fillers_bound, timeout_s=30, what="fillers bound")

                held = sum(fillers.values())

                async def aggregator_sees_them() -> bool:
                    free = sum(len(agg.state.free_gpus(n.name)) for n in nodes)
                    return free == 8 * len(nodes) - held

                await eventually(aggregator_sees_them, timeout_s=10, what="the fillers counted")

                async with grpcio.channel(agg.grpc_target) as channel:
                    answer = await PlacementClient(channel).place(GANG)  # type: ignore[arg-type]
                assert answer.result.placed, answer.result.reason
                assert answer.reservation is not None
                reserved = {p.pod: p.node for p in answer.result.pods}
                url = f"http://127.0.0.1:{agg.http_port}/scheduler"
                with KubeScheduler(kube_apiserver, tmp_path, name=extended, extender_url=url):
                    for i in range(4):
                        annotations = {
                            "gputopo.io/reservation": answer.reservation.id,
                            "gputopo.io/group": "train",
                            "gputopo.io/replica": "0",
                            "gputopo.io/pod": str(i),
                        }
                        await kube.request(
                            "POST",
                            f"/api/v1/namespaces/{namespace}/pods",
                            body=_pod(
                                namespace,
                                f"train-{i}",
                                8,
                                scheduler=extended,
                                annotations=annotations,
                            ),
                        )

                    async def all_bound() -> bool:
                        return all(
                            [await _node_of(kube, namespace, f"train-{i}") for i in range(4)]
                        )

                    await eventually(all_bound, timeout_s=30, what="all 4 pods of the job bound")
                bound = {i: await _node_of(kube, namespace, f"train-{i}") for i in range(4)}
                assert bound == reserved  # each pod on the node gputopo chose for it
                asked: dict[str, int] = {}
                pods = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
                for pod in pods["items"]:
                    node = pod["spec"].get("nodeName")
                    limits = pod["spec"]["containers"][0]["resources"]["limits"]
                    asked[node] = asked.get(node, 0) + int(limits["nvidia.com/gpu"])
                assert max(asked.values()) <= 8  # no GPU asked twice
        finally:
            kube.close()

    run(body(), timeout_s=180)


async def _node_of(kube: KubeClient, namespace: str, name: str) -> str:
    pod = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return str(pod["spec"].get("nodeName") or "")
