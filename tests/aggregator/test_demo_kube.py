"""`gputopo demo --kubeconfig`: the demo's nodes appear in a real cluster with their labels."""

from __future__ import annotations

import io
import json

from gputopo.app.demo import DEMO_NODE_LABEL, demo_nodes, run_demo
from gputopo.runtime.kube import KubeClient
from tests.aggregator.kubeutil import read_nodes, run
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope


async def _delete_demo_nodes(kube: KubeApiServer) -> None:
    client = KubeClient(kube.api_client())
    try:
        for name in {n.name for n in demo_nodes()}:
            await client.request("DELETE", f"/api/v1/nodes/{name}")
    finally:
        client.close()


def test_the_demo_labels_its_nodes_in_a_cluster_and_a_second_run_patches_nothing(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    kubeconfig = str(kube_apiserver.kubeconfig_path)
    topologies = {n.name: n for n in demo_nodes()}

    async def body() -> None:
        before = await read_nodes(kube_apiserver, "")
        assert not set(topologies) & set(before), "demo nodes left over from another test"
        try:
            out = io.StringIO()
            assert await run_demo(out=out, as_json=True, kubeconfig=kubeconfig) == 0
            first = json.loads(out.getvalue())["kubernetes"]
            assert first["nodes_created"] == len(topologies)
            nodes = {
                n: o for n, o in (await read_nodes(kube_apiserver, "")).items() if n in topologies
            }
            assert set(nodes) == set(topologies)
            for name, node in nodes.items():
                topo = topologies[name]
                assert node.labels[DEMO_NODE_LABEL] == "true"
                assert node.labels["fabric.topograph.run/tier-0"] == topo.fabric.tiers[0]
                assert node.labels["gputopo.io/gpu-count"] == str(topo.gpu_count)
            tray = nodes["gb200-01"].labels
            assert (
                tray["accelerator.topograph.run/domain"]
                == topologies["gb200-01"].fabric.accelerator_domain
            )
            assert tray["gputopo.io/nvlink-domain-size"] == "72"
            assert nodes["pcie-01"].labels["gputopo.io/nvlink-domain-size"] == "2"
            assert nodes["h100-01"].labels["gputopo.io/interconnect"] == "nvswitch"
            out = io.StringIO()
            assert await run_demo(out=out, as_json=True, kubeconfig=kubeconfig) == 0
            second = json.loads(out.getvalue())["kubernetes"]
            assert second == {"nodes_created": 0, "label_patches": 0, "labels_left_alone": []}
        finally:
            await _delete_demo_nodes(kube_apiserver)

    run(body())
