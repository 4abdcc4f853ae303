"""The aggregator's HTTP side (aiohttp, on the same event loop as gRPC).

- `/healthz`: the process runs. `/readyz`: the gRPC server serves (503 before that); the body
  says whether this replica leads.
- `/metrics`: the registry the server passes in (`aggregator.metrics`).

Those three come from the boot every process shares (`gputopo.runtime.http`).
- `/api/v1/topology` (`?links=false` leaves intra-node links out) and `/api/v1/nodes/{name}`:
  the same `ClusterTopology` / `NodeState` messages as gRPC's `GetTopology`, in protobuf's JSON
  mapping with the .proto field names. The topology is built off the event loop and kept
  (`TopologyCache`): a dashboard polling it gets the same bytes until the state changes or
  `max_age_s` passes, and never slows Place or the probes. `?limit=N` pages it by node name;
  the answer's `continue` (absent on the last page) is passed back as `?continue=`.
- `/ui/`: the topology page (`aggregator/ui/`, static files): the fabric tree with free and
  held GPUs, a node's GPU link matrix, a reservation's GPUs highlighted (`?reservation=ID`).
- `/api/v1/summary`: one compact row per node for the page's overview (name, tier-0 domain,
  model, GPUs, free, pending, flags; `aggregator.overview`): about 50 kB at 1,000 nodes, where
  the full topology is megabytes. `/api/v1/nodes/{name}/holders`: who holds each of a node's
  GPUs (reservations with job and owner, pods by the kubelet's report, gputopo's record or only
  by count, DRA claims).
- `/api/v1/nodes/{name}/sources`: where each part of the node's fabric position came from, what
  every source said, the conflicts, the labels this aggregator wants on the node, and what
  holds its GPUs (reservations, and pods bound by anyone: `occupancy`).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from prometheus_client import CollectorRegistry

from aggregator.dumps import TopologyJson
from aggregator.overview import SummaryCache, SummaryInputs, holders
from aggregator.service import cluster_message, dump_facts
from aggregator.state import ClusterState
from gputopo.runtime.http import HttpServer, ProbeResult

__all__ = ["UI", "HttpEndpoints", "TopologyCache"]

UI = Path(__file__).parent / "ui"  # the topology page, shipped as package data

# A cached topology is served for at most this long even when nothing changed (its `as_of` and
# the nodes' last reports move on).
_MAX_AGE_S = 2.0
_MAX_LIMIT = 10_000


def _to_json(message: object) -> dict[str, Any]:
    return json_format.MessageToDict(
        message,  # type: ignore[arg-type]
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


class TopologyCache:
    """The topology's JSON bytes per (state generation, links, page), built off the loop.

    Concurrent requests for the same key share one build; a key is rebuilt once the state's
    generation moved or `max_age_s` passed. Only the latest generation's pages are kept, so the
    cache holds one dump's worth of bytes at most.
    """

    def __init__(
        self,
        state: ClusterState,
        *,
        clock: Callable[[], float],
        off_loop: Callable[[Callable[[], bytes]], Awaitable[bytes]],
        max_age_s: float = _MAX_AGE_S,
    ) -> None:
        self._state = state
        self._clock = clock
        self._off_loop = off_loop
        self._max_age_s = max_age_s
        self._entries: dict[tuple[Any, ...], tuple[float, asyncio.Future[bytes]]] = {}
        self._generation = -1
        self.builds = 0
        self.encoder = TopologyJson()

    async def get(self, *, include_links: bool, start: str = "", limit: int = 0) -> bytes:
        """The page of nodes from `start` (a name; "" the first), `limit` of them (0: all)."""
        generation = self._state.generation
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
        key = (include_links, start, limit)
        now = self._clock()
        held = self._entries.get(key)
        # A build under way is shared however long it takes; finished bytes age from when they
        # were ready, not from when their build began (a 2,000-node build can take longer than
        # max_age_s on a slow machine, and then every GET built again).
        if held is not None and (not held[1].done() or now - held[0] <= self._max_age_s):
            return await asyncio.shield(held[1])
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._entries[key] = (now, future)
        try:
            body = await self._build(include_links=include_links, start=start, limit=limit)
        except BaseException as err:
            self._entries.pop(key, None)
            future.set_exception(err)
            future.exception()  # retrieved: a failed build is reported to its own caller
            raise
        if self._entries.get(key, (0.0, None))[1] is future:
            self._entries[key] = (self._clock(), future)
        future.set_result(body)
        return body

    async def _build(self, *, include_links: bool, start: str, limit: int) -> bytes:
        self.builds += 1
        snapshot = self._state.snapshot()
        names = sorted(n for n in snapshot.nodes if n >= start)
        extra = {}
        if limit and len(names) > limit:
            extra["continue"] = base64.urlsafe_b64encode(names[limit].encode()).decode()
            names = names[:limit]
        facts, reserved = dump_facts(snapshot, self._state, names)
        as_of = self._clock()

        def encode() -> bytes:
            return self.encoder.encode(
                snapshot,
                facts=facts,
                reserved=reserved,
                names=names,
                include_links=include_links,
                as_of=as_of,
                extra=extra,
            )

        return await self._off_loop(encode)


def page_query(query: Any) -> tuple[str, int] | str:
    """(start, limit) from `?continue=&limit=`, or why not (one line naming the parameter)."""
    raw_limit = query.get("limit", "0")
    try:
        limit = int(raw_limit)
    except ValueError:
        return f"limit: {raw_limit[:40]!r} is not a whole number"
    if not 0 <= limit <= _MAX_LIMIT:
        return f"limit: must be between 1 and {_MAX_LIMIT} (0 or absent: every node)"
    token = query.get("continue", "")
    try:
        start = (
            base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
            if token
            else ""
        )
    except (ValueError, UnicodeError):
        return "continue: not a token this server gave"
    return start, limit


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
        off_loop: Callable[[Callable[[], bytes]], Awaitable[bytes]] | None = None,
    ) -> None:
        self.state = state
        self.topology = TopologyCache(state, clock=clock, off_loop=off_loop or asyncio.to_thread)
        self.summary = SummaryCache(
            generation=lambda: state.generation,
            inputs=self._summary_inputs,
            clock=clock,
            off_loop=off_loop or asyncio.to_thread,
        )
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
        app.router.add_get("/ui", self._ui_redirect)
        app.router.add_get("/ui/", self._ui_index)
        app.router.add_static("/ui/", UI)
        app.router.add_get("/api/v1/topology", self._topology)
        app.router.add_get("/api/v1/nodes/{name}", self._node)
        app.router.add_get("/api/v1/nodes/{name}/sources", self._sources)
        app.router.add_get("/api/v1/summary", self._summary)
        app.router.add_get("/api/v1/nodes/{name}/holders", self._holders)
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

    async def _ui_redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("ui/")

    async def _ui_index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(UI / "index.html")

    def _readyz(self) -> ProbeResult:
        ready = self._ready()
        body = {"ready": ready, "role": self._role(), "nodes": len(self.state.node_names)}
        return ProbeResult(ready, body)

    async def _topology(self, request: web.Request) -> web.Response:
        include_links = request.query.get("links", "true").lower() != "false"
        page = page_query(request.query)
        if isinstance(page, str):
            return web.json_response({"error": page}, status=400)
        start, limit = page
        body = await self.topology.get(include_links=include_links, start=start, limit=limit)
        return web.Response(body=body, content_type="application/json")

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
                "pods": [
                    asdict(p) | {"recorded": sorted(p.recorded)}
                    for p in self.state.occupancy.pods(name)
                ],
            },
        }
        return web.json_response(body)

    def _summary_inputs(self) -> SummaryInputs:
        snapshot = self.state.snapshot()
        _, reserved = dump_facts(snapshot, self.state, ())
        return snapshot, reserved

    async def _summary(self, request: web.Request) -> web.Response:
        resp = web.Response(body=await self.summary.get(), content_type="application/json")
        resp.enable_compression()  # rows repeat their shape: gzip takes ~80 % off
        return resp

    async def _holders(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        rec = self.state.record(name)
        if rec is None:
            return web.json_response({"error": f"unknown node {name!r}"}, status=404)
        state = self.state
        body = {
            "node": name,
            "gpus": rec.topology.gpu_count,
            "free": sorted(state.free_gpus(name)),
            "holders": holders(
                name,
                reservations=state.reservations(),
                kubelet=state.kubelet_use(name),
                pods=state.occupancy.pods(name),
                claims=state.claimed(name),
                live=lambda rid: state.reservation(rid) is not None,
            ),
        }
        return web.json_response(body)
