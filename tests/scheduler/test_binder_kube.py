"""The gang binder on a real API server: a 4 x 8-GPU gang binds whole and fast, on the nodes
gputopo chose, with its GPU indices recorded; a gang that cannot fit binds nothing and says why;
a bad `gputopo.io/request` is named by field and binds nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from scheduler.binder import BinderConfig
from tests.aggregator.kubeutil import (
    eventually,
    install_crds,
    run,
)
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.kubeutil import (
    PODGROUPS,
    binder_cluster,
    create,
    events_of,
    gpu_pod,
    pod_group,
    pods_of,
)

TRAIN = {"groups": [{"name": "train", "pods": 4, "gpus_per_pod": 8, "pattern": "all_reduce"}]}


def _gpus_by_node(pods: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            gpus = pod["metadata"]["annotations"]["gputopo.io/gpus"].split(",")
            out.setdefault(node, []).extend(int(g) for g in gpus)
    return out


def test_a_4x8_gang_binds_whole_where_gputopo_chose_and_an_unfit_one_binds_nothing(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=2, nodes_per_leaf=3, gpus=8, prefix=kube_scope.name("b")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("binder")
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=1.0)

    async def body() -> None:
        async with binder_cluster(kube_apiserver, nodes, config) as (kube, agg):
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "train", 4, TRAIN))
            for i in range(4):
                pod = gpu_pod(ns, f"train-{i}", 8, scheduler=name, pod_group="train")
                await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)
            fourth = time.monotonic()

            async def all_bound() -> bool:
                pods = await pods_of(kube, ns)
                return sum(1 for p in pods if p["spec"].get("nodeName")) == 4

            await eventually(all_bound, timeout_s=10, what="the 4x8 gang bound")
            took = time.monotonic() - fourth
            print(f"4x8 gang bound {took:.2f}s after its 4th pod was created")
            assert took < 10
            pods = await pods_of(kube, ns)
            for pod in pods:
                ann = pod["metadata"]["annotations"]
                assert pod["spec"]["nodeName"] == ann["gputopo.io/node"]
                assert len(ann["gputopo.io/gpus"].split(",")) == 8
                uuids = ann["gputopo.io/gpu-uuids"].split(",")
                assert len(set(uuids)) == 8
                assert all(u.startswith("GPU-") for u in uuids)
                assert ann["gputopo.io/reservation"]
            used = _gpus_by_node(pods)
            assert len(used) == 4  # 8 GPUs a pod on 8-GPU nodes: one pod a node
            for gpus in used.values():
                assert sorted(gpus) == list(range(8))  # no GPU shared across pods
            # The reservation is committed: the aggregator holds those 32 GPUs for good.
            free = sum(len(agg.state.free_gpus(n.name)) for n in nodes)
            assert free == 8 * len(nodes) - 32

            # A gang of 4 x 8 more cannot fit on the 2 free nodes: nothing binds, it says why.
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "big", 4, None))
            for i in range(4):
                pod = gpu_pod(ns, f"big-{i}", 8, scheduler=name, pod_group="big")
                await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)

            async def rejected() -> bool:
                pods = [p for p in await pods_of(kube, ns) if p["metadata"]["name"][:4] == "big-"]
                conditions = [
                    c
                    for p in pods
                    for c in (p.get("status") or {}).get("conditions") or []
                    if c["type"] == "PodScheduled" and c["status"] == "False"
                ]
                return len(conditions) == 4

            await eventually(rejected, timeout_s=15, what="PodScheduled=False on the big gang")
            pods = await pods_of(kube, ns)
            big = [p for p in pods if p["metadata"]["name"].startswith("big-")]
            assert not any(p["spec"].get("nodeName") for p in big)
            for pod in big:
                (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
                assert cond["reason"] == "Unschedulable"
                # Typed from the rejection codes (32 GPUs asked of 16 free: capacity, which a
                # departure can cure), and the code itself is named.
                assert "not bound (Unschedulable): " in cond["message"], cond["message"]
                assert "insufficient_gpus" in cond["message"], cond["message"]
            events = await events_of(kube, ns)
            reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
            assert all((f"big-{i}", "Unschedulable") in reasons for i in range(4))
            assert all((f"train-{i}", "Scheduled") in reasons for i in range(4))

            # A bad request is named by field in an Event, and nothing binds.
            bad = {"groups": [{"name": "x", "pods": 0, "gpus_per_pod": 8}]}
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "bad", 1, bad))
            pod = gpu_pod(ns, "bad-0", 8, scheduler=name, pod_group="bad")
            await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)

            async def named() -> bool:
                for e in await events_of(kube, ns):
                    if e["involvedObject"]["name"] == "bad-0" and e["reason"] == "InvalidRequest":
                        return "gputopo.io/request: groups[0].pods" in e["message"]
                return False

            await eventually(named, timeout_s=10, what="an InvalidRequest event naming the field")
            await asyncio.sleep(0.5)
            (bad_pod,) = [p for p in await pods_of(kube, ns) if p["metadata"]["name"] == "bad-0"]
            assert not bad_pod["spec"].get("nodeName")

            # The gang ends (its pods deleted): its committed reservation is released.
            for i in range(4):
                await kube.delete_pod(ns, f"train-{i}", grace_s=0)

            async def released() -> bool:
                return sum(len(agg.state.free_gpus(n.name)) for n in nodes) == 8 * len(nodes)

            await eventually(released, timeout_s=10, what="the ended gang's GPUs released")

            # A pod in no group is a gang of one.
            lone = gpu_pod(ns, "lone", 4, scheduler=name)
            await create(kube, f"/api/v1/namespaces/{ns}/pods", lone)

            async def lone_bound() -> bool:
                for p in await pods_of(kube, ns):
                    if p["metadata"]["name"] == "lone" and p["spec"].get("nodeName"):
                        return len(p["metadata"]["annotations"]["gputopo.io/gpus"].split(",")) == 4
                return False

            await eventually(lone_bound, timeout_s=10, what="the lone pod bound")

    run(body(), timeout_s=180)
