"""A Reporter servicer that acknowledges every message and announces a heartbeat interval:
what the exporter's stream and the bench's load generator are each tested against."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc

__all__ = ["Acker"]


class Acker(rgrpc.ReporterServicer):
    """Acks every message announcing `every` seconds (0: a zero Duration; None: no interval at
    all), which a test may change between messages; records the kind of each message."""

    def __init__(self, every: float | None) -> None:
        self.every = every
        self.kinds: list[str] = []

    async def Report(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[rpb.ReportRequest], context: Any
    ) -> AsyncIterator[rpb.ReportResponse]:
        async for msg in request_iterator:
            self.kinds.append(msg.WhichOneof("payload") or "")
            resp = rpb.ReportResponse(
                status=rpb.ReportResponse.STATUS_ACCEPTED, acked_sequence=msg.sequence
            )
            if self.every is not None:
                every = Duration()
                every.FromNanoseconds(round(self.every * 1e9))
                resp.heartbeat_interval.CopyFrom(every)
            yield resp
