"""The Node watcher against the real kube-apiserver: every replica reads Node objects, labels
published or not, and a deleted Node leaves the cluster state."""

from __future__ import annotations

import asyncio

import aiohttp

from aggregator.server import KubeOptions
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.kube import KubeClient
from gputopo.runtime.leader import LeaseConfig
from gputopo.runtime.placement_client import PlacementClient
from tests.aggregator.kubeutil import aggregator, create_nodes, eventually, exporters, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

NO_LABELS = KubeOptions(publish_labels=False)


def on_team(team: str) -> object:
    return request_from_mapping(
        {
            "job": "selected",
            "node_selector": {"team": team},
            "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}],
        }
    )


async def topology_nodes(session: aiohttp.ClientSession, port: int) -> set[str]:
    async with session.get(f"http://127.0.0.1:{port}/api/v1/topology?links=false") as r:
        assert r.status == 200
        return {n["topology"]["name"] for n in (await r.json())["nodes"]}


def test_with_labels_off_selectors_match_and_a_deleted_node_leaves(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    infra, other = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("w")
    )

    async def body() -> None:
        await create_nodes(kube_apiserver, [infra.name], labels={"team": "infra"})
        await create_nodes(kube_apiserver, [other.name])
        async with (
            aggregator(kube_apiserver, options=NO_LABELS, http_port=0) as agg,
            exporters(agg, [infra, other]),
            grpcio.channel(agg.grpc_target) as channel,
            aiohttp.ClientSession() as session,
        ):
            assert agg.publisher is None  # --no-labels: nothing writes labels
            assert agg.nodes is not None
            await agg.nodes.synced.wait()
            client = PlacementClient(channel)
            answer = await client.place(on_team("infra"), dry_run=True)  # type: ignore[arg-type]
            assert answer.result.placed
            assert {p.node for p in answer.result.pods} == {infra.name}
            nobody = await client.place(on_team("nobody"), dry_run=True)  # type: ignore[arg-type]
            assert not nobody.result.placed
            assert await topology_nodes(session, agg.http_port) == {infra.name, other.name}

            deletes = agg.nodes.deleted
            kube = KubeClient(kube_apiserver.api_client())
            try:
                await kube.delete_node(other.name)
            finally:
                kube.close()

            async def gone() -> bool:
                return other.name not in await topology_nodes(session, agg.http_port)

            await eventually(gone, timeout_s=10, what="the deleted node leaves /api/v1/topology")
            assert agg.nodes.deleted == deletes + 1  # one watch event did it
            # Its exporter still heartbeats (every 0.2 s): the node stays out all the same.
            await asyncio.sleep(1.0)
            assert await topology_nodes(session, agg.http_port) == {infra.name}

    run(body())


def test_a_follower_reads_node_labels_too(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    (node,) = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=1, gpus=8, prefix=kube_scope.name("f")
    )
    lease = LeaseConfig(
        namespace=kube_scope.namespace,
        name=kube_scope.name("lease"),
        lease_duration_s=3.0,
        renew_deadline_s=2.0,
        retry_period_s=0.25,
    )

    def options(identity: str) -> KubeOptions:
        return KubeOptions(publish_labels=False, lease=lease, identity=identity)

    async def body() -> None:
        await create_nodes(kube_apiserver, [node.name], labels={"team": "infra"})
        async with (
            aggregator(kube_apiserver, options=options("one")) as one,
            aggregator(kube_apiserver, options=options("two")) as two,
            exporters(one, [node]),
            exporters(two, [node]),
        ):

            async def one_leads() -> bool:
                return one.leading != two.leading

            await eventually(one_leads, timeout_s=10, what="one leader")
            follower = two if one.leading else one

            async def labelled() -> bool:
                labels = follower.state.kube_labels(node.name)
                return labels is not None and labels[0].get("team") == "infra"

            await eventually(labelled, timeout_s=10, what="the follower has the Node's labels")

    run(body())
