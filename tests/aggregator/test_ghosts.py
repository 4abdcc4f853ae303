"""State grows with what the cluster has, not with what clients claim (issue 13).

- ghosts: a node with no report stream and no Kubernetes Node object for `ghost_ttl_s` is
  forgotten and counted; one with a stream or a Node object stays (stale, unplaceable);
- a cap on nodes: new names past `max_nodes` get RESOURCE_EXHAUSTED, named and counted;
- a cap on message size: a report larger than the server accepts gets RESOURCE_EXHAUSTED before
  it is decoded, and the server goes on serving.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from aggregator.state import ClusterState
from gputopo.runtime.grpcio import MAX_REQUEST_BYTES
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.aggregator.test_ingest import ACCEPTED, exchange, run, snapshot_msg
from tests.builders import nvswitch_node


@dataclass(frozen=True)
class Ghost:
    id: str
    silent_s: float
    live: bool
    has_object: bool
    forgotten: bool


GHOSTS = [
    Ghost("silent past the TTL, nothing to vouch for it", 700, False, False, True),
    Ghost("silent, but a stream is open", 700, True, False, False),
    Ghost("silent, but its Node object exists", 700, False, True, False),
    Ghost("stale but not yet past the TTL", 300, False, False, False),
]


@pytest.mark.parametrize("case", GHOSTS, ids=[g.id for g in GHOSTS])
def test_only_a_node_nothing_vouches_for_is_forgotten(case: Ghost) -> None:
    now = [1000.0]
    state = ClusterState(clock=lambda: now[0], stale_after_s=30)
    state.apply_snapshot(nvswitch_node("n1", gpus=4), incarnation=1, sequence=1)
    state.add_static(nvswitch_node("static", gpus=4))  # inventory nodes never expire
    now[0] += case.silent_s
    gone = state.forget_ghosts(
        ttl_s=600,
        live={"n1"} if case.live else set(),
        has_object=lambda n: case.has_object,
    )
    assert gone == (["n1"] if case.forgotten else [])
    assert (state.record("n1") is None) == case.forgotten
    assert state.record("static") is not None


def test_a_ghost_is_forgotten_by_the_running_aggregator_and_counted() -> None:
    async def body() -> None:
        agg = Aggregator(
            AggregatorConfig(stale_after_s=0.2, ghost_ttl_s=0.5, housekeeping_interval_s=0.05)
        )
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                held = stub.Report()  # n2's stream stays open, silent
                await held.write(snapshot_msg(1, name="n2"))
                assert (await held.read()).status == ACCEPTED
                assert [a.status for a in await exchange(stub, [snapshot_msg(1)])] == [ACCEPTED]
                for _ in range(100):
                    if agg.state.record("n1") is None:
                        break
                    await asyncio.sleep(0.05)
                assert agg.state.record("n1") is None, "n1 has no stream and no Node object"
                assert agg.state.record("n2") is not None, "n2's stream is open"
                assert agg.reporter.stats.ghosts == 1
                await held.done_writing()
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def test_new_nodes_past_the_cap_are_refused_and_named() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(max_nodes=2))
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                for name in ("a", "b"):
                    held = await exchange(stub, [snapshot_msg(1, name=name)])
                    assert held[0].status == ACCEPTED
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await exchange(stub, [snapshot_msg(1, name="c")])
                assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "--max-nodes" in (err.value.details() or "")
                # a known node still reports
                again = await exchange(stub, [snapshot_msg(2, name="a")])
                assert again[0].status == ACCEPTED
            assert agg.state.node_names == ["a", "b"]
            assert agg.reporter.stats.rejected["node_capacity"] == 1
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def test_an_oversized_report_is_refused_before_decoding_and_the_server_lives() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(
                agg.grpc_target, options=[("grpc.max_send_message_length", -1)]
            ) as channel:
                stub = rgrpc.ReporterStub(channel)
                huge = snapshot_msg(1, name="huge")
                huge.snapshot.topology.gpus[0].name = "x" * (MAX_REQUEST_BYTES + 1024)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await exchange(stub, [huge])
                assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                ok = await exchange(stub, [snapshot_msg(1, name="fine")])
                assert [a.status for a in ok] == [rpb.ReportResponse.STATUS_ACCEPTED]
            assert agg.state.record("huge") is None
        finally:
            await agg.stop(grace_s=0.1)

    run(body())
