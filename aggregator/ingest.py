"""The Reporter gRPC service: exporters stream their node's topology here.

Every message is validated before it touches the state; a message that is not valid ends the
stream with INVALID_ARGUMENT naming the field (the exporter reconnects and starts over with a
snapshot). Ordering, replay and staleness rules live in `aggregator.state`; this module only
translates between the wire and the state and answers every message with an acknowledgement.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf.duration_pb2 import Duration

from aggregator.state import ClusterState, ReportOutcome
from gputopo.codec import CodecError, delta_from_proto, topology_from_proto
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc

__all__ = ["ReporterService"]

log = logging.getLogger(__name__)

_STATUS = {
    ReportOutcome.ACCEPTED: rpb.ReportResponse.STATUS_ACCEPTED,
    ReportOutcome.IGNORED: rpb.ReportResponse.STATUS_IGNORED,
    ReportOutcome.RESYNC: rpb.ReportResponse.STATUS_RESYNC,
}


class ReporterService(rgrpc.ReporterServicer):
    """Applies exporter reports to the cluster state."""

    def __init__(self, state: ClusterState, *, heartbeat_interval_s: float = 5.0) -> None:
        self._state = state
        self._heartbeat = Duration()
        self._heartbeat.FromNanoseconds(int(heartbeat_interval_s * 1e9))

    async def Report(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[rpb.ReportRequest],
        context: grpc.aio.ServicerContext[rpb.ReportRequest, rpb.ReportResponse],
    ) -> AsyncIterator[rpb.ReportResponse]:
        """One stream per node: validate, apply, acknowledge every message."""
        node = ""
        async for msg in request_iterator:
            try:
                outcome = self._apply(msg, node)
            except CodecError as err:
                log.warning("rejected report from %s: %s", msg.node_name or "?", err)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            node = msg.node_name
            rec = self._state.record(node)
            yield rpb.ReportResponse(
                status=_STATUS[outcome],
                acked_sequence=msg.sequence if outcome is ReportOutcome.ACCEPTED else 0,
                message="send a snapshot" if outcome is ReportOutcome.RESYNC else "",
                heartbeat_interval=self._heartbeat,
                topology_generation=rec.generation if rec is not None else 0,
            )

    def _apply(self, msg: rpb.ReportRequest, stream_node: str) -> ReportOutcome:
        if not msg.node_name:
            raise CodecError("node_name", "is required")
        if stream_node and msg.node_name != stream_node:
            raise CodecError(
                "node_name", f"is {msg.node_name!r}, but this stream reports {stream_node!r}"
            )
        if msg.incarnation == 0:
            raise CodecError("incarnation", "must be set (unix nanoseconds at exporter start)")
        if msg.sequence == 0:
            raise CodecError("sequence", "must start at 1")
        kind = msg.WhichOneof("payload")
        seq = {"incarnation": msg.incarnation, "sequence": msg.sequence}
        if kind == "snapshot":
            topology = topology_from_proto(msg.snapshot.topology, "snapshot.topology")
            if topology.name != msg.node_name:
                raise CodecError(
                    "snapshot.topology.name",
                    f"is {topology.name!r}, but node_name is {msg.node_name!r}",
                )
            return self._state.apply_snapshot(topology, **seq)
        if kind == "delta":
            return self._state.apply_delta(msg.node_name, delta_from_proto(msg.delta), **seq)
        if kind == "heartbeat":
            return self._state.heartbeat(msg.node_name, **seq)
        raise CodecError("payload", "one of snapshot, delta or heartbeat is required")
