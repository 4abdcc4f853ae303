"""The placement API over real HTTP: the JSON mirror of the gRPC service and the kube-scheduler
extender verbs, against an aggregator on a free loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from aggregator.server import Aggregator, AggregatorConfig
from tests.builders import nvswitch_node, pcie_node

T = TypeVar("T")

BRIDGED = [(0, 1), (2, 3), (4, 5), (6, 7)]
NODES = [
    nvswitch_node("dgx-1", tiers=("leaf-a", "spine")),
    nvswitch_node("dgx-2", tiers=("leaf-a", "spine")),
    pcie_node("pcie-1", bridged_pairs=BRIDGED, tiers=("leaf-b", "spine")),
]

Body = dict[str, Any]
Call = Callable[[str, Any], Awaitable[tuple[int, Any]]]


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))  # type: ignore[arg-type]


async def with_http(body: Callable[[Aggregator, Call], Awaitable[None]]) -> None:
    agg = Aggregator(AggregatorConfig(http_port=0))
    await agg.start()
    for topo in NODES:
        agg.state.apply_snapshot(topo, incarnation=1, sequence=1)
    base = f"http://127.0.0.1:{agg.http_port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def call(path: str, payload: Any) -> tuple[int, Any]:
                async with session.post(base + path, json=payload) as resp:
                    return resp.status, await resp.json()

            await body(agg, call)
    finally:
        await agg.stop(grace_s=0.1)


def tp(gpus: int, **extra: Any) -> Body:
    group = {"name": "tp", "pods": 1, "gpus_per_pod": gpus, "pattern": "PATTERN_ALL_REDUCE"}
    return {"request": {"job": "j", "groups": [group], **extra}}


def pod(gpus: int, **annotations: str) -> Body:
    return {
        "metadata": {"name": "worker-0", "namespace": "ml", "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}},
                {"name": "sidecar", "resources": {}},
            ]
        },
    }


def test_the_json_mirror_places_commits_releases_and_explains() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        status, placed = await call("/api/v1/placement/place", tp(8))
        assert status == 200
        assert placed["placed"] is True
        assert placed["assignments"][0]["node"].startswith("dgx")
        rid = placed["reservation"]["id"]
        assert placed["predicted"]["groups"][0]["bus_gbps"] > 400
        status, committed = await call(
            "/api/v1/placement/commit", {"reservation_id": rid, "owner": "ml/job"}
        )
        assert (status, committed["reservation"]["committed"]) == (200, True)
        status, why = await call("/api/v1/placement/explain", {"reservation_id": rid})
        assert status == 200
        assert why["assignments"] == placed["assignments"]
        status, released = await call("/api/v1/placement/release", {"reservation_id": rid})
        assert (status, released["gpus_freed"]) == (200, 8)
        assert agg.state.reservations() == []

    run(with_http(body))


def test_the_json_mirror_explains_a_refusal_per_domain() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        request = tp(8, scope={"required": "SCOPE_LEAF"})
        request["request"]["groups"][0]["pods"] = 3
        status, why = await call("/api/v1/placement/explain", request)
        assert status == 200
        assert why["placed"] is False
        assert why["reason"]
        domains = {r["domain"]: r["code"] for r in why["rejections"]}
        assert domains.get("tier-0/spine/leaf-a") == "insufficient_gpus"
        assert domains.get("tier-0/spine/leaf-b") == "insufficient_gpus"

    run(with_http(body))


def test_the_json_mirror_answers_bad_input_with_the_field_and_400_or_404() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        status, err = await call("/api/v1/placement/place", tp(0))
        assert status == 400
        assert err["code"] == "INVALID_ARGUMENT"
        assert "request.groups[0].gpus_per_pod" in err["error"]
        status, err = await call("/api/v1/placement/place", {"request": {"groups": "x"}})
        assert status == 400
        status, err = await call("/api/v1/placement/commit", {"reservation_id": "nope"})
        assert (status, err["code"]) == (404, "NOT_FOUND")

    run(with_http(body))


def test_the_json_mirror_takes_the_yaml_spellings_of_a_request() -> None:
    """The README's YAML spellings work over HTTP as they do in a file: one vocabulary."""
    yaml_spelt = {
        "job": "pd",
        "scope": {"required": "spine", "preferred": "tier-0"},
        "groups": [
            {
                "name": "prefill",
                "pods": 1,
                "gpus_per_pod": 4,
                "pattern": "all_reduce",
                "scope": {"required": "nvlink"},
            },
            {
                "name": "decode",
                "pods": 1,
                "gpus_per_pod": 4,
                "pattern": "all-to-all",
                "spread": {"across": "node", "required": False},
            },
        ],
        "edges": [{"from": "prefill", "to": "decode", "min_gbps": 100, "pairing": "one_to_one"}],
    }
    wire_spelt = {
        "job": "pd",
        "scope": {"required": "SCOPE_SPINE", "preferred": "SCOPE_LEAF"},
        "groups": [
            {
                "name": "prefill",
                "pods": 1,
                "gpus_per_pod": 4,
                "pattern": "PATTERN_ALL_REDUCE",
                "scope": {"required": "SCOPE_NVLINK"},
            },
            {
                "name": "decode",
                "pods": 1,
                "gpus_per_pod": 4,
                "pattern": "PATTERN_ALL_TO_ALL",
                "spread": {"across": "SCOPE_NODE", "required": False},
            },
        ],
        "edges": [
            {
                "source": "prefill",
                "target": "decode",
                "min_gbps": 100,
                "pairing": "PAIRING_ONE_TO_ONE",
            }
        ],
    }

    async def body(agg: Aggregator, call: Call) -> None:
        path = "/api/v1/placement/explain"
        status, yaml_answer = await call(path, {"request": yaml_spelt})
        assert status == 200, yaml_answer
        status, wire_answer = await call(path, {"request": wire_spelt})
        assert status == 200, wire_answer
        assert yaml_answer["placed"] is True
        for answer in (yaml_answer, wire_answer):
            del answer["decision_seconds"]  # the one field that is not a function of the input
        assert yaml_answer == wire_answer

    run(with_http(body))


def test_a_misspelt_value_over_http_names_the_field_and_the_spellings() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        request = tp(8)
        request["request"]["groups"][0]["pattern"] = "allreduce"
        status, err = await call("/api/v1/placement/place", request)
        assert (status, err["code"]) == (400, "INVALID_ARGUMENT")
        assert err["error"] == (
            "request.groups[0].pattern: unknown value 'allreduce'; "
            "one of none, all_reduce, all_to_all, pipeline"
        )
        request = tp(8, scope={"required": "rackk"})
        status, err = await call("/api/v1/placement/place", request)
        assert status == 400
        assert err["error"].startswith("request.scope.required: unknown scope 'rackk'; one of")

    run(with_http(body))


def test_extender_filter_keeps_nodes_with_an_nvlink_island_for_the_pod() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        agg.state.restore([])
        # every spelling a request takes, in the annotation too (README, "One meaning")
        for spelling in ("nvlink", "nvlink-domain", "SCOPE_NVLINK"):
            args = {
                "Pod": pod(4, **{"gputopo.io/scope": spelling, "gputopo.io/pattern": "all-reduce"}),
                "NodeNames": ["dgx-1", "pcie-1", "unknown-9"],
            }
            status, result = await call("/scheduler/filter", args)
            assert status == 200
            assert result["NodeNames"] == ["dgx-1"], spelling
            assert "NVLink island" in result["FailedNodes"]["pcie-1"]
            assert "no topology" in result["FailedNodes"]["unknown-9"]
            assert result["Error"] == ""
        args = {"Pod": pod(4, **{"gputopo.io/scope": "SCOPE_NODE"}), "NodeNames": ["pcie-1"]}
        status, result = await call("/scheduler/filter", args)
        assert result["NodeNames"] == ["pcie-1"], "a node scope asks for no island"

    run(with_http(body))


def test_extender_filter_answers_with_node_objects_when_given_node_objects() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        nodes = {"items": [{"metadata": {"name": n}} for n in ("dgx-1", "pcie-1")]}
        status, result = await call("/scheduler/filter", {"Pod": pod(2), "Nodes": nodes})
        assert status == 200
        assert [i["metadata"]["name"] for i in result["Nodes"]["items"]] == ["dgx-1", "pcie-1"]
        status, result = await call("/scheduler/filter", {"Pod": pod(0), "Nodes": nodes})
        assert status == 200
        assert len(result["Nodes"]["items"]) == 2  # a pod without GPUs is not ours to judge

    run(with_http(body))


def test_extender_prioritize_prefers_nvlink_and_packs_a_partly_used_node() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        status, placed = await call("/api/v1/placement/place", tp(4))
        assert placed["placed"]
        used = placed["assignments"][0]["node"]
        other = "dgx-2" if used == "dgx-1" else "dgx-1"
        args = {"Pod": pod(4), "NodeNames": ["dgx-1", "dgx-2", "pcie-1"]}
        status, ranked = await call("/scheduler/prioritize", args)
        assert status == 200
        score = {h["Host"]: h["Score"] for h in ranked}
        assert score[used] == 10  # as fast as the other DGX, and keeps it whole
        assert score[used] > score[other] > score["pcie-1"]
        assert all(0 <= s <= 10 for s in score.values())

    run(with_http(body))


def test_extender_pins_a_pod_of_a_reservation_to_the_node_placement_chose() -> None:
    async def body(agg: Aggregator, call: Call) -> None:
        request = tp(8)
        request["request"]["groups"][0]["pods"] = 2
        status, placed = await call("/api/v1/placement/place", request)
        assert placed["placed"]
        rid = placed["reservation"]["id"]
        second = next(a for a in placed["assignments"] if a["pod"] == 1)["node"]
        member = pod(8, **{"gputopo.io/reservation": rid, "gputopo.io/pod": "1"})
        names = ["dgx-1", "dgx-2", "pcie-1"]
        status, result = await call("/scheduler/filter", {"Pod": member, "NodeNames": names})
        assert result["NodeNames"] == [second]
        assert "elsewhere" in result["FailedNodes"]["pcie-1"]
        status, ranked = await call("/scheduler/prioritize", {"Pod": member, "NodeNames": names})
        assert status == 200
        assert {h["Host"]: h["Score"] for h in ranked}[second] == 10
        gone = pod(8, **{"gputopo.io/reservation": "expired-1"})
        status, result = await call("/scheduler/filter", {"Pod": gone, "NodeNames": names})
        assert status == 200
        assert result["NodeNames"] == []
        assert "unknown, released or expired" in result["FailedNodes"]["dgx-1"]

    run(with_http(body))
