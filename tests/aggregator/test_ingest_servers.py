"""Several gRPC servers share the aggregator's port (`AggregatorConfig.grpc_servers`): one state
behind them, one owner per port, all stopped together. Real sockets on loopback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from aggregator.server import GRPC_SERVERS, Aggregator, AggregatorConfig
from gputopo.runtime import grpcio
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.aggregator.test_ingest import ACCEPTED, snapshot_msg

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))  # type: ignore[arg-type]


def listeners(port: int) -> int:
    """TCP sockets listening on `port`, from /proc/net (state 0A is LISTEN)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def end_code(
    call: grpc.aio.StreamStreamCall[rpb.ReportRequest, rpb.ReportResponse],
) -> grpc.StatusCode:
    """How a call ended (its next read sees the end, or raises it), within 10 s."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        await asyncio.wait_for(call.read(), 10)
    return await call.code()


def own_connection(target: str) -> grpc.aio.Channel:
    """A channel with a connection of its own (channels of one process otherwise share one)."""
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


async def snapshot_streams(
    channels: list[grpc.aio.Channel],
) -> list[grpc.aio.StreamStreamCall[rpb.ReportRequest, rpb.ReportResponse]]:
    """One Report stream per channel, node `n<i>`, each having sent its snapshot."""
    calls = []
    for i, channel in enumerate(channels):
        call = rgrpc.ReporterStub(channel).Report()
        await call.write(snapshot_msg(1, name=f"n{i}"))
        calls.append(call)
    return calls


def test_the_default_is_several_servers_listening_on_one_port() -> None:
    assert GRPC_SERVERS > 1

    async def body() -> None:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        try:
            assert listeners(agg.grpc_port) == GRPC_SERVERS
        finally:
            await agg.stop(grace_s=0.1)
        assert listeners(agg.grpc_port) == 0

    run(body())


def test_nodes_on_many_connections_land_in_the_one_state() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(grpc_servers=4))
        await agg.start()
        channels = [own_connection(agg.grpc_target) for _ in range(16)]
        try:
            calls = await snapshot_streams(channels)
            answers = [await call.read() for call in calls]
            assert all(isinstance(a, rpb.ReportResponse) for a in answers)
            assert [a.status for a in answers if isinstance(a, rpb.ReportResponse)] == [
                ACCEPTED
            ] * 16
            assert sorted(agg.state.node_names) == sorted(f"n{i}" for i in range(16))
            assert agg.reporter.stats.streams == 16  # one count across the servers
            # a stream on another connection (maybe another server) supersedes the node's
            # first stream: the claims are the one service's, not a server's
            extra = own_connection(agg.grpc_target)
            channels.append(extra)
            newer = rgrpc.ReporterStub(extra).Report()
            await newer.write(snapshot_msg(1, name="n0", incarnation=200))
            assert (await newer.read()).status == ACCEPTED  # type: ignore[union-attr]
            assert agg.reporter.stats.superseded == 1
        finally:
            for channel in channels:
                await channel.close()
            await agg.stop(grace_s=0.1)

    run(body())


@pytest.mark.parametrize("servers", [1, 4], ids=["one server", "four servers"])
def test_a_second_aggregator_on_the_port_is_refused_naming_it(servers: int) -> None:
    async def body() -> None:
        first = Aggregator(AggregatorConfig(grpc_servers=4))
        await first.start()
        try:
            second = Aggregator(AggregatorConfig(grpc_port=first.grpc_port, grpc_servers=servers))
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.grpc_port}"):
                await second.start()
            assert listeners(first.grpc_port) == 4  # the first one's, untouched
        finally:
            await first.stop(grace_s=0.1)

    run(body())


def test_servers_sharing_a_port_refuse_one_another_process_listens_on() -> None:
    async def body() -> None:
        with socket.socket() as other:  # no SO_REUSEPORT, as another program's listener
            other.bind(("127.0.0.1", 0))
            other.listen()
            port = other.getsockname()[1]
            servers = [grpcio.server(share_port=True) for _ in range(3)]
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port} for gRPC"):
                grpcio.bind_shared(servers, "127.0.0.1", port)
            await asyncio.gather(*(server.stop(None) for server in servers))

    run(body())


def test_stop_ends_the_streams_of_every_server_and_frees_the_port() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(grpc_servers=4))
        await agg.start()
        port = agg.grpc_port
        channels = [own_connection(agg.grpc_target) for _ in range(12)]
        try:
            calls = await snapshot_streams(channels)
            for call in calls:
                answer = await call.read()
                assert isinstance(answer, rpb.ReportResponse)
                assert answer.status == ACCEPTED
            await agg.stop(grace_s=0.1)
            # every stream ends, whichever server held it: none waits past the grace period
            codes = [await end_code(call) for call in calls]
            assert codes == [grpc.StatusCode.UNAVAILABLE] * 12
            assert listeners(port) == 0
            assert port_is_free(port)
        finally:
            for channel in channels:
                await channel.close()

    run(body())


def test_no_server_at_all_is_refused() -> None:
    async def body() -> None:
        with pytest.raises(ValueError, match="grpc_servers must be at least 1, not 0"):
            await Aggregator(AggregatorConfig(grpc_servers=0)).start()

    run(body())


def test_the_command_line_default_is_the_configs() -> None:
    from gputopo.app.commands.aggregator import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).grpc_servers == GRPC_SERVERS
