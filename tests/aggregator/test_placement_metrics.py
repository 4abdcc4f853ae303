"""Placement decisions show up in the aggregator's metrics, by outcome, policy and status."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from tests.builders import fabric_cluster


def _req(gpus: int, policy: str = "") -> object:
    body: dict[str, object] = {
        "job": "j",
        "groups": [{"name": "g", "pods": 1, "gpus_per_pod": gpus}],
    }
    if policy:
        body["policy"] = policy
    return request_from_mapping(body)


def test_decisions_latency_and_rejections_are_counted() -> None:
    async def body() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        agg = Aggregator(AggregatorConfig(http_port=0))
        for topo in fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8):
            agg.state.add_static(topo)
        await agg.start()
        try:
            async with grpcio.channel(agg.grpc_target) as channel:
                client = PlacementClient(channel)
                await client.place(_req(8))  # type: ignore[arg-type]
                await client.place(_req(8, "first-fit"), dry_run=True)  # type: ignore[arg-type]
                await client.place(_req(64))  # type: ignore[arg-type]
                with pytest.raises(PlacementCallError):
                    await client.release("no-such-reservation")
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{agg.http_port}/metrics") as resp,
            ):
                text = await resp.text()
        finally:
            await agg.stop(grace_s=0.1)
        out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return out

    samples = asyncio.run(body())
    decisions = samples["gputopo_aggregator_placements_total"]
    assert decisions[(("outcome", "placed"), ("policy", "gputopo"))] == 1
    assert decisions[(("outcome", "dry_run"), ("policy", "first-fit"))] == 1
    assert decisions[(("outcome", "unplaced"), ("policy", "gputopo"))] == 1
    assert samples["gputopo_aggregator_placement_seconds_count"][()] == 3
    rejections = samples["gputopo_aggregator_placement_rejections_total"]
    assert rejections[(("code", "NOT_FOUND"),)] == 1
