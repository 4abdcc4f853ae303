"""Simulated exporters: many nodes' report streams in one process, over real gRPC.

Used by the demo and the benchmarks. Each simulated node has its own stream (its own
incarnation and sequence, exactly what a real exporter sends); all streams share one HTTP/2
channel, as many agents behind one proxy would, which keeps thousands of nodes cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import grpc

from exporter.stream import ReportStream, report_channel
from gputopo.runtime.backoff import Backoff
from gputopo.runtime.tls import TlsFiles
from gputopo.topology import NodeTopology

__all__ = ["SimulatedExporters"]

# Simulated nodes live next to the aggregator: retry faster than a real agent would.
_SIMULATED_BACKOFF = Backoff(base_s=0.2, cap_s=5.0)


class SimulatedExporters:
    """Report streams for a set of node topologies. Use `async with`."""

    def __init__(
        self,
        topologies: Iterable[NodeTopology],
        *,
        target: str,
        heartbeat_interval_s: float = 5.0,
        backoff: Backoff = _SIMULATED_BACKOFF,
        tls: TlsFiles | None = None,
    ) -> None:
        self._topologies = {t.name: t for t in topologies}
        self._target = target
        self._heartbeat_s = heartbeat_interval_s
        self._backoff = backoff
        self._tls = tls  # mutual TLS to an aggregator that requires it
        self._channel: grpc.aio.Channel | None = None
        self.streams: dict[str, ReportStream] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def topology(self, node: str) -> NodeTopology:
        """The topology a node currently reports."""
        return self._topologies[node]

    def update(self, topology: NodeTopology) -> None:
        """Change what a node reports; its stream sends a delta at once."""
        self._topologies[topology.name] = topology
        self.streams[topology.name].changed()

    async def __aenter__(self) -> SimulatedExporters:
        self._channel = report_channel(self._target, self._backoff, tls=self._tls)
        for name in self._topologies:
            stream = ReportStream(
                node_name=name,
                source=lambda n=name: self._topologies[n],  # type: ignore[misc]
                channel=self._channel,
                heartbeat_interval_s=self._heartbeat_s,
                backoff=self._backoff,
            )
            self.streams[name] = stream
            self._tasks.append(asyncio.create_task(stream.run(), name=f"report-{name}"))
        return self

    async def wait_acked(self, *, timeout_s: float = 30.0) -> None:
        """Wait until every stream had its snapshot acknowledged."""
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(s.acked.wait() for s in self.streams.values()))

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._channel is not None:
            await self._channel.close()
