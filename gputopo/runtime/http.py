"""The HTTP side every process serves, booted the same way everywhere (aiohttp, on the
process's one event loop).

- `/metrics`: prometheus_client's own aiohttp handler over the registry the process passes in
  (content negotiation and compression come with it; nothing is hand-written twice);
- `/healthz`: the process runs and is not wedged; `/readyz`: it can serve. Each answers with the
  JSON body of the probe function the process passes in, 200 when the probe says ok, else 503;
- anything else a process serves is added by `routes`.

With `tls` (`gputopo.runtime.tls.ssl_server_context`) the socket speaks only mutual TLS; the
kubelet's probes cannot present a client certificate, so `start_health` can also serve the two
probes alone, in plain text, on a port of their own (they say nothing about the cluster).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from gputopo.runtime.http_errors import client_errors

__all__ = ["HttpServer", "Probe", "ProbeResult"]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """A health or readiness answer: `ok` decides the status code, `body` is shown as is."""

    ok: bool
    body: Mapping[str, Any] = field(default_factory=dict)


Probe = Callable[[], ProbeResult]


def _always_ok() -> ProbeResult:
    return ProbeResult(True, {"status": "ok"})


class HttpServer:
    """One aiohttp application on one socket: metrics, probes and the process's own routes."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        healthz: Probe = _always_ok,
        readyz: Probe = _always_ok,
        routes: Callable[[web.Application], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.registry = registry
        self._healthz = healthz
        self._readyz = readyz
        self._routes = routes
        self._ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self._health_runner: web.AppRunner | None = None
        self.port = 0
        self.health_port = 0

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[client_errors])  # 400, never 500, on bad bodies
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_get("/healthz", self._answer(self._healthz))
        app.router.add_get("/readyz", self._answer(self._readyz))
        if self._routes is not None:
            self._routes(app)
        return app

    @staticmethod
    def _answer(probe: Probe) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            result = probe()
            return web.json_response(dict(result.body), status=200 if result.ok else 503)

        return handler

    async def start(self, host: str, port: int) -> int:
        """Serve; returns the bound port (port 0 picks a free one)."""
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        # Bind the socket ourselves so port 0 works and the bound port is known.
        sock = socket.create_server((host, port))
        await web.SockSite(runner, sock, ssl_context=self._ssl_context).start()
        self._runner = runner
        self.port = sock.getsockname()[1]
        return self.port

    async def start_health(self, host: str, port: int) -> int:
        """Also serve /healthz and /readyz, and nothing else, in plain text; returns the port."""
        app = web.Application()
        app.router.add_get("/healthz", self._answer(self._healthz))
        app.router.add_get("/readyz", self._answer(self._readyz))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.create_server((host, port))
        await web.SockSite(runner, sock).start()
        self._health_runner = runner
        self.health_port = sock.getsockname()[1]
        return self.health_port

    async def stop(self) -> None:
        """Stop serving."""
        for runner in (self._runner, self._health_runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._health_runner = None
