"""Only who made a reservation may commit or release it; only the scheduler may ask the extender.

An id is no secret (it sits in pod annotations and topology dumps), so over mutual TLS the
aggregator remembers the client certificate that made each reservation, over gRPC and over the
HTTP mirror alike, and refuses Commit and Release from any other. Real sockets, real certificates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.identity import caller_of_http
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from gputopo.runtime.tls import TlsFiles, ssl_client_context
from tests.builders import fabric_cluster
from tests.harness.certs import TestCA

TP4 = request_from_mapping({"job": "tp4", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 4}]})
PLACE_JSON = {"request": {"job": "tp4", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 4}]}}


class Certs:
    def __init__(self, tmp: Path) -> None:
        ca = TestCA("gputopo-ca")
        self.server = ca.issue(tmp / "server", "localhost")
        self.alice = ca.issue(tmp / "alice", "gputopo-scheduler")
        self.mallory = ca.issue(tmp / "mallory", "some-other-workload")
        self.kube_scheduler = ca.issue(tmp / "ks", "system:kube-scheduler")


def serve(tmp: Path, body: Callable[[Aggregator, Certs], Awaitable[None]], **config: Any) -> None:
    certs = Certs(tmp)

    async def go() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, tls=certs.server, **config))
        for topo in fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8):
            agg.state.add_static(topo)
        await agg.start()
        try:
            await body(agg, certs)
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(go(), timeout=60))


def client(agg: Aggregator, tls: TlsFiles) -> grpcio.grpc.aio.Channel:
    return grpcio.channel(f"localhost:{agg.grpc_port}", tls=tls)


def test_only_the_certificate_that_made_a_reservation_may_commit_or_release_it(
    tmp_path: Path,
) -> None:
    async def body(agg: Aggregator, certs: Certs) -> None:
        async with client(agg, certs.alice) as a, client(agg, certs.mallory) as m:
            alice, mallory = PlacementClient(a), PlacementClient(m)
            answer = await alice.place(TP4)
            assert answer.reservation is not None
            rid = answer.reservation.id
            assert agg.state.reservation(rid).holder == "gputopo-scheduler"  # type: ignore[union-attr]
            for call in (mallory.release(rid), mallory.commit(rid, owner="ns/thief")):
                with pytest.raises(PlacementCallError) as err:
                    await call
                assert err.value.status == "PERMISSION_DENIED"
                assert "'gputopo-scheduler' may commit or release" in err.value.message
            held = agg.state.reservation(rid)
            assert held is not None
            assert (held.committed, held.owner) == (False, "")
            assert agg.placement.denied == 2
            assert (await alice.commit(rid, owner="ns/job")).committed
            assert await alice.release(rid) == 4
            assert agg.state.reservation(rid) is None

    serve(tmp_path, body)


def test_the_http_mirror_keeps_the_same_rule(tmp_path: Path) -> None:
    async def body(agg: Aggregator, certs: Certs) -> None:
        base = f"https://localhost:{agg.http_port}/api/v1/placement"
        async with aiohttp.ClientSession() as session:

            async def post(verb: str, tls: TlsFiles, payload: Any) -> tuple[int, Any]:
                ssl = ssl_client_context(tls)
                async with session.post(f"{base}/{verb}", json=payload, ssl=ssl) as resp:
                    return resp.status, await resp.json()

            status, placed = await post("place", certs.alice, PLACE_JSON)
            assert status == 200, placed
            rid = placed["reservation"]["id"]
            status, refused = await post("release", certs.mallory, {"reservation_id": rid})
            assert (status, refused["code"]) == (403, "PERMISSION_DENIED"), refused
            assert agg.state.reservation(rid) is not None
            status, freed = await post("release", certs.alice, {"reservation_id": rid})
            assert (status, freed["gpus_freed"]) == (200, 4), freed
            # One made over HTTP is the same caller's over gRPC: the name is what counts.
            status, placed = await post("place", certs.alice, PLACE_JSON)
            async with client(agg, certs.alice) as a:
                assert await PlacementClient(a).release(placed["reservation"]["id"]) == 4

    serve(tmp_path, body)


def test_the_extender_answers_only_the_schedulers_certificate(tmp_path: Path) -> None:
    args = {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "NodeNames": ["n"]}

    async def body(agg: Aggregator, certs: Certs) -> None:
        url = f"https://localhost:{agg.http_port}/scheduler/filter"
        async with aiohttp.ClientSession() as session:
            seen = {}
            for name, tls in (("ks", certs.kube_scheduler), ("other", certs.mallory)):
                ssl = ssl_client_context(tls)
                async with session.post(url, json=args, ssl=ssl) as resp:
                    seen[name] = (resp.status, await resp.json())
        assert seen["ks"][0] == 200, seen
        assert seen["other"][0] == 403
        assert "'some-other-workload' may not call the extender" in seen["other"][1]["error"]

    serve(tmp_path, body)


def test_the_allowed_extender_callers_are_configurable(tmp_path: Path) -> None:
    async def body(agg: Aggregator, certs: Certs) -> None:
        url = f"https://localhost:{agg.http_port}/scheduler/prioritize"
        args = {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "NodeNames": []}
        async with aiohttp.ClientSession() as session:
            for tls, want in ((certs.mallory, 200), (certs.kube_scheduler, 403)):
                async with session.post(url, json=args, ssl=ssl_client_context(tls)) as resp:
                    assert resp.status == want, await resp.text()

    serve(tmp_path, body, extender_clients=("some-other-workload",))


@pytest.mark.parametrize(
    ("peercert", "name"),
    [
        (None, ""),
        ({}, ""),
        ({"subject": ((("organizationName", "x"),), (("commonName", "cn-1"),))}, "cn-1"),
    ],
)
def test_caller_of_http_reads_the_common_name(peercert: Any, name: str) -> None:
    assert caller_of_http(peercert) == name
