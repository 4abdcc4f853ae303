"""Acknowledgements announce the paced heartbeat interval; staleness follows it (real gRPC,
a fake clock for staleness, the aggregator's own housekeeping moving the interval)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.codec import topology_to_proto
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.builders import nvswitch_node

T = TypeVar("T")
STREAMS = 20


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))  # type: ignore[arg-type]


def snapshot(name: str) -> rpb.ReportRequest:
    topo = topology_to_proto(nvswitch_node(name, gpus=2, nics=1))
    return rpb.ReportRequest(
        node_name=name, incarnation=1, sequence=1, snapshot=rpb.Snapshot(topology=topo)
    )


def beat(name: str, seq: int) -> rpb.ReportRequest:
    return rpb.ReportRequest(node_name=name, incarnation=1, sequence=seq, heartbeat=rpb.Heartbeat())


async def announced(agg: Aggregator, want: float) -> None:
    """Until housekeeping (every 20 ms of real time) announces `want` seconds."""
    for _ in range(3000):  # 30 s of real time at most: generous for a loaded machine
        if agg.reporter.stats.heartbeat_interval_s == want:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{want} s never announced: {agg.reporter.stats.heartbeat_interval_s}")


def test_a_node_told_20_s_is_stale_after_six_of_them_not_before() -> None:
    """1 heartbeat/s at most and 20 streams: 20 s. Configured 30 s / 5 s, so 6 intervals."""
    now = [1000.0]

    async def body() -> None:
        config = AggregatorConfig(
            stale_after_s=30, max_heartbeats_per_second=1.0, housekeeping_interval_s=0.02
        )
        agg = Aggregator(config, clock=lambda: now[0])
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                calls = []
                for i in range(STREAMS):
                    call = stub.Report()
                    await call.write(snapshot(f"n{i}"))
                    first = await call.read()
                    assert isinstance(first, rpb.ReportResponse)
                    calls.append(call)
                await announced(agg, 20.0)
                await calls[0].write(beat("n0", 2))
                ack = await calls[0].read()
                assert isinstance(ack, rpb.ReportResponse)
                assert ack.heartbeat_interval.ToNanoseconds() == 20 * 10**9
                assert agg.state.stale_after_s == 120.0
                sample = agg.registry.get_sample_value
                assert sample("gputopo_aggregator_heartbeat_interval_seconds") == 20.0
                assert sample("gputopo_aggregator_stale_after_seconds") == 120.0

                now[0] += 100  # silent 5 of the intervals it was told: not stale
                assert agg.state.stale_nodes() == []
                now[0] += 40  # 7 of them
                assert len(agg.state.stale_nodes()) == STREAMS

                # 15 streams close: 5 left want 5 s (6 s with room for 10 % more), at once...
                for call in calls[5:]:
                    call.cancel()
                await announced(agg, 6.0)
                await calls[1].write(beat("n1", 2))
                ack = await calls[1].read()
                assert isinstance(ack, rpb.ReportResponse)
                assert ack.heartbeat_interval.ToNanoseconds() == 6 * 10**9
                # ... but one who heard 20 s just before may wait it out: 120 s held
                assert agg.state.stale_after_s == 120.0
                now[0] += 100
                assert "n1" not in agg.state.stale_nodes()
                now[0] += 21  # the 20 s window is over: 6 x 6 s
                await asyncio.sleep(0.1)  # a housekeeping tick
                assert agg.state.stale_after_s == 36.0
                assert "n1" in agg.state.stale_nodes()
                for call in calls[:5]:
                    call.cancel()
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def test_pacing_off_announces_the_configured_interval_whatever_the_streams() -> None:
    async def body() -> None:
        config = AggregatorConfig(max_heartbeats_per_second=0, housekeeping_interval_s=0.02)
        agg = Aggregator(config)
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                calls = []
                for i in range(3):
                    call = stub.Report()
                    await call.write(snapshot(f"n{i}"))
                    ack = await call.read()
                    assert isinstance(ack, rpb.ReportResponse)
                    assert ack.heartbeat_interval.ToNanoseconds() == 5 * 10**9
                    calls.append(call)
                await asyncio.sleep(0.1)  # housekeeping ticks
                await calls[0].write(beat("n0", 2))
                ack = await calls[0].read()
                assert isinstance(ack, rpb.ReportResponse)
                assert ack.heartbeat_interval.ToNanoseconds() == 5 * 10**9
                assert agg.state.stale_after_s == 30.0
                for call in calls:
                    call.cancel()
        finally:
            await agg.stop(grace_s=0.1)

    run(body())
