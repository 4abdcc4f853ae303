"""A server for tests/aggregator/test_waiting_streams.py: the aggregator's gRPC server and options
over mutual TLS, whose event loop blocks once it serves, so that every call waits in gRPC Core
as a herd does while the loop decodes snapshots.

    python -m tests.aggregator.waiting_server aggregator|control CERT KEY CA

`control` leaves the HTTP/2 window options to gRPC's defaults. Prints the bound port, then
blocks until stdin is closed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from aggregator.server import SERVER_OPTIONS
from gputopo.runtime import grpcio
from gputopo.runtime.tls import TlsFiles
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc

__all__ = ["WINDOW_OPTIONS", "main"]

# What bounds a waiting stream's window; the control leaves them to gRPC.
WINDOW_OPTIONS = ("grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes")


class _Reporter(rgrpc.ReporterServicer):
    async def Report(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[rpb.ReportRequest],
        context: grpc.aio.ServicerContext[rpb.ReportRequest, rpb.ReportResponse],
    ) -> AsyncIterator[rpb.ReportResponse]:
        async for _ in request_iterator:
            raise AssertionError("no call is taken while the loop is blocked")
        yield rpb.ReportResponse()


async def _serve(kind: str, tls: TlsFiles) -> None:
    options = [o for o in SERVER_OPTIONS if kind != "control" or o[0] not in WINDOW_OPTIONS]
    server = grpcio.server(options=options)
    rgrpc.add_ReporterServicer_to_server(_Reporter(), server)
    port = grpcio.bind(server, "127.0.0.1", 0, tls=tls)
    await server.start()
    print(port, flush=True)
    sys.stdin.read()  # blocks the loop itself: Core goes on reading, nobody takes a call
    await server.stop(0)


def main() -> None:
    kind, cert, key, ca = sys.argv[1:5]
    asyncio.run(_serve(kind, TlsFiles(cert=Path(cert), key=Path(key), ca=Path(ca))))


if __name__ == "__main__":
    main()
