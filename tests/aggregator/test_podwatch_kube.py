"""Pods bound by something else, on the real kube-apiserver: their GPUs are not free.

What was seen beside a real kube-scheduler: it bound pods holding GPUs, gputopo still said every
GPU was free and reserved a full node. Here pods are bound the way any scheduler binds them
(`spec.nodeName` set), and the aggregator must take their GPUs out within a watch event, place
elsewhere, and give them back when the pods go.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from aggregator.server import KubeOptions
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementClient
from tests.aggregator.kubeutil import aggregator, create_nodes, eventually, exporters, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope


def _bound_pod(namespace: str, name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


async def _sources(port: int | None, node: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/api/v1/nodes/{node}/sources") as r,
    ):
        assert r.status == 200
        found: dict[str, Any] = await r.json()
        return found


def test_gpus_of_pods_bound_elsewhere_are_not_placed_on(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    busy, idle = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("o")
    )
    namespace = kube_scope.namespace
    eight = request_from_mapping(
        {"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]}
    )

    async def body() -> None:
        await create_nodes(kube_apiserver, [busy.name, idle.name])
        options = KubeOptions(publish_labels=False)
        async with (
            aggregator(kube_apiserver, options=options, http_port=0) as agg,
            exporters(agg, [busy, idle]),
            grpcio.channel(agg.grpc_target) as channel,
        ):
            assert agg.pods is not None
            await agg.pods.synced.wait()
            assert agg.claims is not None

            async def claims_asked() -> bool:
                return agg.claims is not None and agg.claims.served is not None

            await eventually(claims_asked, timeout_s=10, what="the claims API asked about")
            assert agg.claims.served is False  # 1.20 does not serve resource.k8s.io/v1
            with kube_apiserver.json_session() as session:
                for name, gpus in (("train-0", 4), ("train-1", 2)):
                    body = _bound_pod(namespace, name, busy.name, gpus)
                    path = f"/api/v1/namespaces/{namespace}/pods"
                    assert session.request("POST", path, body=body).ok

            async def two_left() -> bool:
                return len(agg.state.free_gpus(busy.name)) == 2

            await eventually(two_left, timeout_s=10, what="6 GPUs of pods bound elsewhere held")
            sources = await _sources(agg.http_port, busy.name)
            assert sources["occupancy"]["held_by_pods"] == 6
            assert [p["key"] for p in sources["occupancy"]["pods"]] == [
                f"{namespace}/train-0",
                f"{namespace}/train-1",
            ]
            client = PlacementClient(channel)
            for _ in range(2):  # the free node, reserved, then nothing: never the busy one
                answer = await client.place(eight, dry_run=False)  # type: ignore[arg-type]
                if answer.result.placed:
                    assert {p.node for p in answer.result.pods} == {idle.name}
            assert not answer.result.placed  # the second 8-GPU request finds no room

            with kube_apiserver.json_session() as session:
                for name in ("train-0", "train-1"):
                    path = f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0"
                    assert session.request("DELETE", path).ok

            async def all_back() -> bool:
                return len(agg.state.free_gpus(busy.name)) == 8

            await eventually(all_back, timeout_s=10, what="the deleted pods' GPUs free again")

    run(body())
