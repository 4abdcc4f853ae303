"""The load side of `bench ingest` speaks gRPC over h2 itself: checked against a real server.

A wrong header, a flow-control slip or a miscounted stream end would make the benchmark's
figures lie, so each is exercised against grpcio's own server (`gputopo.runtime.grpcio`, with
the aggregator's options) on loopback: what the server decodes, what comes back, what ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from aggregator.server import SERVER_OPTIONS
from gputopo.app.benchmarks._h2load import H2Connection, grpc_headers, status_reason
from gputopo.app.benchmarks._ingest_load import _Load, _Node, _stamp
from gputopo.runtime import grpcio
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from gputopo.v1 import topology_pb2 as tpb

T = TypeVar("T")
REPORT = "/gputopo.v1.Reporter/Report"


class Recorder(rgrpc.ReporterServicer):
    """Acks every message with its sequence; a node named "quit" is refused at once, one named
    "late" after its message was acked (trailers after a response, not trailers-only)."""

    def __init__(self) -> None:
        self.seen: list[rpb.ReportRequest] = []
        self.finished = asyncio.Event()  # a handler returned or was cancelled

    async def Report(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[rpb.ReportRequest], context: Any
    ) -> AsyncIterator[rpb.ReportResponse]:
        try:
            async for msg in request_iterator:
                self.seen.append(msg)
                if msg.node_name == "quit":
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_name: quit")
                yield rpb.ReportResponse(
                    status=rpb.ReportResponse.STATUS_ACCEPTED, acked_sequence=msg.sequence
                )
                if msg.node_name == "late":
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many nodes")
        finally:
            self.finished.set()


def run(body: Callable[[Recorder, H2Connection], Awaitable[T]]) -> T:
    async def main() -> T:
        servicer = Recorder()
        server = grpcio.server(options=SERVER_OPTIONS)
        rgrpc.add_ReporterServicer_to_server(servicer, server)
        port = grpcio.bind(server, "127.0.0.1", 0)
        await server.start()
        conn = await H2Connection.open("127.0.0.1", port, grpc_headers(f"127.0.0.1:{port}", REPORT))
        try:
            return await body(servicer, conn)
        finally:
            conn.close()
            await server.stop(0)

    return asyncio.run(asyncio.wait_for(main(), timeout=60))


class Sink:
    """What one stream received: acked sequences, and why it ended."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.ended: list[str] = []
        self.changed = asyncio.Event()

    def message(self, data: bytes) -> None:
        self.acked.append(rpb.ReportResponse.FromString(data).acked_sequence)
        self.changed.set()

    def end(self, reason: str) -> None:
        self.ended.append(reason)
        self.changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.changed.clear()
            await self.changed.wait()


def test_messages_with_appended_stamps_arrive_whole_and_are_acked_per_stream() -> None:
    async def body(servicer: Recorder, conn: H2Connection) -> None:
        sinks = [Sink() for _ in range(3)]
        streams = [conn.open_stream(s.message, s.end) for s in sinks]
        head = rpb.ReportRequest(node_name="n1", incarnation=7, heartbeat=rpb.Heartbeat())
        sent_ns = time.time_ns()
        for seq in (1, 2, 3):
            for stream in streams:
                stream.send(head.SerializeToString() + _stamp(seq, sent_ns))
        for sink in sinks:
            await sink.until(lambda s=sink: len(s.acked) == 3)  # type: ignore[misc]
        assert [s.acked for s in sinks] == [[1, 2, 3]] * 3
        assert [s.ended for s in sinks] == [[], [], []]
        first = servicer.seen[0]
        assert (first.node_name, first.incarnation, first.sequence) == ("n1", 7, 1)
        assert first.HasField("heartbeat")
        assert first.sent_at.ToNanoseconds() == sent_ns

    run(body)


def test_a_message_past_the_servers_windows_waits_for_them_and_arrives_whole() -> None:
    # gRPC Core grants 4 MiB windows and frames of 4 MiB (not HTTP/2's 64 KiB and 16 KiB): two
    # messages of more than that on two streams of one connection must be cut into frames, wait
    # for both windows (WINDOW_UPDATE) and keep their order. Checked against the server's
    # SETTINGS below, so that a server granting more does not make this test pass unexercised.
    topo = tpb.NodeTopology(name="big", problems=["x" * 100] * 50_000)

    async def body(servicer: Recorder, conn: H2Connection) -> None:
        sinks = [Sink(), Sink()]
        streams = [conn.open_stream(s.message, s.end) for s in sinks]
        msg = rpb.ReportRequest(node_name="big", sequence=1, snapshot=rpb.Snapshot(topology=topo))
        server = conn._h2.remote_settings  # what the server granted (h2 tracks it)
        assert msg.ByteSize() > max(server.initial_window_size, server.max_frame_size)
        for stream in streams:
            stream.send(msg.SerializeToString())
            stream.send(rpb.ReportRequest(node_name="big", sequence=2).SerializeToString())
        for sink in sinks:
            await sink.until(lambda s=sink: len(s.acked) == 2)  # type: ignore[misc]
        assert [s.acked for s in sinks] == [[1, 2], [1, 2]]
        assert [s.ended for s in sinks] == [[], []]
        assert servicer.seen[0] == msg

    run(body)


def test_a_stream_the_server_ends_is_reported_and_the_others_go_on() -> None:
    async def body(servicer: Recorder, conn: H2Connection) -> None:
        quits, stays = Sink(), Sink()
        quitting = conn.open_stream(quits.message, quits.end)
        staying = conn.open_stream(stays.message, stays.end)
        quitting.send(rpb.ReportRequest(node_name="quit", sequence=1).SerializeToString())
        await quits.until(lambda: bool(quits.ended))
        assert quits.ended == ["the server ended the call: INVALID_ARGUMENT (node_name: quit)"]
        assert quits.acked == []
        quitting.send(b"")  # nothing is sent on an ended stream
        staying.send(rpb.ReportRequest(node_name="n2", sequence=5).SerializeToString())
        await stays.until(lambda: bool(stays.acked))
        assert stays.acked == [5]
        assert stays.ended == []

    run(body)


def test_a_non_ok_status_after_messages_is_reported_with_its_code_and_message() -> None:
    async def body(servicer: Recorder, conn: H2Connection) -> None:
        sink = Sink()
        stream = conn.open_stream(sink.message, sink.end)
        stream.send(rpb.ReportRequest(node_name="late", sequence=4).SerializeToString())
        await sink.until(lambda: bool(sink.ended))
        assert sink.acked == [4]
        assert sink.ended == ["the server ended the call: RESOURCE_EXHAUSTED (too many nodes)"]
        assert stream.status == "RESOURCE_EXHAUSTED"

    run(body)


def test_status_reasons_name_the_code_and_decode_the_message() -> None:
    assert status_reason([(b"grpc-status", b"0")]) == ("OK", "the server ended the call: OK")
    assert status_reason([(b"grpc-status", b"99")]) == ("99", "the server ended the call: 99")
    none = ("", "the server ended the call without grpc-status")
    assert status_reason([(b"x", b"y")]) == none
    encoded = [(b"grpc-status", b"13"), (b"grpc-message", b"disk 100%25 full%0A")]
    want = ("INTERNAL", "the server ended the call: INTERNAL (disk 100% full\n)")
    assert status_reason(encoded) == want


def test_the_load_counts_streams_the_server_ended_by_status_and_keeps_each_reason() -> None:
    async def body(servicer: Recorder, conn: H2Connection) -> None:
        load = _Load(2)
        nodes = [_Node(load, i, f"node-{i}", {}) for i in range(2)]
        for node in nodes:
            node.stream = conn.open_stream(node.on_message, node.on_end)
            node.stream.send(rpb.ReportRequest(node_name="quit", sequence=1).SerializeToString())
        await asyncio.wait_for(load.all_settled.wait(), 30)
        assert load.failed == {"grpc-status INVALID_ARGUMENT": 2}
        assert load.unacked == 2
        why = "the server ended the call: INVALID_ARGUMENT (node_name: quit)"
        assert sorted(load.errors) == [f"node-0: {why}", f"node-1: {why}"]

    run(body)


def test_cancel_ends_the_call_on_the_server_without_reporting_it_as_a_failure() -> None:
    async def body(servicer: Recorder, conn: H2Connection) -> None:
        sink = Sink()
        stream = conn.open_stream(sink.message, sink.end)
        stream.send(rpb.ReportRequest(node_name="n3", sequence=1).SerializeToString())
        await sink.until(lambda: bool(sink.acked))
        stream.cancel()
        await asyncio.wait_for(servicer.finished.wait(), 30)
        assert sink.ended == []

    run(body)


def test_the_stamp_is_the_protobuf_encoding_of_sequence_and_send_time() -> None:
    for seq, ns in ((1, 0), (300, 1_764_000_000_123_456_789), (2**40, 999_999_999)):
        want = rpb.ReportRequest(sequence=seq)
        want.sent_at.FromNanoseconds(ns)
        got = rpb.ReportRequest.FromString(_stamp(seq, ns))
        assert got == want


def test_a_server_that_goes_away_ends_every_open_stream_once_and_the_connection() -> None:
    # The bench counts each such end as a failed stream: each must end exactly once, with a
    # reason, and the connection must open no more streams.
    async def main() -> tuple[list[Sink], H2Connection]:
        server = grpcio.server(options=SERVER_OPTIONS)
        rgrpc.add_ReporterServicer_to_server(Recorder(), server)
        port = grpcio.bind(server, "127.0.0.1", 0)
        await server.start()
        conn = await H2Connection.open("127.0.0.1", port, grpc_headers(f"127.0.0.1:{port}", REPORT))
        sinks = [Sink() for _ in range(3)]
        for sink in sinks:
            stream = conn.open_stream(sink.message, sink.end)
            stream.send(rpb.ReportRequest(node_name="n", sequence=1).SerializeToString())
        for sink in sinks:
            await sink.until(lambda s=sink: bool(s.acked))  # type: ignore[misc]
        await server.stop(0)
        for sink in sinks:
            await sink.until(lambda s=sink: bool(s.ended))  # type: ignore[misc]
        await asyncio.sleep(0.1)  # anything more the closing connection would report
        conn.close()
        return sinks, conn

    sinks, conn = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert [len(s.ended) for s in sinks] == [1, 1, 1], [s.ended for s in sinks]
    # gRPC's GOAWAY, PING, GOAWAY is the server leaving (GOAWAY, or each call's end where
    # that came first), not an HTTP/2 protocol error of ours
    leaving = ("GOAWAY", "the server ended the call", "RST_STREAM", "connection lost")
    assert all(s.ended[0].startswith(leaving) for s in sinks), [s.ended for s in sinks]
    assert conn.closed is not None
    assert conn.capacity == 0
