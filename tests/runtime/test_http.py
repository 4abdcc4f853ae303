"""The HTTP boot every process shares: prometheus_client's handler, and probes with status."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from gputopo.runtime.http import HttpServer, ProbeResult


def test_metrics_health_and_readiness() -> None:
    registry = CollectorRegistry()
    Counter("gputopo_test_things", "Things.", registry=registry).inc(3)
    ready = {"ok": False}

    async def body() -> None:
        server = HttpServer(
            registry=registry,
            readyz=lambda: ProbeResult(ready["ok"], {"ready": ready["ok"]}),
        )
        port = await server.start("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/metrics") as r:
                    text = await r.text()
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    assert "gputopo_test_things_total 3.0" in text
                # OpenMetrics when asked: the negotiation comes with prometheus_client's handler.
                headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
                async with session.get(f"{base}/metrics", headers=headers) as r:
                    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                    assert (await r.text()).endswith("# EOF\n")
                async with session.get(f"{base}/healthz") as r:
                    assert (r.status, await r.json()) == (200, {"status": "ok"})
                async with session.get(f"{base}/readyz") as r:
                    assert (r.status, await r.json()) == (503, {"ready": False})
                ready["ok"] = True
                async with session.get(f"{base}/readyz") as r:
                    assert (r.status, await r.json()) == (200, {"ready": True})
        finally:
            await server.stop()

    asyncio.run(body())
