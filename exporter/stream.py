"""Stream a node's topology to the aggregator, forever.

Protocol (reporter.proto): a full snapshot first, then deltas when the topology changes and
heartbeats when it does not, every message numbered (incarnation, sequence). The aggregator acks
each message; RESYNC makes the next message a snapshot. An ack may name peers to probe
(`probe_targets`): the stream hands them to `on_probe_targets`, and peer results handed back
with `add_peer_probes` travel in the next Delta's `peer_probes` (a Delta without topology
changes when there are none). What the kubelet says is held (`gpu_use()`, when given) goes in
every snapshot and in the next Delta after it changes.

Heartbeats are paced by the aggregator: every ack may carry `heartbeat_interval`, and the wait
before the next heartbeat is the last one heard (clamped to `HEARTBEAT_RANGE_S`; zero or absent
keeps the configured interval). An aggregator with many nodes asks for fewer heartbeats
(`gputopo.heartbeats`) and marks a node stale only after the same multiple of what it asked.

Failure handling: any stream error (aggregator down, restarted, unreachable) closes the stream;
the next attempt waits a jittered exponential backoff (full jitter, capped) and starts again
with a snapshot, so nothing the aggregator missed is lost. The backoff resets after the first
acknowledged message. It never gives up: an exporter that stops reporting is worse than one that
retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc

from gputopo import __version__
from gputopo.codec import (
    clip_texts,
    delta_to_proto,
    gpu_use_to_proto,
    peer_probe_to_proto,
    timestamp,
    topology_to_proto,
)
from gputopo.delta import NodeDelta, diff_topology
from gputopo.gpu_use import GpuUse
from gputopo.runtime import grpcio
from gputopo.runtime.backoff import Backoff
from gputopo.runtime.tls import TlsFiles
from gputopo.topology import Measurement, NodeTopology
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc

__all__ = [
    "HEARTBEAT_RANGE_S",
    "REPORT_BACKOFF",
    "ProbeTarget",
    "ReportStream",
    "StreamStats",
    "report_channel",
]

log = logging.getLogger(__name__)

# While no aggregator replica leads, the Service has no endpoint and every attempt fails; a
# backoff that kept doubling to 30 s brought exporters back 36 s after a kill -9 although the
# new leader served after 17. A 3 s cap keeps the fleet within a few seconds of a failover;
# jittered over [cap/2, cap], each exporter still tries at most once every 1.5 s.
REPORT_BACKOFF = Backoff(base_s=0.5, cap_s=3.0)
_DEFAULT_BACKOFF = REPORT_BACKOFF
# What an announced heartbeat interval is clamped to: a zero or garbled one would have every
# node flood the aggregator, past five minutes a dead node goes unnoticed for half an hour. The
# floor is 0.1 s, not 1 s: tests and demos run aggregators that ask for 0.2 s on purpose.
HEARTBEAT_RANGE_S = (0.1, 300.0)


def report_channel(
    target: str, backoff: Backoff, *, tls: TlsFiles | None = None
) -> grpc.aio.Channel:
    """A channel to the aggregator whose own reconnects keep pace with the stream's backoff
    (`gputopo.runtime.grpcio.channel` says why); mutual TLS with `tls`."""
    return grpcio.channel(target, backoff=backoff, tls=tls)


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """A peer the aggregator wants this node to probe."""

    node_name: str
    address: str


@dataclass(slots=True)
class StreamStats:
    """What the stream has done, for metrics and tests."""

    connects: int = 0
    failures: int = 0
    snapshots_sent: int = 0
    deltas_sent: int = 0
    heartbeats_sent: int = 0
    acked_sequence: int = 0
    resyncs: int = 0
    peer_probes_sent: int = 0
    last_error: str = ""
    heartbeat_interval_s: float = 0.0  # the silence before a heartbeat now (the aggregator's)
    connected: bool = False


class ReportStream:
    """One node's report stream to one aggregator.

    `source()` returns the node's current topology; call `changed()` after it changes so the
    stream sends a delta at once rather than at the next heartbeat.
    """

    def __init__(
        self,
        *,
        node_name: str,
        source: Callable[[], NodeTopology],
        channel: grpc.aio.Channel,
        heartbeat_interval_s: float = 5.0,
        backoff: Backoff = _DEFAULT_BACKOFF,
        probe_address: str = "",
        rng: random.Random | None = None,
        incarnation: int | None = None,
        on_probe_targets: Callable[[tuple[ProbeTarget, ...]], None] | None = None,
        gpu_use: Callable[[], GpuUse | None] | None = None,
        identity_token: Callable[[], str] | None = None,
    ) -> None:
        self.node_name = node_name
        # The pod's projected ServiceAccount token, read at each connection (the kubelet
        # refreshes the file): the aggregator learns from it which node this pod runs on.
        self._identity_token = identity_token
        self._source = source
        self._gpu_use = gpu_use or (lambda: None)
        self._sent_use: GpuUse | None = None
        self._stub = rgrpc.ReporterStub(channel)
        self._configured_s = heartbeat_interval_s
        self._paced = asyncio.Event()  # the reader heard a new interval: wait anew
        self._told_bad_interval = False
        self._backoff = backoff
        self._probe_address = probe_address
        self._rng = rng or random.Random()
        # A restarted exporter must outrank its previous life: unix nanoseconds grow.
        self.incarnation = incarnation or time.time_ns()
        self._sequence = 0
        self._wake = asyncio.Event()
        self._resync = False
        self._on_probe_targets = on_probe_targets
        self._peer_probes: dict[str, Measurement] = {}
        # the interval waited (the aggregator's, once an ack says it): `heartbeat_interval_s`
        self.stats = StreamStats(heartbeat_interval_s=heartbeat_interval_s)
        self.acked = asyncio.Event()  # set after the first ack of each connection

    @property
    def heartbeat_interval_s(self) -> float:
        """The silence after which the stream sends a heartbeat, now."""
        return self.stats.heartbeat_interval_s

    def use_channel(self, channel: grpc.aio.Channel) -> None:
        """Report over `channel` from the next connection on (a renewed client certificate);
        the caller closes the old one, which ends the current call and so reconnects."""
        self._stub = rgrpc.ReporterStub(channel)

    def changed(self) -> None:
        """The topology changed: send a delta now."""
        self._wake.set()

    def add_peer_probes(self, results: Mapping[str, Measurement]) -> None:
        """Send these peer probe results (node name -> measurement) with the next message."""
        if results:
            self._peer_probes.update(results)
            self._wake.set()

    async def run(self) -> None:
        """Stream until cancelled, reconnecting with backoff."""
        attempt = 0
        while True:
            try:
                self.stats.connects += 1
                await self._stream_once()
                reason = "stream ended by the aggregator"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as err:
                reason = f"{err.code().name}: {err.details()}"
            except Exception as err:  # keep reporting whatever went wrong
                log.exception("report stream of %s failed", self.node_name)
                reason = repr(err)
            self.stats.connected = False
            self.stats.failures += 1
            self.stats.last_error = reason
            if self.stats.acked_sequence and self.acked.is_set():
                attempt = 0  # it worked for a while: start the backoff over
            self.acked.clear()
            delay = self._backoff.delay(attempt, self._rng)
            attempt += 1
            log.warning(
                "report stream of %s closed (%s); retrying in %.1fs", self.node_name, reason, delay
            )
            await asyncio.sleep(delay)

    def _message(self, **payload: object) -> rpb.ReportRequest:
        self._sequence += 1
        msg = rpb.ReportRequest(
            node_name=self.node_name,
            incarnation=self.incarnation,
            sequence=self._sequence,
            sent_at=timestamp(time.time()),
            exporter_version=__version__,
            probe_address=self._probe_address,
            **payload,  # type: ignore[arg-type]
        )
        clip_texts(msg)  # an overlong NVML reason is cut, not the whole report refused
        return msg

    async def _stream_once(self) -> None:
        metadata = None
        if self._identity_token is not None:
            metadata = grpc.aio.Metadata(("authorization", f"Bearer {self._identity_token()}"))
        call = self._stub.Report(metadata=metadata)
        self._resync = False
        reader = asyncio.create_task(self._read_acks(call))
        sent: NodeTopology | None = None
        try:
            while True:
                current = self._source()
                msg = self._next_message(sent, current)
                sent = current
                await call.write(msg)
                sent_at = time.monotonic()
                self.stats.connected = True
                self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                try:
                    if await self._wait_for_silence(sent_at, waiter, reader):
                        return
                finally:  # also when the stream is cancelled mid-wait: no task left pending
                    waiter.cancel()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            call.cancel()

    async def _wait_for_silence(
        self, sent_at: float, waiter: asyncio.Task[bool], reader: asyncio.Task[None]
    ) -> bool:
        """Wait until the next message is due: woken (`changed`, probes, RESYNC) or the
        heartbeat interval after `sent_at` passed, measured with the interval heard last (an
        ack that arrives meanwhile may move it). True when the stream ended instead."""
        while True:
            self._paced.clear()  # before reading the interval: a change after it wakes us
            left = sent_at + self.stats.heartbeat_interval_s - time.monotonic()
            if left <= 0:
                return False
            paced = asyncio.create_task(self._paced.wait())
            try:
                done, _ = await asyncio.wait(
                    {waiter, reader, paced}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                paced.cancel()
            if reader in done:
                reader.result()  # raises when the stream failed
                return True
            if waiter in done or not done:
                return False

    def _obey(self, seconds: float) -> None:
        """Take the interval an ack announced: 0 means the configured one; one outside
        `HEARTBEAT_RANGE_S` is clamped, and said once (a misconfigured aggregator would
        otherwise fill the log at every ack)."""
        low, high = HEARTBEAT_RANGE_S
        if seconds == 0:
            wanted = self._configured_s
        elif not low <= seconds <= high:  # also NaN-free: a Duration is whole numbers
            wanted = min(max(seconds, low), high)
            if not self._told_bad_interval:
                self._told_bad_interval = True
                log.warning(
                    "the aggregator asked %s for a heartbeat every %g s; using %g s (%g..%g s)",
                    self.node_name,
                    seconds,
                    wanted,
                    low,
                    high,
                )
        else:
            wanted = seconds
        if wanted != self.stats.heartbeat_interval_s:
            self.stats.heartbeat_interval_s = wanted
            self._paced.set()

    def _next_message(self, sent: NodeTopology | None, current: NodeTopology) -> rpb.ReportRequest:
        """A snapshot (first, after RESYNC, or when a delta cannot say it), else delta or beat."""
        delta = None if sent is None or self._resync else diff_topology(sent, current)
        use = self._gpu_use()
        if delta is None:
            self._resync = False
            self.stats.snapshots_sent += 1
            if self._peer_probes:
                self._wake.set()  # the probe results go in the message right after
            snapshot = rpb.Snapshot(topology=topology_to_proto(current, observed_at=time.time()))
            if use is not None:
                snapshot.gpu_use.CopyFrom(gpu_use_to_proto(use))
            self._sent_use = use
            return self._message(snapshot=snapshot)
        probes, self._peer_probes = self._peer_probes, {}
        use_moved = use is not None and use != self._sent_use
        if delta.empty and not probes and not use_moved:
            self.stats.heartbeats_sent += 1
            return self._message(heartbeat=rpb.Heartbeat())
        self.stats.deltas_sent += 1
        self.stats.peer_probes_sent += len(probes)
        msg = _delta_message(delta, probes)
        if use_moved and use is not None:
            msg.gpu_use.CopyFrom(gpu_use_to_proto(use))
            self._sent_use = use
        return self._message(delta=msg)

    async def _read_acks(
        self, call: grpc.aio.StreamStreamCall[rpb.ReportRequest, rpb.ReportResponse]
    ) -> None:
        """Read acks until the stream ends; a RESYNC makes the next message a snapshot."""
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            assert isinstance(resp, rpb.ReportResponse)
            if resp.HasField("heartbeat_interval"):
                every = resp.heartbeat_interval
                self._obey(every.seconds + every.nanos / 1e9)
            if resp.probe_targets and self._on_probe_targets is not None:
                self._on_probe_targets(
                    tuple(ProbeTarget(t.node_name, t.address) for t in resp.probe_targets)
                )
            if resp.status == rpb.ReportResponse.STATUS_ACCEPTED:
                self.stats.acked_sequence = resp.acked_sequence
                self.acked.set()
            elif resp.status == rpb.ReportResponse.STATUS_RESYNC:
                self.stats.resyncs += 1
                self._resync = True
                self._wake.set()
            elif resp.status == rpb.ReportResponse.STATUS_REJECTED:
                log.error("aggregator rejected a report of %s: %s", self.node_name, resp.message)


def _delta_message(delta: NodeDelta, probes: Mapping[str, Measurement]) -> rpb.Delta:
    msg = delta_to_proto(delta)
    msg.peer_probes.extend(peer_probe_to_proto(peer, m) for peer, m in sorted(probes.items()))
    return msg
