"""Promises kept across a restart and a failover, on the real kube-apiserver.

Seen before this: an aggregator restarted and every reservation was gone, the GPUs were handed
out again, and pods pinned to a reservation never scheduled. Here a reservation is made, the
aggregator that made it goes away without a word, and another one (a restart, or the second
replica) must know it before it answers: the reservation commits, its GPUs are not handed out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.server import Aggregator, KubeOptions
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.leader import LeaseConfig
from gputopo.runtime.placement_client import PlaceAnswer, PlacementCallError, PlacementClient
from tests.aggregator.kubeutil import (
    aggregator,
    create_nodes,
    eventually,
    exporters,
    install_crds,
    run,
)
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

CRD = Path(__file__).parent.parent.parent / "deploy" / "aggregator" / "crd-gpureservations.yaml"
EIGHT = request_from_mapping(
    {"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]}
)


def _stored(kube: KubeApiServer, namespace: str) -> dict[str, dict[str, Any]]:
    with kube.json_session() as session:
        response = session.request(
            "GET", f"/apis/gputopo.io/v1alpha1/namespaces/{namespace}/gpureservations"
        )
        assert response.ok, response.body
        return {o["metadata"]["name"]: o for o in response.body["items"]}


def test_a_reservation_survives_the_aggregator_that_made_it(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, str(CRD))
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("k")
    )
    options = KubeOptions(publish_labels=False, reservations_namespace=kube_scope.namespace)

    async def body() -> None:
        await create_nodes(kube_apiserver, [n.name for n in nodes])
        async with aggregator(kube_apiserver, options=options) as first, exporters(first, nodes):
            async with grpcio.channel(first.grpc_target) as channel:
                answer = await PlacementClient(channel).place(EIGHT)  # type: ignore[arg-type]
            assert answer.result.placed
            assert answer.reservation is not None
            rid = answer.reservation.id
            (taken,) = {p.node for p in answer.result.pods}
            stored = _stored(kube_apiserver, kube_scope.namespace)
            assert stored[rid]["spec"]["gpus"] == {
                taken: list(range(8))
            }  # written before the answer
            # The aggregator goes; its memory with it. Another one starts from the API server.
        async with aggregator(kube_apiserver, options=options) as second, exporters(second, nodes):
            await second.placement.ready.wait()
            async with grpcio.channel(second.grpc_target) as channel:
                client = PlacementClient(channel)
                other = await client.place(EIGHT)  # type: ignore[arg-type]
                assert other.result.placed
                assert {p.node for p in other.result.pods} != {taken}  # never the same GPU twice
                none_left = await client.place(EIGHT, dry_run=True)  # type: ignore[arg-type]
                assert not none_left.result.placed
                committed = await client.commit(rid, owner="binder")
                assert committed.committed
                assert _stored(kube_apiserver, kube_scope.namespace)[rid]["spec"]["committed"]
                await client.release(rid)
                assert rid not in _stored(kube_apiserver, kube_scope.namespace)
                assert other.reservation is not None
                await client.release(other.reservation.id)

    run(body())


def test_after_a_failover_the_new_leader_knows_every_promise_before_it_answers(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, str(CRD))
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("f")
    )
    lease = LeaseConfig(
        namespace=kube_scope.namespace,
        name=kube_scope.name("lease"),
        lease_duration_s=2.0,
        renew_deadline_s=1.5,
        retry_period_s=0.2,
    )

    def options(identity: str) -> KubeOptions:
        return KubeOptions(
            publish_labels=False,
            lease=lease,
            identity=identity,
            reservations_namespace=kube_scope.namespace,
        )

    async def place(agg: Aggregator, *, ttl_s: float | None = None) -> PlaceAnswer:
        async with grpcio.channel(agg.grpc_target) as channel:
            return await PlacementClient(channel).place(EIGHT, ttl_s=ttl_s)  # type: ignore[arg-type]

    async def body() -> None:
        await create_nodes(kube_apiserver, [n.name for n in nodes])
        async with (
            aggregator(kube_apiserver, options=options("one")) as one,
            aggregator(kube_apiserver, options=options("two")) as two,
            exporters(one, nodes),
            exporters(two, nodes),
        ):

            async def one_leads() -> bool:
                return one.leading != two.leading

            await eventually(one_leads, timeout_s=10, what="one leader")
            leader, follower = (one, two) if one.leading else (two, one)
            with pytest.raises(PlacementCallError, match="not the leader"):
                await place(follower)
            promised = await place(leader)
            assert promised.reservation is not None
            (taken,) = {p.node for p in promised.result.pods}

            await leader.stop(grace_s=0.0, release_lease=False)  # it dies holding the lease

            async def took_over() -> bool:
                return follower.leading and follower.placement.ready.is_set()

            await eventually(took_over, timeout_s=15, what="the follower leads, restored")
            async with grpcio.channel(follower.grpc_target) as channel:
                client = PlacementClient(channel)
                kept = await client.commit(promised.reservation.id, owner="binder")
                assert kept.committed
            second = await place(follower)
            assert {p.node for p in second.result.pods} != {taken}  # never the same GPU twice
            assert second.reservation is not None

    run(body())


def test_an_expired_reservation_leaves_the_api_server(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, str(CRD))
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=1, gpus=8, prefix=kube_scope.name("e")
    )
    options = KubeOptions(publish_labels=False, reservations_namespace=kube_scope.namespace)

    async def body() -> None:
        await create_nodes(kube_apiserver, [n.name for n in nodes])
        async with aggregator(kube_apiserver, options=options) as agg, exporters(agg, nodes):
            async with grpcio.channel(agg.grpc_target) as channel:
                answer = await PlacementClient(channel).place(EIGHT, ttl_s=0.5)  # type: ignore[arg-type]
            assert answer.reservation is not None
            rid = answer.reservation.id
            assert rid in _stored(kube_apiserver, kube_scope.namespace)

            async def gone() -> bool:
                return rid not in _stored(kube_apiserver, kube_scope.namespace)

            await eventually(gone, timeout_s=10, what="the expired reservation deleted")

    run(body())
