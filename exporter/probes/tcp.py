"""Network probes between exporters: a small TCP endpoint, and the client that probes peers.

The aggregator names the peers (`ReportResponse.probe_targets`); the results go back as
`Delta.peer_probes`, from which it infers switch tiers when nothing better is known (low
confidence: TCP through the host stack measures far less than RDMA can).

Protocol, one connection per measurement, version-tagged so a future change is refused cleanly:

    client: b"GTP1" + op (1 byte) + size (8 bytes, big-endian)
    op b"P": the client sends `size` single bytes one at a time; the server echoes each one
             (round-trip time, the median counts)
    op b"B": the client sends `size` bytes; the server answers b"K" once it has them all
             (bandwidth: size / time from first byte to the answer)

The server caps sizes and connections so a stray client cannot make it hoard memory or time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import struct
import time
from collections.abc import Callable

from gputopo.topology import Measurement

__all__ = ["TcpProbeServer", "probe_peer"]

log = logging.getLogger(__name__)

_MAGIC = b"GTP1"
_HEADER = struct.Struct(">4scQ")
_PING, _BULK, _DONE = b"P", b"B", b"K"
_MAX_BULK = 1 << 30
_MAX_PINGS = 1000
_CHUNK = 1 << 20


class TcpProbeServer:
    """The endpoint peers probe. `start()` binds (port 0 picks a free port); `stop()` closes."""

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        max_connections: int = 4,
        timeout_s: float = 30.0,
    ) -> None:
        self.host = host
        self.port = port
        self._slots = asyncio.Semaphore(max_connections)
        self._timeout_s = timeout_s
        self._server: asyncio.Server | None = None
        self.served = 0

    async def start(self) -> None:
        """Bind and listen."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if self._slots.locked():
                return  # busy: the client sees the connection close and counts a failure
            async with self._slots:
                await asyncio.wait_for(self._serve(reader, writer), self._timeout_s)
                self.served += 1
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError) as err:
            log.debug("probe from %s ended: %r", peer, err)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        magic, op, size = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if magic != _MAGIC:
            raise ValueError("not a gputopo probe")
        if op == _PING and 0 < size <= _MAX_PINGS:
            for _ in range(size):
                writer.write(await reader.readexactly(1))
                await writer.drain()
        elif op == _BULK and 0 < size <= _MAX_BULK:
            left = size
            while left:
                chunk = await reader.read(min(left, _CHUNK))
                if not chunk:
                    raise ConnectionError("peer closed mid-transfer")
                left -= len(chunk)
            writer.write(_DONE)
            await writer.drain()
        else:
            raise ValueError(f"bad probe request {op!r} {size}")


async def probe_peer(
    address: str,
    *,
    size_bytes: int = 64 << 20,
    pings: int = 20,
    timeout_s: float = 30.0,
    clock: Callable[[], float] = time.time,
) -> Measurement:
    """Bandwidth and round-trip time to a peer's probe endpoint (`host:port`)."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")  # IPv6 literals come bracketed
    started = clock()
    began = time.perf_counter()
    async with asyncio.timeout(timeout_s):
        rtts = await _ping(host, int(port_text), pings)
        seconds = await _bulk(host, int(port_text), size_bytes)
    return Measurement(
        gbps=round(size_bytes / seconds / 1e9, 6),
        method="tcp",
        size_bytes=size_bytes,
        duration_s=time.perf_counter() - began,
        measured_at=started,
        latency_us=round(statistics.median(rtts) * 1e6, 3),
    )


async def _ping(host: str, port: int, pings: int) -> list[float]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_HEADER.pack(_MAGIC, _PING, pings))
        rtts = []
        for _ in range(pings):
            began = time.perf_counter()
            writer.write(b"x")
            await writer.drain()
            await reader.readexactly(1)
            rtts.append(time.perf_counter() - began)
        return rtts
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _bulk(host: str, port: int, size: int) -> float:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_HEADER.pack(_MAGIC, _BULK, size))
        began = time.perf_counter()
        block = bytes(min(size, _CHUNK))
        left = size
        while left:
            piece = block if left >= len(block) else block[:left]
            writer.write(piece)
            await writer.drain()
            left -= len(piece)
        answer = await reader.readexactly(1)
        if answer != _DONE:
            raise ConnectionError(f"unexpected answer {answer!r}")
        return max(time.perf_counter() - began, 1e-9)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
