"""The topology page behind mutual TLS: every URL it uses is relative, and resolves over HTTPS.

The browser test (test_topology_page.py) runs over plain HTTP: headless Chromium has no way to
present a client certificate without a system policy. This test covers the rest of the promise
that the page works when the aggregator serves HTTPS with client certificates: the page names
no scheme, host or absolute path, and each URL it fetches, resolved against `/ui/` as a browser
would, reaches its route over mutual TLS (and nothing is served to a client without a cert).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import urllib.parse
from pathlib import Path

import aiohttp
import pytest

from aggregator.http import UI
from aggregator.server import Aggregator, AggregatorConfig
from gputopo.runtime.tls import ssl_client_context
from tests.harness.certs import TestCA

# The first argument of every getJSON(...) call in app.js, and every src/href in index.html.
_FETCHES = re.compile(r"getJSON\(\s*[`\"]([^`\"]+)[`\"]")
_LINKS = re.compile(r"""(?:src|href|action)="([^"]*)\"""")


def _page_urls() -> list[str]:
    urls = _FETCHES.findall((UI / "app.js").read_text())
    urls += _LINKS.findall((UI / "index.html").read_text())
    return urls


def test_the_page_names_only_relative_urls() -> None:
    urls = _page_urls()
    assert len(urls) >= 6, urls  # four JSON routes, the stylesheet, the script
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        assert not parts.scheme, url
        assert not parts.netloc, url
        assert not url.startswith("/"), url


def test_every_url_the_page_uses_resolves_over_mutual_tls(tmp_path: Path) -> None:
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "gputopo-aggregator.gputopo-system.svc")
    client = ssl_client_context(ca.issue(tmp_path / "viewer", "viewer"))
    seen: dict[str, tuple[int, str]] = {}

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, tls=server))
        await agg.start()
        page = f"https://localhost:{agg.http_port}/ui/"
        try:
            async with aiohttp.ClientSession() as session:
                for url in ["", *_page_urls()]:
                    named = url.replace("${encodeURIComponent(name)}", "n1")
                    target = urllib.parse.urljoin(page, named)
                    method = "POST" if target.endswith("/explain") else "GET"
                    async with session.request(
                        method, target, ssl=client, json={"reservation_id": "r1"}
                    ) as resp:
                        seen[urllib.parse.urlsplit(target).path] = (
                            resp.status,
                            resp.content_type,
                        )
                anonymous = ssl.create_default_context(cafile=str(server.ca))
                with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
                    async with session.get(page, ssl=anonymous) as resp:
                        await resp.read()
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(body(), timeout=60))
    assert seen["/ui/"] == (200, "text/html")
    assert seen["/ui/app.js"][0] == 200
    assert seen["/ui/style.css"] == (200, "text/css")
    assert seen["/api/v1/summary"] == (200, "application/json")
    # No node and no reservation here: the routes answer with their JSON "not found".
    assert seen["/api/v1/nodes/n1"] == (404, "application/json")
    assert seen["/api/v1/nodes/n1/holders"] == (404, "application/json")
    assert seen["/api/v1/placement/explain"] == (404, "application/json")
