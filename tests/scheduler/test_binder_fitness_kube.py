"""The issue's fitness probes on a real API server: with g-01..g-05 unfit and g-06 fit, the
binder binds an 8-GPU pod to g-06, the node a real kube-scheduler 1.20 also finds fit; a pod no
node fits gets `PodScheduled=False` with kube-scheduler's reason and the filters' counts.

g-01 is cordoned; g-02 has a NoSchedule taint the pod does not tolerate; g-03 advertises
`nvidia.com/gpu: 6` (two GPUs unhealthy in the device plugin) though gputopo's exporter sees 8;
g-04 does not match the pod's nodeSelector; g-05 has too little CPU for the pod's request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.server import KubeOptions
from gputopo.runtime.kube import MERGE_PATCH, KubeClient
from scheduler.binder import BinderConfig
from tests.aggregator.kubeutil import aggregator, eventually, exporters, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.extender import Extender, recorded_scheduler
from tests.scheduler.kubeutil import binder, create, events_of, gpu_pod, pods_of, ready_nodes

pytestmark = [pytest.mark.slow]


def _unfit(names: list[str]) -> dict[str, dict[str, Any]]:
    """node -> the merge patches that make it unfit (status first, then the object)."""
    g1, g2, g3, g4, g5, g6 = names
    return {
        g1: {"spec": {"unschedulable": True}},
        g2: {"spec": {"taints": [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}},
        g3: {"status": {"allocatable": {"nvidia.com/gpu": "6"}}},
        g4: {"metadata": {"labels": {"pool": "serve"}}},
        g5: {"status": {"allocatable": {"cpu": "2"}}},
        g6: {},
    }


def _probe(ns: str, name: str, scheduler: str, pool: str = "train") -> dict[str, Any]:
    pod = gpu_pod(ns, name, 8, scheduler=scheduler)
    pod["spec"]["nodeSelector"] = {"pool": pool}
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4", "memory": "8Gi"}
    return pod


def test_the_unfit_nodes_are_skipped_as_kube_scheduler_skips_them(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    topo = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=6, gpus=8, prefix=kube_scope.name("g")
    )
    names = sorted(n.name for n in topo)
    ns = kube_scope.namespace
    name = kube_scope.name("binder")
    reference = kube_scope.name("kube-scheduler")
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=1.0)
    pods_path = f"/api/v1/namespaces/{ns}/pods"

    async def body() -> None:
        await ready_nodes(kube_apiserver, names)
        kube = KubeClient(kube_apiserver.api_client())
        try:
            for node, patch in _unfit(names).items():
                path = f"/api/v1/nodes/{node}"
                labels = {"pool": "train"} | patch.get("metadata", {}).get("labels", {})
                body = {"metadata": {"labels": labels}, "spec": patch.get("spec", {})}
                await kube.request("PATCH", path, body=body, content_type=MERGE_PATCH)
                if "status" in patch:
                    await kube.request(
                        "PATCH", path + "/status", body=patch, content_type=MERGE_PATCH
                    )
            # What a real kube-scheduler finds fit for the same pod (it binds nothing).
            with (
                Extender() as extender,
                recorded_scheduler(kube_apiserver, tmp_path, reference, extender.url),
            ):
                twin = await create(kube, pods_path, _probe(ns, "twin", reference))

                async def judged() -> bool:
                    return twin["metadata"]["uid"] in extender.calls

                await eventually(judged, timeout_s=30, what="kube-scheduler judged the twin")
                assert extender.calls[twin["metadata"]["uid"]] == [names[5]]
                await kube.request("DELETE", f"{pods_path}/twin")

            options = KubeOptions(publish_labels=False)
            async with (
                aggregator(kube_apiserver, options=options) as agg,
                exporters(agg, topo),
                binder(kube, agg, config),
            ):
                await create(kube, pods_path, _probe(ns, "probe", name))

                async def bound() -> bool:
                    pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                    return bool(pods["probe"]["spec"].get("nodeName"))

                await eventually(bound, timeout_s=20, what="the 8-GPU pod bound")
                pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                assert pods["probe"]["spec"]["nodeName"] == names[5]

                # No node fits this one: kube-scheduler's words, and the filters' counts.
                await create(kube, pods_path, _probe(ns, "nowhere", name, pool="nowhere"))

                async def refused() -> dict[str, Any] | None:
                    pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                    for c in (pods["nowhere"].get("status") or {}).get("conditions") or []:
                        if c["type"] == "PodScheduled" and c["status"] == "False":
                            return dict(c)
                    return None

                async def is_refused() -> bool:
                    return await refused() is not None

                await eventually(is_refused, timeout_s=20, what="PodScheduled=False")
                condition = await refused()
                assert condition is not None
                assert condition["reason"] == "Unschedulable"
                message = condition["message"]
                assert "nodes are available: " in message, message
                assert "1 node(s) had taint {dedicated: infer}, that the pod didn't tolerate" in (
                    message
                )
                assert "1 node(s) were unschedulable" in message
                assert "4 node(s) didn't match Pod's node affinity" in message
                assert "NodeUnschedulable: 1, TaintToleration: 1, NodeAffinity: 4" in message
                events = [
                    e
                    for e in await events_of(kube, ns)
                    if e["involvedObject"]["name"] == "nowhere" and e["reason"] == "Unschedulable"
                ]
                assert events, "no Unschedulable event"
                assert "NodeAffinity: 4" in events[0]["message"]
                pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                assert not pods["nowhere"]["spec"].get("nodeName")
        finally:
            kube.close()

    run(body())
