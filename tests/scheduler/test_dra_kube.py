"""DRA through a real API server: the binder allocates a claim, the aggregator counts it held.

The 1.20 test server cannot serve `resource.k8s.io/v1`: the CRDs generated from the upstream
types (scripts/gen-dra-crds.py) stand in, so writes are checked against that schema, not the
native validation. The recorded slice numbers its devices by minor (`gpu-<minor>`), and the
minors run backwards against the NVML indices, as on machines where they differ.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aggregator.claimwatch import ClaimWatcher
from aggregator.state import ClusterState
from gputopo.machines import load_machine
from gputopo.runtime.kube import KubeClient
from scheduler.dra import DRA_API, allocate_recorded
from tests.aggregator.kubeutil import eventually, install_crds, install_rbac, run
from tests.deploy.manifests import render
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

CRDS = ("dra-resourceslices.yaml", "dra-resourceclaims.yaml")


def rbac(component: str) -> list[dict[str, Any]]:
    """A component's manifests without their namespace (install_rbac puts them in the test's)."""
    return [
        {**d, "metadata": {k: v for k, v in d["metadata"].items() if k != "namespace"}}
        for d in render(component)
    ]


def resource_slice(name: str, node: str, uuids: list[str]) -> dict[str, Any]:
    """What NVIDIA's DRA driver publishes for a node: one device per GPU, named by minor."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{len(uuids) - 1 - index}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": uuid},
                        "index": {"int": index},
                        "minor": {"int": len(uuids) - 1 - index},
                    },
                }
                for index, uuid in enumerate(uuids)
            ],
        },
    }


def test_the_binder_allocates_the_chosen_gpus_and_the_aggregator_holds_them(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, *CRDS)
    # Each side runs as its deployed ServiceAccount, with its deployed RBAC.
    binder_user = install_rbac(kube_scope, kube_apiserver, rbac("scheduler"), "gputopo-scheduler")
    aggregator_user = install_rbac(
        kube_scope, kube_apiserver, rbac("aggregator"), "gputopo-aggregator"
    )
    node = kube_scope.name("h100")
    topology = load_machine("dgx-h100", node_name=node)
    uuids = [g.uuid for g in topology.gpus]
    chosen = [5, 4]  # rank order, as the binder recorded them
    ns = kube_scope.namespace

    async def body() -> None:
        kube = KubeClient(kube_apiserver.api_client())
        as_binder = KubeClient(kube_apiserver.api_client(impersonate=binder_user))
        as_aggregator = KubeClient(kube_apiserver.api_client(impersonate=aggregator_user))
        state = ClusterState(clock=lambda: 1000.0)
        state.add_static(topology)
        watcher = ClaimWatcher(state, as_aggregator)
        watching = asyncio.create_task(watcher.run())
        try:
            await kube.request(
                "POST",
                f"{DRA_API}/resourceslices",
                body=resource_slice(kube_scope.name("slice"), node, uuids),
            )
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "train-0-gpus", "namespace": ns},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpus",
                                "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2},
                            }
                        ]
                    }
                },
            }
            await kube.request("POST", f"{DRA_API}/namespaces/{ns}/resourceclaims", body=claim)
            created = await kube.request(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                body={
                    "metadata": {
                        "name": "train-0",
                        "annotations": {
                            "gputopo.io/node": node,
                            "gputopo.io/gpus": ",".join(map(str, chosen)),
                            "gputopo.io/gpu-uuids": ",".join(uuids[g] for g in chosen),
                        },
                    },
                    "spec": {"containers": [{"name": "c", "image": "train"}]},
                },
            )
            # A 1.20 server drops spec.resourceClaims (1.26+): add it as a newer one keeps it.
            pod = {
                **created,
                "spec": {
                    **created["spec"],
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": "train-0-gpus"}],
                },
            }
            assert await allocate_recorded(as_binder, pod) == [f"{ns}/train-0-gpus"]

            stored = await kube.request(
                "GET", f"{DRA_API}/namespaces/{ns}/resourceclaims/train-0-gpus"
            )
            allocation = stored["status"]["allocation"]
            devices = [r["device"] for r in allocation["devices"]["results"]]
            assert devices == ["gpu-2", "gpu-3"]  # minors of GPUs 5 and 4, not "gpu-5", "gpu-4"
            assert {r["pool"] for r in allocation["devices"]["results"]} == {node}
            (term,) = allocation["nodeSelector"]["nodeSelectorTerms"]
            assert term["matchFields"][0]["values"] == [node]
            assert stored["status"]["reservedFor"] == [
                {"resource": "pods", "name": "train-0", "uid": created["metadata"]["uid"]}
            ]

            async def held() -> bool:
                return state.snapshot().node(node).free == frozenset(range(8)) - set(chosen)

            await eventually(held, timeout_s=30, what="the aggregator holds GPUs 4 and 5")
            # Deallocated: free again.
            stored["status"] = {}
            await kube.request(
                "PUT", f"{DRA_API}/namespaces/{ns}/resourceclaims/train-0-gpus/status", body=stored
            )

            async def freed() -> bool:
                return state.snapshot().node(node).free == frozenset(range(8))

            await eventually(freed, timeout_s=30, what="the aggregator frees GPUs 4 and 5")
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            for client in (kube, as_binder, as_aggregator):
                client.close()

    run(body())
