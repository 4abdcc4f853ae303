"""One request, one answer, whichever way it arrives: YAML, the HTTP mirror, gRPC.

The demo cluster is where the two meanings showed: a 2 x 8 without `pattern` over HTTP went to
the A100 leaf (no communication predicted, 0 GB/s) while the same request from a file went to the
H100 leaf (NVSwitch nodes, the fastest all-reduce). Real sockets, the demo's nodes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import yaml
from google.protobuf import json_format

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.app.demo import demo_nodes
from gputopo.codec import request_to_proto
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc

TWO_BY_EIGHT = """
job: two-by-eight
groups:
  - name: train
    pods: 2
    gpus_per_pod: 8
"""


def _answer(msg: ppb.PlaceResponse) -> dict[str, Any]:
    out = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    out.pop("decision_seconds", None)  # the one field that is not a function of the input
    return out


def test_a_2x8_without_a_pattern_gets_one_answer_over_yaml_http_and_grpc() -> None:
    answers: dict[str, dict[str, Any]] = {}

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0))
        for topo in demo_nodes():
            agg.state.add_static(topo)
        await agg.start()
        try:
            request = yaml.safe_load(TWO_BY_EIGHT)
            async with grpcio.channel(agg.grpc_target) as channel:
                stub = pgrpc.PlacementStub(channel)
                from_file = request_to_proto(request_from_mapping(request))
                answers["yaml"] = _answer(await stub.Explain(ppb.ExplainRequest(request=from_file)))
                bare = ppb.PlacementRequest(
                    job="two-by-eight", groups=[ppb.Group(name="train", pods=2, gpus_per_pod=8)]
                )
                assert bare.groups[0].pattern == ppb.PATTERN_UNSPECIFIED
                answers["grpc"] = _answer(await stub.Explain(ppb.ExplainRequest(request=bare)))
            url = f"http://127.0.0.1:{agg.http_port}/api/v1/placement/explain"
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, json={"request": request}) as resp,
            ):
                assert resp.status == 200, await resp.text()
                got = await resp.json()
            answers["http"] = _answer(json_format.ParseDict(got, ppb.PlaceResponse()))
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(body(), timeout=60))
    nodes = {a["node"] for a in answers["yaml"]["assignments"]}
    assert len(nodes) == 2
    assert all(n.startswith("h100-") for n in nodes), nodes
    (group,) = answers["yaml"]["predicted"]["groups"]
    assert group["bus_gbps"] > 200, group  # NVSwitch inside, 8 x 400G NICs between
    assert answers["grpc"] == answers["yaml"]
    assert answers["http"] == answers["yaml"]
