"""The aggregator's event loop keeps answering while CPU-heavy work runs (issue 13).

A topology dump of 2,000 nodes takes seconds of CPU and a long pipeline's placement search close
to one; both used to run on the event loop, where a liveness probe timing out restarts the pod.
Now they run in the search pool on immutable snapshots. Measured here over real sockets:
/healthz answers within a second, many times, while each runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementClient
from tests.aggregator.kubeutil import run
from tests.builders import fabric_cluster

pytestmark = pytest.mark.slow

NODES = fabric_cluster(spines=10, leaves_per_spine=10, nodes_per_leaf=20, gpus=8)  # 2,000
STAGES = 24
PIPELINE = request_from_mapping(
    {
        "job": "pipeline",
        "groups": [{"name": f"s{i}", "pods": 8, "gpus_per_pod": 8} for i in range(STAGES)],
        "edges": [{"from": f"s{i}", "to": f"s{i + 1}"} for i in range(STAGES - 1)],
    }
)


def serve(body: Callable[[Aggregator, aiohttp.ClientSession], Awaitable[None]]) -> None:
    async def go() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0))
        for topo in NODES:
            agg.state.add_static(topo)
        await agg.start()
        try:
            async with aiohttp.ClientSession() as session:
                await body(agg, session)
        finally:
            await agg.stop(grace_s=0.1)

    run(go(), timeout_s=240)


async def probe_while(
    session: aiohttp.ClientSession, url: str, work: asyncio.Task[Any]
) -> tuple[list[float], float]:
    """/healthz latencies (s) measured back to back until `work` is done, and its duration."""
    began = time.monotonic()
    latencies = []
    while not work.done():
        start = time.monotonic()
        async with session.get(url) as resp:
            assert resp.status == 200
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(0.02)
    await work
    return latencies, time.monotonic() - began


def test_healthz_answers_while_a_placement_search_runs() -> None:
    async def body(agg: Aggregator, session: aiohttp.ClientSession) -> None:
        healthz = f"http://127.0.0.1:{agg.http_port}/healthz"
        async with grpcio.channel(agg.grpc_target) as channel:
            client = PlacementClient(channel)
            place = asyncio.create_task(client.place(PIPELINE))
            latencies, took = await probe_while(session, healthz, place)
            answer = place.result()
        assert answer.result.placed
        assert took > 0.25, f"the search took {took:.2f} s: too short to show anything"
        assert len(latencies) >= 4, latencies
        assert max(latencies) < min(1.0, took / 2), f"/healthz took {max(latencies):.2f} s"

    serve(body)


def test_healthz_answers_while_a_2000_node_topology_dump_is_built() -> None:
    async def body(agg: Aggregator, session: aiohttp.ClientSession) -> None:
        base = f"http://127.0.0.1:{agg.http_port}"

        async def dump() -> dict[str, Any]:
            async with session.get(f"{base}/api/v1/topology") as resp:
                assert resp.status == 200
                return dict(await resp.json())

        task = asyncio.create_task(dump())
        latencies, took = await probe_while(session, f"{base}/healthz", task)
        assert len(task.result()["nodes"]) == 2000
        assert took > 0.25, f"the dump took {took:.2f} s: too short to show anything"
        assert len(latencies) >= 4, latencies
        assert max(latencies) < min(1.0, took / 2), f"/healthz took {max(latencies):.2f} s"

    serve(body)


def test_the_topology_is_built_once_until_the_state_changes() -> None:
    async def body(agg: Aggregator, session: aiohttp.ClientSession) -> None:
        url = f"http://127.0.0.1:{agg.http_port}/api/v1/topology?links=false"
        bodies = []
        for _ in range(3):
            async with session.get(url) as resp:
                bodies.append(await resp.read())
        assert agg.http.topology.builds == 1
        assert bodies[0] == bodies[1] == bodies[2]
        agg.state.add_static(
            fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=1, prefix="new")[0]
        )
        async with session.get(url) as resp:
            assert len((await resp.json())["nodes"]) == 2001
        assert agg.http.topology.builds == 2

    serve(body)


def test_the_topology_pages_by_node_name_when_asked() -> None:
    async def body(agg: Aggregator, session: aiohttp.ClientSession) -> None:
        base = f"http://127.0.0.1:{agg.http_port}/api/v1/topology?links=false&limit=700"
        seen: list[str] = []
        url = base
        pages = 0
        while True:
            async with session.get(url) as resp:
                assert resp.status == 200
                page = await resp.json()
            pages += 1
            names = [n["topology"]["name"] for n in page["nodes"]]
            assert len(names) <= 700
            seen += names
            if "continue" not in page:
                break
            url = f"{base}&continue={page['continue']}"
        assert pages == 3
        assert seen == sorted(t.name for t in NODES)
        for query, field in (
            ("limit=-1", "limit"),
            ("limit=x", "limit"),
            ("continue=%%%", "continue"),
        ):
            async with session.get(
                f"http://127.0.0.1:{agg.http_port}/api/v1/topology?{query}"
            ) as resp:
                assert resp.status == 400, query
                assert (await resp.json())["error"].startswith(field), query

    serve(body)
