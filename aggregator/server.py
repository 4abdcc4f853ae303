"""Run the aggregator: gRPC (Reporter, Placement) and HTTP in one asyncio loop.

`Aggregator.start()` binds the gRPC server (port 0 picks a free port; the bound port is
reported) and the HTTP endpoints, and starts the housekeeping task that expires reservations and
announces stale nodes. `stop()` shuts down gracefully: in-flight calls get a grace period, new
calls are refused.

HTTP (aiohttp): `/healthz` (the process runs), `/readyz` (the gRPC server serves),
`/api/v1/topology` and `/api/v1/nodes/{name}` (the same ClusterTopology / NodeState messages as
gRPC, in protobuf's JSON mapping with field names as in the .proto).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from aiohttp import web
from google.protobuf import json_format

from aggregator.http_placement import add_placement_routes
from aggregator.ingest import ReporterService
from aggregator.service import PlacementService, topology_to_proto
from aggregator.state import ClusterState
from gputopo.v1 import placement_pb2_grpc as pgrpc
from gputopo.v1 import reporter_pb2_grpc as rgrpc

__all__ = ["Aggregator", "AggregatorConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AggregatorConfig:
    """Where and how the aggregator serves."""

    grpc_host: str = "127.0.0.1"
    grpc_port: int = 0
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # None: no HTTP endpoints
    stale_after_s: float = 30.0
    heartbeat_interval_s: float = 5.0
    reservation_ttl_s: float = 60.0
    housekeeping_interval_s: float = 1.0
    default_policy: str | None = None


def _to_json(message: object) -> dict[str, object]:
    return json_format.MessageToDict(
        message,  # type: ignore[arg-type]
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


class Aggregator:
    """A running aggregator (see the module docstring)."""

    def __init__(self, config: AggregatorConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.state = ClusterState(clock=clock, stale_after_s=config.stale_after_s)
        self.placement = PlacementService(
            self.state,
            clock=clock,
            default_ttl_s=config.reservation_ttl_s,
            default_policy=config.default_policy,
        )
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self.grpc_port = 0
        self.http_port = 0

    @property
    def grpc_target(self) -> str:
        """host:port clients connect to."""
        return f"{self.config.grpc_host}:{self.grpc_port}"

    async def start(self) -> None:
        """Bind and serve; returns once the servers accept connections."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ]
        )
        rgrpc.add_ReporterServicer_to_server(
            ReporterService(self.state, heartbeat_interval_s=self.config.heartbeat_interval_s),
            server,
        )
        pgrpc.add_PlacementServicer_to_server(self.placement, server)
        address = f"{self.config.grpc_host}:{self.config.grpc_port}"
        self.grpc_port = server.add_insecure_port(address)
        if self.grpc_port == 0:
            raise OSError(f"cannot bind gRPC to {address}")
        await server.start()
        self._grpc = server
        if self.config.http_port is not None:
            await self._start_http()
        self._housekeeping = asyncio.create_task(self._housekeep(), name="housekeeping")
        log.info(
            "aggregator serving gRPC on %s%s",
            self.grpc_target,
            f", HTTP on {self.config.http_host}:{self.http_port}" if self._http else "",
        )

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/api/v1/topology", self._topology)
        app.router.add_get("/api/v1/nodes/{name}", self._node)
        add_placement_routes(app, self.placement)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # Bind the socket ourselves so port 0 works and the bound port is known.
        sock = socket.create_server((self.config.http_host, self.config.http_port or 0))
        site = web.SockSite(runner, sock)
        await site.start()
        self._http = runner
        self.http_port = sock.getsockname()[1]

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = self._grpc is not None
        return web.json_response(
            {"ready": ready, "nodes": len(self.state.node_names)}, status=200 if ready else 503
        )

    async def _topology(self, request: web.Request) -> web.Response:
        snapshot = self.state.snapshot()
        include_links = request.query.get("links", "true").lower() != "false"
        msg = topology_to_proto(
            snapshot, self.state, include_links=include_links, as_of=self.clock()
        )
        return web.json_response(_to_json(msg))

    async def _node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        snapshot = self.state.snapshot()
        if name not in snapshot.nodes:
            return web.json_response({"error": f"unknown node {name!r}"}, status=404)
        msg = topology_to_proto(snapshot, self.state, nodes=[name])
        return web.json_response(_to_json(msg.nodes[0]))

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(self.config.housekeeping_interval_s)
            expired = self.state.expire()
            flipped = self.state.check_stale()
            if expired:
                log.info("expired %d reservation(s)", expired)
            for node in flipped:
                log.warning(
                    "node %s is %s",
                    node,
                    "stale" if node in self.state.stale_nodes() else "reporting again",
                )

    async def stop(self, *, grace_s: float = 2.0) -> None:
        """Stop serving: refuse new calls, let in-flight ones finish within the grace period."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
            self._grpc = None
