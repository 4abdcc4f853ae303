"""Peer probe results travel in deltas; the codec reads back what the stream writes."""

from __future__ import annotations

import re

import pytest

from exporter.stream import ReportStream
from gputopo.codec import CodecError, peer_probe_from_proto, peer_probe_to_proto
from gputopo.topology import Measurement, NodeTopology
from gputopo.v1 import reporter_pb2 as rpb
from tests.builders import nvswitch_node


def test_a_peer_probe_survives_the_codec() -> None:
    m = Measurement(
        gbps=11.5,
        method="tcp",
        size_bytes=64 << 20,
        duration_s=0.2,
        measured_at=1e9,
        latency_us=40.0,
    )
    assert peer_probe_from_proto(peer_probe_to_proto("node-b", m)) == ("node-b", m)


def test_a_peer_probe_without_a_peer_is_refused_naming_the_field() -> None:
    with pytest.raises(CodecError, match=re.escape("delta.peer_probes[0].peer: is required")):
        peer_probe_from_proto(rpb.PeerProbe(), "delta.peer_probes[0]")


def test_probes_ride_the_next_delta_or_follow_a_snapshot() -> None:
    import asyncio

    import grpc

    async def scenario() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        node = nvswitch_node("n")
        stream = ReportStream(node_name="n", source=lambda: node, channel=channel)
        m = Measurement(gbps=3.0, method="tcp")
        stream.add_peer_probes({"b": m})
        first = stream._next_message(None, node)  # a snapshot first: probes wait
        assert first.WhichOneof("payload") == "snapshot"
        second = stream._next_message(node, node)
        assert second.WhichOneof("payload") == "delta"
        assert [p.peer for p in second.delta.peer_probes] == ["b"]
        third = stream._next_message(node, node)
        assert third.WhichOneof("payload") == "heartbeat"
        assert stream.stats.peer_probes_sent == 1
        await channel.close()

    asyncio.run(scenario())


def test_an_unchanged_node_without_probes_sends_heartbeats() -> None:
    import asyncio

    import grpc

    async def scenario() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        node = NodeTopology(name="n")
        stream = ReportStream(node_name="n", source=lambda: node, channel=channel)
        assert stream._next_message(node, node).WhichOneof("payload") == "heartbeat"
        await channel.close()

    asyncio.run(scenario())
