"""Malformed group inputs on the real API server: each group carrying one of the values the
fuzzer refuses (`test_group_inputs_fuzz.MALFORMED`) gets an Event naming the field, and the
binder goes on binding a good gang created after them."""

from __future__ import annotations

from typing import Any

from scheduler.binder import BinderConfig
from scheduler.groups import SIZE_ANNOTATION
from tests.aggregator.kubeutil import eventually, install_crds, run
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
from tests.scheduler.test_group_inputs_fuzz import MALFORMED


def test_malformed_groups_are_refused_by_field_and_the_binder_binds_the_others(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("m")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("binder")
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=1.0)
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    want: dict[str, str] = {}  # pod -> the field its Event must name

    async def body() -> None:
        async with binder_cluster(kube_apiserver, nodes, config) as (kube, _agg):
            for i, text in enumerate(MALFORMED["gputopo.io/request"]):
                await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, f"req-{i}", 1, text))
                pod = gpu_pod(ns, f"req-{i}-0", 1, scheduler=name, pod_group=f"req-{i}")
                await create(kube, pods_path, pod)
                want[f"req-{i}-0"] = "gputopo.io/request"
            for i, value in enumerate(MALFORMED[SIZE_ANNOTATION]):
                # A record forged (or damaged) by hand: the binder must not trust its size.
                forged = {"gputopo.io/reservation": "forged", SIZE_ANNOTATION: value}
                pod = gpu_pod(ns, f"size-{i}", 1, scheduler=name, annotations=forged)
                await create(kube, pods_path, pod)
                want[f"size-{i}"] = f"metadata.annotations[{SIZE_ANNOTATION}]"
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "good", 2))
            for i in range(2):
                await create(
                    kube, pods_path, gpu_pod(ns, f"good-{i}", 4, scheduler=name, pod_group="good")
                )

            async def refused_and_bound() -> bool:
                said: dict[str, str] = {}
                for e in await events_of(kube, ns):
                    if e["reason"] == "InvalidRequest":
                        said[e["involvedObject"]["name"]] = e["message"]
                if any(want[p] not in said.get(p, "") for p in want):
                    return False
                pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                return all(pods[f"good-{i}"]["spec"].get("nodeName") for i in range(2))

            await eventually(refused_and_bound, timeout_s=30, what="refusals and the good gang")
            pods: dict[str, dict[str, Any]] = {
                p["metadata"]["name"]: p for p in await pods_of(kube, ns)
            }
            assert not any(pods[p]["spec"].get("nodeName") for p in want)
            for p in want:
                (cond,) = [
                    c for c in pods[p]["status"]["conditions"] if c["type"] == "PodScheduled"
                ]
                assert cond["status"] == "False"
                assert "(UnschedulableAndUnresolvable)" in cond["message"], cond["message"]

    run(body(), timeout_s=90)
