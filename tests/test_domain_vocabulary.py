"""One level vocabulary end to end, and the rejection codes held to the proto's promise."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.codec import request_to_proto
from gputopo.domains import (
    domain_name,
    level_tier,
    parent_level,
    parse_domain_name,
    parse_level,
    scope_level,
    tier_path,
)
from gputopo.placement.result import RejectionCode
from gputopo.request import Scope, request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementClient
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc
from tests.builders import nvswitch_node

PROTO = Path(__file__).parent.parent / "proto" / "gputopo" / "v1" / "placement.proto"


@pytest.mark.parametrize(
    ("text", "tier", "parent"),
    [
        pytest.param("node", None, None, id="node has no tier"),
        pytest.param("nvlink", None, None, id="nvlink has no tier"),
        pytest.param("tier-0", 0, "tier-1", id="the leaf group sits in tier 1"),
        pytest.param("tier-7", 7, "tier-8", id="tiers go as deep as the fabric"),
        pytest.param("zone", None, None, id="zone"),
    ],
)
def test_levels_parse_and_nest(text: str, tier: int | None, parent: str | None) -> None:
    level = parse_level(text)
    assert (level, level_tier(level), parent_level(level)) == (text, tier, parent)


@pytest.mark.parametrize("text", ["leaf", "accelerator", "tier-", "tier-01", "Tier-0", ""])
def test_old_and_wrong_spellings_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a domain level"):
        parse_level(text)


def test_scopes_name_levels_and_domain_names_round_trip() -> None:
    assert [scope_level(s) for s in Scope] == [
        "nvlink",
        "node",
        "tier-0",
        "tier-1",
        "tier-2",
        "zone",
        "cluster",
    ]
    tiers = ("leaf-2", "spine-1", "core", "super")
    assert tier_path(tiers, 0) == "super/core/spine-1/leaf-2"
    assert tier_path(tiers, 3) == "super"
    name = domain_name(Scope.LEAF, tier_path(tiers, 0))
    assert name == "tier-0/super/core/spine-1/leaf-2"
    assert parse_domain_name(name) == ("tier-0", "super/core/spine-1/leaf-2")


def test_the_proto_comment_lists_exactly_the_rejection_codes() -> None:
    text = PROTO.read_text()
    block = text[text.index("message Rejection {") :]
    block = block[: block.index("}")]
    comment = " ".join(
        line.strip().removeprefix("//").strip()
        for line in block.splitlines()
        if line.strip().startswith("//")
    )
    listed = re.search(r"one of: ([a-z_, ]+)\.", comment)
    assert listed is not None, comment
    assert [c.strip() for c in listed.group(1).split(",")] == [c.value for c in RejectionCode]


# Four tiers: leaf, spine, core and a super-spine. Two nodes of 8 GPUs per leaf.
NODES = [
    nvswitch_node(f"n-{leaf}-{i}", gpus=8, tiers=(f"leaf-{leaf}", "spine-0", "core", "super"))
    for leaf in range(2)
    for i in range(2)
]
# 3 pods of 8 GPUs in one leaf: every leaf has 16, so every leaf is rejected.
TOO_BIG = request_from_mapping(
    {
        "job": "big",
        "groups": [{"name": "tp", "pods": 3, "gpus_per_pod": 8}],
        "scope": {"required": "leaf"},
    }
)


def test_a_rejected_domain_has_one_name_in_grpc_http_get_topology_and_metrics() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0))
        for topo in NODES:
            agg.state.add_static(topo)
        await agg.start()
        base = f"http://127.0.0.1:{agg.http_port}"
        try:
            async with grpcio.channel(agg.grpc_target) as channel:
                answer = await PlacementClient(channel).place(TOO_BIG, dry_run=True)
                topo = await pgrpc.PlacementStub(channel).GetTopology(ppb.GetTopologyRequest())
            async with aiohttp.ClientSession() as session:
                request = {"request": json_format.MessageToDict(request_to_proto(TOO_BIG))}
                async with session.post(f"{base}/api/v1/placement/explain", json=request) as r:
                    mirrored = await r.json()
                async with session.get(f"{base}/api/v1/topology?links=false") as r:
                    rest = await r.json()
                async with session.get(f"{base}/metrics") as r:
                    metrics = await r.text()
        finally:
            await agg.stop(grace_s=0.1)

        want = {"tier-0/super/core/spine-0/leaf-0", "tier-0/super/core/spine-0/leaf-1"}
        grpc_names = {r.domain for r in answer.result.rejections}
        assert not answer.result.placed
        assert want <= grpc_names
        assert {r.code for r in answer.result.rejections if r.domain in want} == {
            RejectionCode.INSUFFICIENT_GPUS
        }
        http_names = {r["domain"] for r in mirrored["rejections"]}
        assert http_names == grpc_names
        topology_names = {f"{d.level}/{d.id}" for d in topo.domains}
        rest_names = {f"{d['level']}/{d['id']}" for d in rest["domains"]}
        metric_names = {
            f"{s.labels['level']}/{s.labels['domain']}"
            for family in text_string_to_metric_families(metrics)
            if family.name == "gputopo_aggregator_domain_gpus"
            for s in family.samples
        }
        assert want <= topology_names
        assert topology_names == rest_names == metric_names
        # Every tier, none cut off at three; each tier's parent is the next tier's domain.
        assert {d.level for d in topo.domains} == {"tier-0", "tier-1", "tier-2", "tier-3"}
        parents = {(d.level, d.id): d.parent for d in topo.domains}
        assert parents[("tier-2", "super/core")] == "super"
        assert parents[("tier-3", "super")] == ""

    asyncio.run(body())
