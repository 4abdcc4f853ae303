"""Helpers for the gang binder's tests against the real test API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from aggregator.server import Aggregator, KubeOptions
from gputopo.runtime import grpcio
from gputopo.runtime.kube import MERGE_PATCH, KubeClient
from gputopo.runtime.placement_client import PlacementClient
from gputopo.topology import NodeTopology
from scheduler.binder import Binder, BinderConfig
from scheduler.groups import COSCHEDULING_LABEL, GROUP_LABEL
from tests.aggregator.kubeutil import aggregator, create_nodes, exporters
from tests.harness.kube import KubeApiServer

PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"


def gpu_pod(
    namespace: str,
    name: str,
    gpus: int,
    *,
    scheduler: str,
    pod_group: str = "",
    group: str = "",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod asking `gpus` nvidia.com/gpu, named for `scheduler`."""
    labels = {}
    if pod_group:
        labels[COSCHEDULING_LABEL] = pod_group
    if group:
        labels[GROUP_LABEL] = group
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def pod_group(
    namespace: str, name: str, min_member: int, request: Mapping[str, Any] | str | None = None
) -> dict[str, Any]:
    """A coscheduling PodGroup, with a `gputopo.io/request` annotation when given."""
    annotations = {}
    if request is not None:
        text = request if isinstance(request, str) else json.dumps(request)
        annotations["gputopo.io/request"] = text
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"minMember": min_member},
    }


async def create(kube: KubeClient, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = await kube.request("POST", path, body=dict(body))
    return result


async def pods_of(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    page = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    return list(page.get("items") or [])


async def set_phase(kube: KubeClient, namespace: str, name: str, phase: str) -> None:
    """Set a pod's `status.phase`, as its kubelet would (no kubelet runs in these tests)."""
    await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        body={"status": {"phase": phase}},
        content_type=MERGE_PATCH,
    )


async def events_of(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    page = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
    return list(page.get("items") or [])


async def ready_nodes(
    kube_apiserver: KubeApiServer, names: Iterable[str], *, gpus: int = 8
) -> None:
    """Node objects as a kubelet with NVIDIA's device plugin reports them: Ready, allocatable
    CPU, memory, pods and `gpus` nvidia.com/gpu, and without the not-ready taint the API server
    puts on a new Node (no node lifecycle controller runs here to lift it). The binder judges
    node fitness as kube-scheduler does, so a bare Node object fits no pod."""
    names = list(names)
    await create_nodes(kube_apiserver, names)
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    status = {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    }
    kube = KubeClient(kube_apiserver.api_client(), workers=8)

    async def ready(name: str) -> None:
        path = f"/api/v1/nodes/{name}"
        await kube.request(
            "PATCH", path + "/status", body={"status": status}, content_type=MERGE_PATCH
        )
        await kube.request("PATCH", path, body={"spec": {"taints": None}}, content_type=MERGE_PATCH)

    try:
        await asyncio.gather(*(ready(n) for n in names))
    finally:
        kube.close()


@contextlib.asynccontextmanager
async def binder(
    kube_client: KubeClient, agg: Aggregator, config: BinderConfig
) -> AsyncIterator[Binder]:
    """A Binder in this loop, talking to the aggregator over loopback gRPC."""
    async with grpcio.channel(agg.grpc_target) as channel:
        b = Binder(kube_client, PlacementClient(channel), config)
        task = asyncio.create_task(b.run())
        try:
            await asyncio.wait_for(b.pods.synced.wait(), timeout=30)
            yield b
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def binder_stack(
    kube_apiserver: KubeApiServer,
    nodes: Iterable[NodeTopology],
    config: BinderConfig,
    *,
    options: KubeOptions | None = None,
) -> AsyncIterator[tuple[KubeClient, Aggregator, Binder]]:
    """Node objects for `nodes`, an aggregator with their simulated exporters, and a binder
    with `config`, all on the real API server; yields a client, the aggregator and the binder."""
    nodes = list(nodes)
    await ready_nodes(kube_apiserver, [n.name for n in nodes])
    kube = KubeClient(kube_apiserver.api_client())
    try:
        async with (
            aggregator(kube_apiserver, options=options or KubeOptions(publish_labels=False)) as agg,
            exporters(agg, nodes),
            binder(kube, agg, config) as running,
        ):
            yield kube, agg, running
    finally:
        kube.close()


@contextlib.asynccontextmanager
async def binder_cluster(
    kube_apiserver: KubeApiServer,
    nodes: Iterable[NodeTopology],
    config: BinderConfig,
    *,
    options: KubeOptions | None = None,
) -> AsyncIterator[tuple[KubeClient, Aggregator]]:
    """`binder_stack` for tests that need only a client and the aggregator."""
    async with binder_stack(kube_apiserver, nodes, config, options=options) as (kube, agg, _):
        yield kube, agg
