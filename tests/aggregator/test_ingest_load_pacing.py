"""The bench's load obeys the heartbeat interval acknowledgements announce, as an exporter does
(`gputopo.app.benchmarks._ingest_load`, over h2 against grpcio's server on loopback)."""

from __future__ import annotations

import asyncio

from aggregator.server import SERVER_OPTIONS
from exporter.stream import HEARTBEAT_RANGE_S
from gputopo.app.benchmarks import _ingest_load
from gputopo.app.benchmarks._h2load import H2Connection, grpc_headers
from gputopo.app.benchmarks._ingest_load import _Load, _Node
from gputopo.runtime import grpcio
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.report_acker import Acker

REPORT = "/gputopo.v1.Reporter/Report"
MESSAGES = {
    "snapshot": [rpb.ReportRequest(node_name="n", snapshot=rpb.Snapshot()).SerializeToString()],
    "delta": [rpb.ReportRequest(node_name="n", delta=rpb.Delta()).SerializeToString()],
    "heartbeat": [rpb.ReportRequest(node_name="n", heartbeat=rpb.Heartbeat()).SerializeToString()],
}


async def acked(node: _Node, every: float) -> None:
    """Until the node's acks have announced `every` (and nothing waits for an ack)."""
    for _ in range(3000):  # 30 s at most: generous for a loaded machine, a pass is quick
        if node.every == every and not node.sent:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never heard {every} s: {node.every}")


def test_the_load_heartbeats_after_the_announced_silence_and_a_delta_resets_it() -> None:
    async def main() -> None:
        servicer = Acker(20.0)
        server = grpcio.server(options=SERVER_OPTIONS)
        rgrpc.add_ReporterServicer_to_server(servicer, server)
        port = grpcio.bind(server, "127.0.0.1", 0)
        await server.start()
        conn = await H2Connection.open("127.0.0.1", port, grpc_headers(f"127.0.0.1:{port}", REPORT))
        try:
            load = _Load(1, heartbeat_s=5.0)
            node = _Node(load, 0, "n", MESSAGES)
            node.stream = conn.open_stream(node.on_message, node.on_end)
            node.send("snapshot")
            node.next_delta = node.last_sent + 100.0
            node.schedule()
            assert node.due == node.last_sent + 5.0  # its own interval until told
            await acked(node, 20.0)
            assert node.due == node.last_sent + 20.0  # told 20 s: no heartbeat before

            node.next_delta = node.last_sent + 10.0
            node.schedule()
            node.fire(node.due, 10.0)  # the delta is due first, and resets the silence
            assert servicer.kinds[-1:] != ["heartbeat"]
            assert node.due == node.next_delta  # the next delta comes before 20 s of silence
            await acked(node, 20.0)
            assert servicer.kinds == ["snapshot", "delta"]

            servicer.every = 2.0
            node.fire(node.due, 10.0)  # the second delta, acked with 2 s
            await acked(node, 2.0)
            assert node.due == node.last_sent + 2.0  # a heartbeat before the next delta
            node.fire(node.due, 10.0)
            servicer.every = 0.0  # a zero interval: the configured one again
            await acked(node, 5.0)
            assert servicer.kinds == ["snapshot", "delta", "delta", "heartbeat"]
            assert load.timers  # the live entry is among them
            assert any(entry[0] == node.due for entry in load.timers)
        finally:
            conn.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), timeout=60))


def test_the_load_clamps_announced_intervals_as_the_exporter_does() -> None:
    assert _ingest_load.HEARTBEAT_RANGE_S == HEARTBEAT_RANGE_S
