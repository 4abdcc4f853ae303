"""The typed placement client against a real aggregator over gRPC: domain objects in and out."""

from __future__ import annotations

import asyncio

import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from tests.builders import fabric_cluster

TP8 = request_from_mapping({"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]})


def test_place_commit_explain_release() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(reservation_ttl_s=30.0), clock=lambda: 1000.0)
        for topo in fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8):
            agg.state.add_static(topo)
        await agg.start()
        try:
            async with grpcio.channel(agg.grpc_target) as channel:
                client = PlacementClient(channel)
                dry = await client.place(TP8, dry_run=True)
                assert dry.result.placed
                assert dry.reservation is None
                answer = await client.place(TP8, ttl_s=5.0)
                assert answer.result.placed
                assert answer.result.pods == dry.result.pods
                assert answer.reservation is not None
                assert answer.reservation.expires_at == pytest.approx(1005.0)
                rid = answer.reservation.id
                committed = await client.commit(rid, owner="ns/job")
                assert (committed.committed, committed.expires_at, committed.owner) == (
                    True,
                    None,
                    "ns/job",
                )
                assert (await client.explain(rid)).pods == answer.result.pods
                assert await client.release(rid) == 8
                with pytest.raises(PlacementCallError) as err:
                    await client.release(rid)
                assert err.value.status == "NOT_FOUND"
                with pytest.raises(PlacementCallError) as err:
                    await client.place(TP8, ttl_s=-1.0)
                assert err.value.status == "INVALID_ARGUMENT"
                assert "reservation_ttl" in err.value.message
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(body())
