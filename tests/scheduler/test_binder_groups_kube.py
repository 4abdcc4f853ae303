"""Group semantics users rely on, on the real API server: an elastic coscheduling group binds
every pod beyond its `minMember`; a member of a bound, Running gang that is deleted leaves the
others Running and its replacement takes its place; the gang's GpuReservation object lives as
long as the gang does and goes with its last pod; the PodGroup's status says where it is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aggregator.server import KubeOptions
from gputopo.runtime.kube import KubeClient
from scheduler.binder import BinderConfig
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
    set_phase,
)

RESERVATIONS_CRD = str(
    Path(__file__).parent.parent.parent / "deploy" / "aggregator" / "crd-gpureservations.yaml"
)


async def _reservations(kube: KubeClient, ns: str) -> dict[str, dict[str, Any]]:
    page = await kube.request("GET", f"/apis/gputopo.io/v1alpha1/namespaces/{ns}/gpureservations")
    return {o["metadata"]["name"]: o for o in page.get("items") or []}


async def _group_status(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    obj = await kube.request("GET", f"{PODGROUPS.format(ns=ns)}/{name}")
    return dict(obj.get("status") or {})


def _by_name(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods}


def test_elastic_groups_bind_all_and_a_running_gang_survives_losing_a_member(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml", RESERVATIONS_CRD)
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=2, nodes_per_leaf=3, gpus=8, prefix=kube_scope.name("e")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("binder")
    # Passes every 0.5 s: the waits below span several passes in which a wrong undo or release
    # would strike.
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=1.0, resync_s=0.5)
    options = KubeOptions(publish_labels=False, reservations_namespace=ns)
    pods_path = f"/api/v1/namespaces/{ns}/pods"

    async def body() -> None:
        async with binder_cluster(kube_apiserver, nodes, config, options=options) as (kube, _):
            # 1. Elastic: minMember 2, three pods. All three bind, the third as it comes.
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "elastic", 2))
            for i in range(3):
                await create(
                    kube, pods_path, gpu_pod(ns, f"el-{i}", 4, scheduler=name, pod_group="elastic")
                )

            async def three_bound() -> bool:
                pods = [
                    p for p in await pods_of(kube, ns) if p["metadata"]["name"].startswith("el-")
                ]
                return sum(1 for p in pods if p["spec"].get("nodeName")) == 3

            await eventually(
                three_bound, timeout_s=15, what="all 3 pods of a minMember-2 group bound"
            )

            async def phase_is(group: str, phase: str) -> bool:
                return (await _group_status(kube, ns, group)).get("phase") == phase

            await eventually(
                lambda: phase_is("elastic", "Scheduling"), timeout_s=10, what="phase Scheduling"
            )
            for i in range(3):
                await set_phase(kube, ns, f"el-{i}", "Running")

            async def all_running() -> bool:
                status = await _group_status(kube, ns, "elastic")
                return (status.get("phase"), status.get("running")) == ("Running", 3)

            await eventually(all_running, timeout_s=10, what="phase Running, 3 running")
            assert (await _group_status(kube, ns, "elastic"))["scheduleStartTime"]

            # 2. A 3x8 gang binds whole; its pods run.
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "train", 3))
            for i in range(3):
                await create(
                    kube, pods_path, gpu_pod(ns, f"train-{i}", 8, scheduler=name, pod_group="train")
                )

            async def gang_bound() -> bool:
                pods = _by_name(await pods_of(kube, ns))
                return all(
                    pods.get(f"train-{i}", {}).get("spec", {}).get("nodeName") for i in range(3)
                )

            await eventually(gang_bound, timeout_s=15, what="the 3x8 gang bound")
            for i in range(3):
                await set_phase(kube, ns, f"train-{i}", "Running")
            before = _by_name(await pods_of(kube, ns))
            rid = before["train-0"]["metadata"]["annotations"]["gputopo.io/reservation"]
            # The committed reservation outlives Commit (it was dropped ~30 ms after it).
            await asyncio.sleep(3 * config.resync_s)
            stored = await _reservations(kube, ns)
            assert rid in stored, sorted(stored)

            # 3. One member is deleted (an eviction): the two others stay bound and Running.
            gone = before["train-1"]
            await kube.delete_pod(ns, "train-1", grace_s=0)
            await asyncio.sleep(3 * config.resync_s)  # passes in which an undo would strike
            after = _by_name(await pods_of(kube, ns))
            for kept in ("train-0", "train-2"):
                assert kept in after, f"{kept} was deleted"
                assert after[kept]["metadata"]["uid"] == before[kept]["metadata"]["uid"]
                assert not after[kept]["metadata"].get("deletionTimestamp")
                assert after[kept]["spec"]["nodeName"] == before[kept]["spec"]["nodeName"]
            assert rid in await _reservations(kube, ns)
            undone = [e for e in await events_of(kube, ns) if e["reason"] == "Undone"]
            assert undone == []

            # 4. Its controller's replacement takes the departed member's place: same node,
            # same GPUs, same reservation.
            replacement = gpu_pod(ns, "train-1x", 8, scheduler=name, pod_group="train")
            await create(kube, pods_path, replacement)

            async def replaced() -> bool:
                pod = _by_name(await pods_of(kube, ns)).get("train-1x")
                return bool(pod and pod["spec"].get("nodeName"))

            await eventually(replaced, timeout_s=15, what="the replacement bound")
            new = _by_name(await pods_of(kube, ns))["train-1x"]
            old_ann, new_ann = gone["metadata"]["annotations"], new["metadata"]["annotations"]
            assert new["spec"]["nodeName"] == gone["spec"]["nodeName"]
            assert new_ann["gputopo.io/gpus"] == old_ann["gputopo.io/gpus"]
            assert new_ann["gputopo.io/reservation"] == rid

            # 5. The gang ends pod by pod: the reservation stays until the last one is gone.
            for i, pod in enumerate(("train-0", "train-2", "train-1x")):
                await kube.delete_pod(ns, pod, grace_s=0)
                if i < 2:
                    await asyncio.sleep(2 * config.resync_s)
                    assert rid in await _reservations(kube, ns), f"released after {pod} only"

            async def released() -> bool:
                return rid not in await _reservations(kube, ns)

            await eventually(released, timeout_s=15, what="the reservation released at the end")

    run(body(), timeout_s=150)
