"""A node a gang was placed on disappears while the gang binds: the binder does not bind onto it,
undoes the gang (its bound pod deleted, reservation released) and binds it whole elsewhere."""

from __future__ import annotations

import contextlib
from pathlib import Path

from gputopo.runtime.kube import ConflictError
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


def test_a_gang_whose_node_vanishes_mid_binding_is_undone_and_bound_whole_elsewhere(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=4, gpus=8, prefix=kube_scope.name("v")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("binder")
    # A pause after each step leaves time to delete a node between two binds.
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, step_pause_s=0.5)
    wanted = {f"t-{i}": gpu_pod(ns, f"t-{i}", 8, scheduler=name, pod_group="t") for i in range(2)}

    async def body() -> None:
        async with binder_cluster(kube_apiserver, nodes, config) as (kube, agg):
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "t", 2))
            for pod in wanted.values():
                await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)

            async def first_bound() -> bool:
                pods = await pods_of(kube, ns)
                return any(p["spec"].get("nodeName") for p in pods)

            # A pod is bound with its record in one write; the pause leaves time between binds.
            await eventually(first_bound, timeout_s=10, what="the first pod bound")
            (first,) = [p for p in await pods_of(kube, ns) if p["spec"].get("nodeName")]
            rid = first["metadata"]["annotations"]["gputopo.io/reservation"]
            held = agg.state.reservation(rid)
            assert held is not None
            assert held.result is not None
            (gone,) = {p.node for p in held.result.pods} - {first["spec"]["nodeName"]}
            await kube.delete_node(gone)

            async def bound_whole() -> bool:
                have = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                for pod_name in set(wanted) - set(have):  # the controller's part
                    with contextlib.suppress(ConflictError):
                        await create(kube, f"/api/v1/namespaces/{ns}/pods", wanted[pod_name])
                nodes_of = [(p["spec"].get("nodeName") or "") for p in have.values()]
                return len(nodes_of) == 2 and all(nodes_of)

            await eventually(bound_whole, timeout_s=30, what="the gang bound whole again")
            pods = await pods_of(kube, ns)
            assert all(p["spec"]["nodeName"] != gone for p in pods)
            reasons = {e["reason"] for e in await events_of(kube, ns)}
            assert "Undone" in reasons

    run(body(), timeout_s=120)
