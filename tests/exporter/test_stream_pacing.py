"""The exporter heartbeats at the interval the aggregator's acks announce (real gRPC on
loopback, a Reporter that acks every message with the interval the test chose)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import pytest

from exporter.stream import HEARTBEAT_RANGE_S, ReportStream
from gputopo.runtime.backoff import Backoff
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.builders import nvswitch_node
from tests.report_acker import Acker

T = TypeVar("T")
NODE = nvswitch_node("n1", gpus=2, nics=1)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))  # type: ignore[arg-type]


async def streaming(
    acker: Acker, configured_s: float, body: Callable[[ReportStream], Awaitable[None]]
) -> None:
    server = grpc.aio.server()
    rgrpc.add_ReporterServicer_to_server(acker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = ReportStream(
                node_name="n1",
                source=lambda: NODE,
                channel=channel,
                heartbeat_interval_s=configured_s,
                backoff=Backoff(base_s=0.05, cap_s=0.1),
            )
            task = asyncio.create_task(stream.run())
            try:
                await body(stream)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        await server.stop(0)


async def until(check: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Poll `check` (generous `limit_s`: a loaded machine may be slow, a pass is quick)."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


def test_an_exporter_told_a_long_interval_sends_no_heartbeat_early() -> None:
    """Configured 0.2 s, told 60 s: once it heard, a second passes without a heartbeat (five
    at its own interval)."""
    acker = Acker(60.0)

    async def body(stream: ReportStream) -> None:
        await until(lambda: stream.heartbeat_interval_s == 60.0, "heard 60 s")
        assert stream.stats.heartbeat_interval_s == 60.0  # what the metric reports
        before = acker.kinds.count("heartbeat")  # one may have left before the first ack
        await asyncio.sleep(1.0)
        assert acker.kinds.count("heartbeat") == before
        assert acker.kinds[0] == "snapshot"

    run(streaming(acker, 0.2, body))


def test_an_exporter_told_a_short_interval_heartbeats_at_it() -> None:
    """Configured 60 s, told 0.2 s: heartbeats come (none would for a minute otherwise)."""
    acker = Acker(0.2)

    async def body(stream: ReportStream) -> None:
        await until(lambda: acker.kinds.count("heartbeat") >= 3, "three heartbeats")
        assert stream.heartbeat_interval_s == 0.2

    run(streaming(acker, 60.0, body))


def test_an_ack_without_an_interval_keeps_the_configured_one() -> None:
    acker = Acker(None)

    async def body(stream: ReportStream) -> None:
        await until(lambda: acker.kinds.count("heartbeat") >= 2, "two heartbeats")
        assert stream.heartbeat_interval_s == stream.stats.heartbeat_interval_s == 0.2

    run(streaming(acker, 0.2, body))


@pytest.mark.parametrize(
    ("announced", "want"),
    [
        pytest.param(0.0, 7.0, id="zero means the configured interval"),
        pytest.param(20.0, 20.0, id="a sane one is obeyed"),
        pytest.param(1e6, HEARTBEAT_RANGE_S[1], id="days are clamped to the ceiling"),
        pytest.param(-5.0, HEARTBEAT_RANGE_S[0], id="negative is clamped to the floor"),
        pytest.param(1e-6, HEARTBEAT_RANGE_S[0], id="a microsecond is clamped to the floor"),
    ],
)
def test_announced_intervals_are_obeyed_within_a_sane_range(announced: float, want: float) -> None:
    async def scenario() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        stream = ReportStream(
            node_name="n1", source=lambda: NODE, channel=channel, heartbeat_interval_s=7.0
        )
        stream._obey(announced)
        assert stream.heartbeat_interval_s == want
        await channel.close()

    asyncio.run(scenario())


def test_a_bad_interval_is_logged_once_never_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        stream = ReportStream(node_name="n1", source=lambda: NODE, channel=channel)
        with caplog.at_level(logging.WARNING, logger="exporter.stream"):
            for _ in range(3):
                stream._obey(1e6)
                stream._obey(-1.0)
        await channel.close()

    asyncio.run(scenario())
    warnings = [r for r in caplog.records if "heartbeat every" in r.getMessage()]
    assert len(warnings) == 1, warnings
