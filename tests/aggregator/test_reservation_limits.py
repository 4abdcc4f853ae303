"""Reservations under hostile requests, over real gRPC: a TTL is bounded, so every reservation
made can be named; ids cannot be guessed; the inventory's held GPUs are not a client's to free."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.app.cli import main
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from tests.builders import fabric_cluster

SMALL = Path(__file__).parent.parent / "data" / "inventory_small.yaml"
TP8 = request_from_mapping({"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]})


def serve(
    config: AggregatorConfig,
    body: Callable[[Aggregator, PlacementClient], Awaitable[None]],
    *,
    static: bool = True,
) -> None:
    async def go() -> None:
        agg = Aggregator(config, clock=lambda: 1000.0)
        if static:
            for topo in fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8):
                agg.state.add_static(topo)
        await agg.start()
        try:
            async with grpcio.channel(agg.grpc_target) as channel:
                await body(agg, PlacementClient(channel))
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(go(), timeout=60))


def free_gpus(agg: Aggregator) -> int:
    return sum(len(n.free) for n in agg.state.snapshot().nodes.values())


@pytest.mark.parametrize(
    "ttl_s",
    [
        pytest.param(120.001, id="just over the maximum"),
        pytest.param(3e11, id="an expiry past year 9999, which no timestamp can carry"),
    ],
)
def test_a_ttl_over_the_maximum_is_refused_and_nothing_is_held(ttl_s: float) -> None:
    async def body(agg: Aggregator, client: PlacementClient) -> None:
        before = free_gpus(agg)
        with pytest.raises(PlacementCallError) as err:
            await client.place(TP8, ttl_s=ttl_s)
        assert err.value.status == "INVALID_ARGUMENT"
        assert "reservation_ttl" in err.value.message
        assert "at most 120 s" in err.value.message
        assert free_gpus(agg) == before
        assert agg.state.book.reservations() == []
        answer = await client.place(TP8, ttl_s=120.0)  # the maximum itself is fine
        assert answer.reservation is not None
        assert answer.reservation.expires_at == pytest.approx(1120.0)

    serve(AggregatorConfig(reservation_ttl_s=30.0, max_reservation_ttl_s=120.0), body)


def test_reservation_ids_are_long_random_tokens() -> None:
    async def body(agg: Aggregator, client: PlacementClient) -> None:
        ids = []
        for _ in range(2):
            answer = await client.place(TP8)
            assert answer.reservation is not None
            ids.append(answer.reservation.id)
        assert len(set(ids)) == 2
        assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids), ids

    serve(AggregatorConfig(), body)


def test_the_inventorys_used_gpus_cannot_be_released_or_committed_by_a_client() -> None:
    async def body(agg: Aggregator, client: PlacementClient) -> None:
        held = [r for r in agg.state.book.reservations() if r.from_inventory]
        assert {node for r in held for node in r.gpus} == {"h100-01", "a100-07"}
        for res in held:
            assert res.id.startswith("inventory-")
            assert not any(node in res.id for node in res.gpus)  # not derived from the node
            assert re.fullmatch(r"inventory-[0-9a-f]{32}", res.id)
            for call in (client.release(res.id), client.commit(res.id, owner="ns/thief")):
                with pytest.raises(PlacementCallError) as err:
                    await call
                assert err.value.status == "PERMISSION_DENIED"
                assert "inventory" in err.value.message
        assert agg.state.snapshot().node("h100-01").free == frozenset({4, 5, 6, 7})
        assert all(r.from_inventory for r in agg.state.book.reservations())

    serve(AggregatorConfig(inventory_path=str(SMALL), inventory_nodes=True), body, static=False)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--reservation-ttl", "600", "--max-reservation-ttl", "300"], id="over max"),
        pytest.param(["--max-reservation-ttl", "inf"], id="infinite max"),
        pytest.param(["--max-reservation-ttl", "nan"], id="nan max"),
        pytest.param(["--reservation-ttl", "0"], id="zero ttl"),
    ],
)
def test_the_command_refuses_ttls_it_could_not_keep(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["aggregator", "--insecure", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "reservation-ttl" in err
