"""How fast grpc.aio takes new calls while its event loop is busy: one server against several
sharing a port (the reason for `aggregator.server.GRPC_SERVERS`).

N ack-only Reporter servers (`gputopo.runtime.grpcio.bind_shared`) and a task that holds every
loop turn for `--busy-ms` (as an aggregator's turns are held by the reports of the nodes already
connected) run in one loop; `--streams` Report streams over connections of
`--per-connection` (the bench's HTTP/2 load side, `_h2load`) each send one heartbeat. The
figure is streams acknowledged per second, from the first stream opened to the last ack:

    for n in 1 4 8; do .venv/bin/python scripts/bench_accept.py --servers $n --busy-ms 5; done

Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from gputopo.app.benchmarks._h2load import H2Connection, grpc_headers
from gputopo.runtime import grpcio
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc


class _AckOnly(rgrpc.ReporterServicer):
    async def Report(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        async for msg in request_iterator:
            yield rpb.ReportResponse(
                status=rpb.ReportResponse.STATUS_ACCEPTED, acked_sequence=msg.sequence
            )


async def _measure(servers: int, streams: int, per_connection: int, busy_ms: float) -> float:
    """Seconds until `streams` new calls were taken and answered."""
    running = []
    for _ in range(servers):
        server = grpcio.server(
            options=[("grpc.server_max_unrequested_time_in_server", 600)],
            share_port=servers > 1,
        )
        rgrpc.add_ReporterServicer_to_server(_AckOnly(), server)
        running.append(server)
    port = grpcio.bind_shared(running, "127.0.0.1", 0)
    await asyncio.gather(*(server.start() for server in running))
    stop = asyncio.Event()

    async def busy() -> None:
        while not stop.is_set():
            time.sleep(busy_ms / 1000)  # noqa: ASYNC251 - holds the turn, as work on the loop does
            await asyncio.sleep(0)

    holder = asyncio.create_task(busy())
    headers = grpc_headers(f"127.0.0.1:{port}", "/gputopo.v1.Reporter/Report")
    beat = rpb.ReportRequest(
        node_name="n", incarnation=1, sequence=1, heartbeat=rpb.Heartbeat()
    ).SerializeToString()
    acked = 0
    all_acked = asyncio.Event()

    def on_message(_: bytes) -> None:
        nonlocal acked
        acked += 1
        if acked == streams:
            all_acked.set()

    connections: list[H2Connection] = []
    began = time.monotonic()
    try:
        for i in range(streams):
            if i % per_connection == 0:
                connections.append(await H2Connection.open("127.0.0.1", port, headers))
            stream = connections[-1].open_stream(on_message, lambda _: None)
            stream.send(beat)  # framed by the stream
        await asyncio.wait_for(all_acked.wait(), 600)
        return time.monotonic() - began
    finally:
        stop.set()
        await holder
        for connection in connections:
            connection.close()
        await asyncio.gather(*(server.stop(0) for server in running))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--per-connection", type=int, default=100)
    parser.add_argument("--busy-ms", type=float, default=5.0)
    args = parser.parse_args()
    seconds = asyncio.run(_measure(args.servers, args.streams, args.per_connection, args.busy_ms))
    print(
        json.dumps(
            {
                "servers": args.servers,
                "streams": args.streams,
                "busy_ms": args.busy_ms,
                "seconds": round(seconds, 2),
                "accepted_per_second": round(args.streams / seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
