"""End to end: a prefill/decode request, through placement and the binder's record, to the GPUs
the kubelet's device manager allocates and names in its AllocateResponse.

The published cost of getting this wrong: prefill and decode on different PCI roots of one 8x
H100 node lost about half the throughput (ai-dynamo/dynamo#10171). The real binder places and
records on the real API server; the device plugin lists the node's pods from that server; a
kubelet device manager (tests.harness.kubelet) admits them over the real protocol.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.deviceplugin import DevicePlugin, DevicePluginConfig, kubelet_allocations, node_pods
from gputopo.links import LinkKind
from gputopo.machines import load_machine
from gputopo.runtime.backoff import Backoff
from gputopo.topology import NodeTopology
from scheduler.binder import BinderConfig
from tests.aggregator.kubeutil import eventually, install_crds, run
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.harness.kubelet import FakeKubelet
from tests.scheduler.kubeutil import PODGROUPS, binder_cluster, create, gpu_pod, pod_group, pods_of

# The KV edge needs more than a path across the sockets gives (SYS, 37 GB/s nominal on the PCIe
# server) and no more than one host bridge gives (PHB, 42 GB/s): it fits on one root.
PD = {
    "groups": [
        {"name": "prefill", "pods": 1, "gpus_per_pod": 2},
        {"name": "decode", "pods": 1, "gpus_per_pod": 2},
    ],
    "edges": [{"from": "prefill", "to": "decode", "min_gbps": 40}],
}
CROSS_ROOT = (LinkKind.NODE, LinkKind.SYS)  # PCIe paths between host bridges or sockets


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory: a unix socket path has a length limit (108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="dp-") as root:
        yield Path(root)


def cross_root_pairs(topology: NodeTopology, a: list[int], b: list[int]) -> int:
    """Prefill-decode GPU pairs whose path crosses a PCI root (no NVLink between them)."""
    count = 0
    for i in a:
        for j in b:
            link = topology.gpu_link(i, j)
            if link is not None and link.kind in CROSS_ROOT:
                count += 1
    return count


@pytest.mark.parametrize(
    "profile",
    ["pcie-h100-nvlbridge-8x", "h100-nv6-4x"],
    ids=["two-root PCIe 8x H100", "4x H100 NV6"],
)
def test_prefill_and_decode_get_the_recorded_gpus_on_one_root(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path, profile: str
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    node = load_machine(profile, node_name=kube_scope.name("gpu"))
    ns = kube_scope.namespace
    scheduler = kube_scope.name("binder")
    config = BinderConfig(scheduler_name=scheduler, undo_grace_s=0, retry_unplaced_s=1.0)

    async def body() -> None:
        async with binder_cluster(kube_apiserver, [node], config) as (kube, _):
            await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, "pd", 2, PD))
            for group in ("prefill", "decode"):
                pod = gpu_pod(ns, group, 2, scheduler=scheduler, pod_group="pd", group=group)
                await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)

            async def bound() -> bool:
                return all(p["spec"].get("nodeName") for p in await pods_of(kube, ns))

            await eventually(bound, timeout_s=30, what="the prefill/decode gang bound")
            pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
            recorded = {
                name: [int(g) for g in p["metadata"]["annotations"]["gputopo.io/gpus"].split(",")]
                for name, p in pods.items()
            }
            assert cross_root_pairs(node, recorded["prefill"], recorded["decode"]) == 0

            kubelet = FakeKubelet(tmp_path / "dp", tmp_path / "pr.sock")
            async with kubelet:
                plugin = DevicePlugin(
                    DevicePluginConfig(
                        node_name=node.name,
                        directory=tmp_path / "dp",
                        watch_interval_s=0.05,
                        backoff=Backoff(base_s=0.05, cap_s=0.2),
                    ),
                    lambda: node,
                    pods=node_pods(kube, node.name),
                    allocated=kubelet_allocations(kubelet.pod_resources_socket, "nvidia.com/gpu"),
                )
                task = asyncio.create_task(plugin.run())
                try:
                    await kubelet.wait_for("nvidia.com/gpu")
                    by_uuid = {g.uuid: g.index for g in node.gpus}
                    got: dict[str, list[int]] = {}
                    order = sorted(pods, key=lambda n: pods[n]["metadata"]["creationTimestamp"])
                    for name in order:
                        (done,) = await kubelet.admit(f"{ns}/{name}", [2])
                        named = done.response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
                        got[name] = [by_uuid[u] for u in named]
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            assert got == recorded
            assert cross_root_pairs(node, got["prefill"], got["decode"]) == 0

    run(body())


def test_the_kubelets_own_pick_would_cross_a_root() -> None:
    """Why the plugin matters: without a preference the kubelet takes the first free device
    IDs in order; on the PCIe server that order (by UUID) mixes the roots."""
    node = load_machine("pcie-h100-nvlbridge-8x", node_name="n")
    first: list[Any] = sorted(g.uuid for g in node.gpus)[:4]
    index = {g.uuid: g.index for g in node.gpus}
    gpus = [index[u] for u in first]
    assert cross_root_pairs(node, gpus[:2], gpus[2:]) > 0
