"""The aggregator's HTTP side (aiohttp, on the same event loop as gRPC).

- `/healthz`: the process runs. `/readyz`: the gRPC server serves (503 before that); the body
  says whether this replica leads.
- `/metrics`: the registry the server passes in (`aggregator.metrics`).

Those three come from the boot every process shares (`gputopo.runtime.http`).
- `/api/v1/topology` (`?links=false` leaves intra-node links out) and `/api/v1/nodes/{name}`:
  the same `ClusterTopology` / `NodeState` messages as gRPC's `GetTopology`, in protobuf's JSON
  mapping with the .proto field names.
- `/api/v1/nodes/{name}/sources`: where each part of the node's fabric position came from, what
  every source said, the conflicts, the labels this aggregator wants on the node, and what
  holds its GPUs (reservations, and pods bound by anyone: `occupancy`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from prometheus_client import CollectorRegistry

from aggregator.service import cluster_message
from aggregator.state import ClusterState
from gputopo.runtime.http import HttpServer, ProbeResult

__all__ = ["HttpEndpoints"]


def _to_json(message: object) -> dict[str, Any]:
    return json_format.MessageToDict(
        message,  # type: ignore[arg-type]
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


class HttpEndpoints:
    """The routes above, served on one socket."""

    def __init__(
        self,
        state: ClusterState,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float],
        ready: Callable[[], bool],
        role: Callable[[], str],
        desired_labels: Callable[[str], dict[str, str] | None] | None = None,
        extra_routes: Callable[[web.Application], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.state = state
        self._extra_routes = extra_routes
        self.registry = registry
        self.clock = clock
        self._ready = ready
        self._role = role
        self._desired = desired_labels
        self._server = HttpServer(
            registry=registry,
            readyz=self._readyz,
            routes=self._add_routes,
            ssl_context=ssl_context,
        )

    @property
    def port(self) -> int:
        """The bound port (0 before `start`)."""
        return self._server.port

    def app(self) -> web.Application:
        """The aiohttp application."""
        return self._server.app()

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/topology", self._topology)
        app.router.add_get("/api/v1/nodes/{name}", self._node)
        app.router.add_get("/api/v1/nodes/{name}/sources", self._sources)
        if self._extra_routes is not None:  # the placement mirror and extender
            self._extra_routes(app)

    async def start(self, host: str, port: int) -> int:
        """Serve; returns the bound port (port 0 picks a free one)."""
        return await self._server.start(host, port)

    async def start_health(self, host: str, port: int) -> int:
        """Also serve the probes alone in plain text (`HttpServer.start_health`)."""
        return await self._server.start_health(host, port)

    async def stop(self) -> None:
        """Stop serving."""
        await self._server.stop()

    def _readyz(self) -> ProbeResult:
        ready = self._ready()
        body = {"ready": ready, "role": self._role(), "nodes": len(self.state.node_names)}
        return ProbeResult(ready, body)

    async def _topology(self, request: web.Request) -> web.Response:
        snapshot = self.state.snapshot()
        include_links = request.query.get("links", "true").lower() != "false"
        msg = cluster_message(snapshot, self.state, include_links=include_links, as_of=self.clock())
        return web.json_response(_to_json(msg))

    async def _node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        snapshot = self.state.snapshot()
        if name not in snapshot.nodes:
            return web.json_response({"error": f"unknown node {name!r}"}, status=404)
        msg = cluster_message(snapshot, self.state, nodes=[name])
        return web.json_response(_to_json(msg.nodes[0]))

    async def _sources(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        rec = self.state.record(name)
        if rec is None or rec.resolution is None:
            return web.json_response({"error": f"unknown node {name!r}"}, status=404)
        res = rec.resolution
        kube = self.state.kube_labels(name)
        body = {
            "node": name,
            "fabric": asdict(res.fabric),
            "chosen": dict(res.chosen),
            "sources": [asdict(f) for f in res.consulted],
            "conflicts": [str(c) for c in res.conflicts],
            "owned_labels": sorted(kube[1]) if kube else [],
            "desired_labels": self._desired(name) if self._desired else None,
            "occupancy": {
                # GPUs held by pods beyond live reservations, and every pod that holds some.
                "held_by_pods": self.state.pod_held(name),
                "reserved": sorted(self.state.book.held(name)),
                "free": sorted(self.state.free_gpus(name)),
                "pods": [asdict(p) for p in self.state.occupancy.pods(name)],
            },
        }
        return web.json_response(body)
