"""The Reporter gRPC service: exporters stream their node's topology here.

Contract, per message:

- Validation first. A message that is not valid ends the stream with INVALID_ARGUMENT naming
  the field (`delta.gpus[0].index: ...`); the exporter reconnects and starts over with a
  snapshot. Nothing of an invalid message reaches the state. Checked: the node name is a valid
  Kubernetes node name and stays the same on a stream, incarnation and sequence are set, the
  probe address is host:port, every enum is known, GPUs and NICs are numbered 0..n-1 (also
  after a delta is applied), links join devices that exist, measurements are finite.
- Ordering, replay and staleness are `aggregator.state`'s rules: a report not newer than the
  accepted one is IGNORED, a delta without its snapshot gets RESYNC.
- One stream per node. A second stream for a node whose incarnation is at least the current
  stream's replaces it (a restarted exporter, or a reconnect while the old connection is
  half-dead): the old stream is ended with ABORTED at its next message, and nothing it sends
  is applied any more. One with an older incarnation is refused with ALREADY_EXISTS, so two
  exporters claiming one node cannot take turns.
- An incarnation is the exporter's start time, so one further in the future than clocks can
  disagree (`INCARNATION_FUTURE_S`) is a forgery or a broken clock: refused with
  INVALID_ARGUMENT before it can claim the node. Otherwise one forged 2^64-1 would outrank every
  real exporter for good. And a stream that holds the node (no live stream has a newer
  incarnation) is the node's exporter now: what a gone stream with a higher incarnation left in
  the state no longer outranks it (`ClusterState.yield_to`), so a restarted or reconnected
  exporter always gets its node back. Every refusal is one WARNING line naming the peer, and
  counted (`reports_rejected{field}`, `streams_refused`). (Reads stay in the handler's own task:
  racing a read against another event from a second task loses messages in grpc.aio under
  load.)
- Every acknowledgement carries the heartbeat interval the aggregator wants now
  (`gputopo.heartbeats`: the configured one, or longer with many live streams, so heartbeats
  stay under `max_heartbeats_per_second`); `pace()` moves it, once per housekeeping tick.
- Every message is acknowledged; acknowledgements carry probe targets when it is the node's
  turn (`aggregator.probes`), and peer probe results in deltas feed the probe inference.
  Every message states the node's probe address (as `exporter.stream` sends it); an empty
  one means the node does not answer probes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf.duration_pb2 import Duration

from aggregator.probes import ProbeCoordinator
from aggregator.state import ClusterState, ReportOutcome
from aggregator.tokens import IdentityError, TokenNodes
from gputopo import bounds
from gputopo.codec import (
    CodecError,
    check_limits,
    delta_from_proto,
    gpu_use_from_proto,
    peer_probe_from_proto,
    seconds,
    topology_from_proto,
)
from gputopo.delta import DeltaError
from gputopo.gpu_use import GpuUse
from gputopo.heartbeats import DEFAULT_MAX_HEARTBEATS_PER_SECOND, HeartbeatPacer
from gputopo.runtime.identity import node_of_peer, report_denial
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from gputopo.v1 import topology_pb2 as tpb

__all__ = [
    "DEFAULT_MAX_NODES",
    "FRESHNESS_BUCKETS",
    "INCARNATION_FUTURE_S",
    "IngestStats",
    "ReporterService",
    "validate_node_name",
]

log = logging.getLogger(__name__)

_STATUS = {
    ReportOutcome.ACCEPTED: rpb.ReportResponse.STATUS_ACCEPTED,
    ReportOutcome.IGNORED: rpb.ReportResponse.STATUS_IGNORED,
    ReportOutcome.RESYNC: rpb.ReportResponse.STATUS_RESYNC,
}
# Kubernetes node names are DNS-1123 subdomains: the labels published go on a Node by this name.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")

# How far an incarnation (unix ns at exporter start) may be ahead of this aggregator's clock:
# generous for unsynchronised clocks, and small enough that a forged one cannot pin a node.
INCARNATION_FUTURE_S = 300.0

# Seconds from an exporter sending a report to the state having applied it.
FRESHNESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# Far past the largest clusters built (100k GPUs is 12,500 eight-GPU nodes).
DEFAULT_MAX_NODES = 50_000


@dataclass(slots=True)
class IngestStats:
    """What ingest has seen, for metrics: plain counts, read by the collector."""

    messages: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, outcome)
    rejected: Counter[str] = field(default_factory=Counter)  # field path, indices dropped
    superseded: int = 0
    refused: int = 0
    streams: int = 0
    ghosts: int = 0  # nodes forgotten: silent, no stream, no Node object (the server's count)
    heartbeat_interval_s: float = 0.0  # what acknowledgements announce now
    freshness_buckets: list[int] = field(default_factory=lambda: [0] * len(FRESHNESS_BUCKETS))
    freshness_count: int = 0
    freshness_sum: float = 0.0

    def observe_freshness(self, seconds: float) -> None:
        """One report's send-to-applied time (negative skew counts as 0)."""
        seconds = max(seconds, 0.0)
        self.freshness_count += 1
        self.freshness_sum += seconds
        for i, bound in enumerate(FRESHNESS_BUCKETS):
            if seconds <= bound:
                self.freshness_buckets[i] += 1


def validate_node_name(name: str, path: str = "node_name") -> None:
    """CodecError unless `name` can name a Kubernetes Node."""
    if not name:
        raise CodecError(path, "is required")
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise CodecError(
            path,
            f"{name[:80]!r} is not a Kubernetes node name (lower-case DNS subdomain, "
            "at most 253 characters)",
        )


@dataclass(slots=True)
class _Claim:
    incarnation: int
    superseded: asyncio.Event = field(default_factory=asyncio.Event)


class ReporterService(rgrpc.ReporterServicer):
    """Applies exporter reports to the cluster state (see the module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        *,
        heartbeat_interval_s: float = 5.0,
        stale_after_s: float = 30.0,
        max_heartbeats_per_second: float = DEFAULT_MAX_HEARTBEATS_PER_SECOND,
        probes: ProbeCoordinator | None = None,
        stats: IngestStats | None = None,
        wall_clock: Callable[[], float] = time.time,
        require_node_identity: bool = False,
        token_nodes: TokenNodes | None = None,
        max_nodes: int = DEFAULT_MAX_NODES,
    ) -> None:
        self._state = state
        # ... or a projected ServiceAccount token bound to a pod on that node (aggregator.tokens)
        self._tokens = token_nodes
        self._max_nodes = max_nodes
        # Node identity (gputopo.runtime.identity): a certificate naming a node may report only
        # that node; with `require_node_identity`, a stream without one may report nothing.
        self._require_identity = require_node_identity
        self._probes = probes
        self.stats = stats or IngestStats()
        self._wall = wall_clock
        # The interval every ack announces, and the staleness it implies (`pace`).
        self.pacer = HeartbeatPacer(
            base_s=heartbeat_interval_s,
            stale_after_s=stale_after_s,
            max_per_second=max_heartbeats_per_second,
            clock=wall_clock,
        )
        self._heartbeat = Duration()
        self._announce()
        self._claims: dict[str, _Claim] = {}

    async def Report(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[rpb.ReportRequest],
        context: grpc.aio.ServicerContext[rpb.ReportRequest, rpb.ReportResponse],
    ) -> AsyncIterator[rpb.ReportResponse]:
        """One stream per node: validate, apply, acknowledge every message."""
        node = ""
        probe_address = ""  # the last one checked on this stream
        claim: _Claim | None = None
        peer = context.peer()
        self.stats.streams += 1
        try:
            async for msg in request_iterator:
                if claim is not None and claim.superseded.is_set():
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        f"node_name: a newer stream reports {node!r}; this one is closed",
                    )
                kind = msg.WhichOneof("payload") or "none"
                try:
                    self._check_envelope(msg, node, probe_address)
                    probe_address = msg.probe_address
                    self._check_incarnation(msg.incarnation)
                    if not node:
                        peer_node, lie = await self._peer_node(context)
                        denial = lie or report_denial(
                            peer_node, msg.node_name, require=self._require_identity
                        )
                        if denial is not None:
                            # gputopo_aggregator_reports_rejected_total{field="node_identity"}
                            self.stats.rejected["node_identity"] += 1
                            log.warning("refused report from %s: %s", peer, denial)
                            await context.abort(grpc.StatusCode.PERMISSION_DENIED, denial)
                        if self._over_capacity(msg.node_name):
                            self.stats.rejected["node_capacity"] += 1
                            why = (
                                f"node_name: {msg.node_name!r} would be node {self._max_nodes + 1};"
                                f" this aggregator keeps at most {self._max_nodes}"
                                " (--max-nodes)"
                            )
                            log.warning("refused report stream from %s: %s", peer, why)
                            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
                        claim = self._claim(msg.node_name, msg.incarnation)
                        if claim is None:
                            self.stats.refused += 1
                            refusal = (
                                f"node_name: {msg.node_name!r} is reported by a newer exporter "
                                f"on another stream (incarnation "
                                f"{self._claims[msg.node_name].incarnation})"
                            )
                            log.warning("refused report stream from %s: %s", peer, refusal)
                            await context.abort(grpc.StatusCode.ALREADY_EXISTS, refusal)
                        self._state.yield_to(msg.node_name, msg.incarnation)
                        node = msg.node_name
                    elif claim is not None and msg.incarnation > claim.incarnation:
                        claim.incarnation = msg.incarnation
                    outcome = self._apply(msg, kind)
                except (CodecError, DeltaError) as err:  # a delta its base cannot take, too
                    self.stats.rejected[re.sub(r"\[\d+\]", "[]", err.field)] += 1
                    self.stats.messages[(kind, "rejected")] += 1
                    log.warning(
                        "rejected report from %s (node %s): %s", peer, msg.node_name or "?", err
                    )
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                self.stats.messages[(kind, outcome.value)] += 1
                yield self._response(msg, outcome)
        finally:
            self.stats.streams -= 1
            if node and self._claims.get(node) is claim:
                del self._claims[node]

    async def _peer_node(
        self, context: grpc.aio.ServicerContext[rpb.ReportRequest, rpb.ReportResponse]
    ) -> tuple[str | None, str | None]:
        """(the node the peer proved, why its token proves nothing): a certificate naming a
        node first, else a bearer token. A token that does not check out is a refusal even
        where identity is optional: it is a claim, and a false one."""
        node = node_of_peer(context)
        if node is not None or self._tokens is None:
            return node, None
        token = next(
            (
                str(value)[len("Bearer ") :]
                for key, value in context.invocation_metadata() or ()
                if key == "authorization" and str(value).startswith("Bearer ")
            ),
            "",
        )
        if not token:
            return None, None
        try:
            return await self._tokens.node_of(token), None
        except IdentityError as err:
            return None, str(err)

    def pace(self) -> float:
        """Move the announced heartbeat interval to the live streams (`gputopo.heartbeats`);
        returns the staleness threshold it implies now. Called once per housekeeping tick, so
        an acknowledgement only copies a ready Duration."""
        if self.pacer.update(len(self._claims)):
            self._announce()
            log.info(
                "heartbeat interval now %g s for %d live report streams (at most %g/s)",
                self.pacer.interval_s,
                len(self._claims),
                self.pacer.max_per_second,
            )
        return self.pacer.stale_after_s

    def _announce(self) -> None:
        self._heartbeat = Duration()
        self._heartbeat.FromNanoseconds(round(self.pacer.interval_s * 1e9))
        self.stats.heartbeat_interval_s = self.pacer.interval_s

    @property
    def live_nodes(self) -> frozenset[str]:
        """Nodes a report stream holds right now."""
        return frozenset(self._claims)

    def _over_capacity(self, node: str) -> bool:
        """A new node past `max_nodes`: state must grow with the cluster, not with what
        streams claim (without node identity, one client could name thousands)."""
        return self._state.record(node) is None and self._state.node_count >= self._max_nodes

    def _claim(self, node: str, incarnation: int) -> _Claim | None:
        """Take the node for this stream; None when a newer exporter holds it."""
        held = self._claims.get(node)
        if held is not None:
            if incarnation < held.incarnation:
                return None
            self.stats.superseded += 1
            log.info("a new stream for %s replaces the previous one", node)
            held.superseded.set()
        claim = _Claim(incarnation)
        self._claims[node] = claim
        return claim

    def _check_incarnation(self, incarnation: int) -> None:
        ahead = incarnation / 1e9 - self._wall()
        if ahead > INCARNATION_FUTURE_S:
            raise CodecError(
                "incarnation",
                f"is {incarnation}, {ahead:.0f} s ahead of this aggregator's clock (at most "
                f"{INCARNATION_FUTURE_S:.0f} s): not the exporter's start time in unix nanoseconds",
            )

    def _check_envelope(
        self, msg: rpb.ReportRequest, stream_node: str, probe_address: str = ""
    ) -> None:
        """The fields every message carries. Those equal to what this stream already had
        checked (its node name, its probe address) are not matched against patterns again:
        a heartbeat is checked in a few comparisons."""
        if not stream_node:
            validate_node_name(msg.node_name)
        elif msg.node_name != stream_node:
            raise CodecError(
                "node_name", f"is {msg.node_name!r}, but this stream reports {stream_node!r}"
            )
        if msg.incarnation == 0:
            raise CodecError("incarnation", "must be set (unix nanoseconds at exporter start)")
        if msg.sequence == 0:
            raise CodecError("sequence", "must start at 1")
        if msg.probe_address and msg.probe_address != probe_address:
            match = _HOST_PORT.fullmatch(msg.probe_address)
            if match is None or not 0 < int(match.group(2)) < 65536:
                raise CodecError("probe_address", f"{msg.probe_address!r} is not host:port")
        if msg.HasField("sent_at"):
            seconds(msg.sent_at, "sent_at")  # read after applying: checked before
        check_limits(msg)  # every repeated field and string, before anything is decoded

    def _apply(self, msg: rpb.ReportRequest, kind: str) -> ReportOutcome:
        seq = {"incarnation": msg.incarnation, "sequence": msg.sequence}
        probes: list[tuple[str, float]] = []
        use = _kubelet_use(msg, kind)  # decoded (and checked) before anything is applied
        if kind == "snapshot":
            _check_node_memory(msg.snapshot.topology)
            topology = topology_from_proto(msg.snapshot.topology, "snapshot.topology")
            if topology.name != msg.node_name:
                raise CodecError(
                    "snapshot.topology.name",
                    f"is {topology.name!r}, but node_name is {msg.node_name!r}",
                )
            outcome = self._state.apply_snapshot(topology, **seq)
        elif kind == "delta":
            delta = delta_from_proto(msg.delta)
            probes = _peer_probes(msg.delta, msg.node_name)
            # the state checks the delta against its base, and the memory budget by its size
            outcome = self._state.apply_delta(
                msg.node_name, delta, **seq, wire_bytes=msg.delta.ByteSize()
            )
        elif kind == "heartbeat":
            outcome = self._state.heartbeat(msg.node_name, **seq)
        else:
            raise CodecError("payload", "one of snapshot, delta or heartbeat is required")
        if outcome is ReportOutcome.ACCEPTED:
            self._accepted(msg, kind, probes, use)
        return outcome

    def _accepted(
        self,
        msg: rpb.ReportRequest,
        kind: str,
        probes: list[tuple[str, float]],
        use: tuple[GpuUse | None] | None,
    ) -> None:
        if use is not None:
            self._state.set_kubelet_use(msg.node_name, use[0])
        if kind != "heartbeat" and msg.HasField("sent_at"):
            self.stats.observe_freshness(self._wall() - seconds(msg.sent_at, "sent_at"))
        self._state.set_probe_address(msg.node_name, msg.probe_address)
        if self._probes is not None:
            self._probes.address(msg.node_name, msg.probe_address)
            for peer, rtt in probes:
                self._probes.result(msg.node_name, peer, rtt)

    def _response(self, msg: rpb.ReportRequest, outcome: ReportOutcome) -> rpb.ReportResponse:
        rec = self._state.record(msg.node_name)
        resp = rpb.ReportResponse(
            status=_STATUS[outcome],
            acked_sequence=msg.sequence if outcome is ReportOutcome.ACCEPTED else 0,
            message="send a snapshot" if outcome is ReportOutcome.RESYNC else "",
            heartbeat_interval=self._heartbeat,
            topology_generation=rec.generation if rec is not None else 0,
        )
        if outcome is ReportOutcome.ACCEPTED and self._probes is not None:
            for peer, address in self._probes.due(msg.node_name, self._wall()):
                resp.probe_targets.append(rpb.ProbeTarget(node_name=peer, address=address))
        return resp


def _check_node_memory(topo: tpb.NodeTopology) -> None:
    """CodecError when keeping this node would pass the per-node memory budget
    (`gputopo.bounds.NODE_MEMORY_BUDGET`): aggregator memory stays at most nodes x budget."""
    estimate = bounds.node_memory(
        gpus=len(topo.gpus),
        nics=len(topo.nics),
        numa_nodes=len(topo.numa_nodes),
        links=len(topo.links),
        wire_bytes=topo.ByteSize(),
    )
    try:
        bounds.check_node_memory("snapshot.topology", estimate)
    except bounds.BoundsError as err:
        raise CodecError(err.field, err.reason) from None


def _kubelet_use(msg: rpb.ReportRequest, kind: str) -> tuple[GpuUse | None] | None:
    """What the kubelet says is held, when the message says it: `(use,)`, `(None,)` for a
    snapshot of an exporter that does not ask the kubelet, None when the message is silent."""
    if kind == "snapshot":
        if not msg.snapshot.HasField("gpu_use"):
            return (None,)
        return (gpu_use_from_proto(msg.snapshot.gpu_use, "snapshot.gpu_use"),)
    if kind == "delta" and msg.delta.HasField("gpu_use"):
        return (gpu_use_from_proto(msg.delta.gpu_use, "delta.gpu_use"),)
    return None


def _peer_probes(msg: rpb.Delta, node: str) -> list[tuple[str, float]]:
    """(peer, RTT in µs) of a delta's probe results; results without a latency carry none."""
    out = []
    for i, probe in enumerate(msg.peer_probes):
        path = f"delta.peer_probes[{i}]"
        peer, measured = peer_probe_from_proto(probe, path)
        validate_node_name(peer, f"{path}.peer")
        if peer == node:
            raise CodecError(f"{path}.peer", "a node does not probe itself")
        if measured.latency_us is not None:
            if not math.isfinite(measured.latency_us) or measured.latency_us <= 0:
                raise CodecError(f"{path}.measured.latency_us", "must be a positive number")
            out.append((peer, measured.latency_us))
    return out
