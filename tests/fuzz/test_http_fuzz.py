"""Garbage on every HTTP route of a running aggregator: the answer is never a 500 and the log
never shows a traceback (issue 13, item 6-7).

The aggregator runs on its own event loop in a thread, on a real loopback socket; hypothesis
sends raw bytes, arbitrary JSON values, deep nesting and well-shaped ExtenderArgs with wrong
field types. Runs are derandomized with no example database, so CI sees the same inputs."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.server import Aggregator, AggregatorConfig
from tests.builders import nvswitch_node
from tests.fuzz.conftest import record_summary

POSTS = [
    "/api/v1/placement/place",
    "/api/v1/placement/commit",
    "/api/v1/placement/release",
    "/api/v1/placement/explain",
    "/scheduler/filter",
    "/scheduler/prioritize",
]
GETS = [
    "/api/v1/topology",
    "/api/v1/topology?links=false",
    "/api/v1/nodes/dgx-1",
    "/api/v1/nodes/dgx-1/sources",
    "/api/v1/nodes/dgx-1/holders",
    "/api/v1/summary",
    "/healthz",
    "/readyz",
    "/metrics",
]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class _Tracebacks(logging.Handler):
    """Counts log records that carry a traceback (what a 500 from aiohttp logs)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.stack_info:
            self.records.append(record)


class _Served:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.agg = Aggregator(AggregatorConfig(http_port=0))
        self.counts = {"requests": 0, "http_500": 0, "crashes": 0}
        self.statuses: dict[int, int] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.agg.start(), self.loop).result(60)
        self.agg.state.apply_snapshot(nvswitch_node("dgx-1"), incarnation=1, sequence=1)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.agg.stop(grace_s=0.1), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def send(self, method: str, path: str, body: bytes | None = None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.agg.http_port, timeout=30)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        finally:
            conn.close()
        self.counts["requests"] += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status >= 500 and path != "/readyz":  # readyz answers 503 by design when not ready
            self.counts["http_500"] += 1
        return status


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[_Served, _Tracebacks]]:
    catcher = _Tracebacks()
    logging.getLogger().addHandler(catcher)
    s = _Served()
    s.start()
    try:
        yield s, catcher
    finally:
        s.stop()
        logging.getLogger().removeHandler(catcher)
        summary = {
            "suite": "http",
            **s.counts,
            "tracebacks_in_log": len(catcher.records),
            "statuses": s.statuses,
        }
        record_summary(summary)


def _nest(depth: int, value: Any = 0) -> bytes:
    return b"[" * depth + json.dumps(value).encode() + b"]" * depth


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
# ExtenderArgs with the right keys and the wrong types inside: where a handler trusts a shape.
anything = json_values | st.sampled_from([{}, [], "", 0, -1, 10**30, 1e308])
extender_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": st.one_of(
            anything,
            st.fixed_dictionaries(
                {},
                optional={
                    "metadata": st.one_of(
                        anything,
                        st.fixed_dictionaries({}, optional={"annotations": anything}),
                    ),
                    "spec": st.one_of(
                        anything,
                        st.fixed_dictionaries(
                            {},
                            optional={
                                "containers": st.one_of(
                                    anything,
                                    st.lists(
                                        st.one_of(
                                            anything,
                                            st.fixed_dictionaries(
                                                {},
                                                optional={
                                                    "resources": st.one_of(
                                                        anything,
                                                        st.fixed_dictionaries(
                                                            {},
                                                            optional={
                                                                "limits": st.one_of(
                                                                    anything,
                                                                    st.fixed_dictionaries(
                                                                        {"nvidia.com/gpu": anything}
                                                                    ),
                                                                )
                                                            },
                                                        ),
                                                    )
                                                },
                                            ),
                                        ),
                                        max_size=3,
                                    ),
                                )
                            },
                        ),
                    ),
                },
            ),
        ),
        "NodeNames": st.one_of(anything, st.lists(anything, max_size=3)),
        "Nodes": st.one_of(
            anything,
            st.fixed_dictionaries(
                {}, optional={"items": st.one_of(anything, st.lists(anything, max_size=3))}
            ),
        ),
    },
)


@FUZZ
@given(path=st.sampled_from(POSTS), body=st.binary(max_size=200))
def test_raw_bytes_never_500(served: tuple[_Served, _Tracebacks], path: str, body: bytes) -> None:
    s, _ = served
    assert s.send("POST", path, body) < 500


@FUZZ
@given(path=st.sampled_from(POSTS), value=json_values)
def test_any_json_value_never_500(
    served: tuple[_Served, _Tracebacks], path: str, value: Any
) -> None:
    s, _ = served
    assert s.send("POST", path, json.dumps(value).encode()) < 500


@FUZZ
@given(path=st.sampled_from(POSTS[4:]), args=extender_args)
def test_extender_args_wrong_types_never_500(
    served: tuple[_Served, _Tracebacks], path: str, args: Any
) -> None:
    s, _ = served
    assert s.send("POST", path, json.dumps(args).encode()) < 500


@pytest.mark.parametrize("depth", [100, 1_000, 100_000])
@pytest.mark.parametrize("path", POSTS)
def test_deep_nesting_is_400(served: tuple[_Served, _Tracebacks], path: str, depth: int) -> None:
    s, _ = served
    wrapped = b'{"request": ' + _nest(depth) + b"}"
    assert s.send("POST", path, _nest(depth)) == 400
    assert s.send("POST", path, wrapped) == 400


@FUZZ
@given(path=st.sampled_from(GETS), junk=st.text(max_size=30))
def test_gets_with_junk_never_500(
    served: tuple[_Served, _Tracebacks], path: str, junk: str
) -> None:
    s, _ = served
    from urllib.parse import quote

    sep = "&" if "?" in path else "?"
    assert s.send("GET", f"{path}{sep}links={quote(junk)}&{quote(junk)}=1") < 500
    assert s.send("GET", f"/api/v1/nodes/{quote(junk, safe='')}") < 500
    assert s.send("GET", f"/api/v1/nodes/{quote(junk, safe='')}/holders") < 500


def test_exporter_routes_never_500() -> None:
    """The exporter serves only the common routes (runtime.http.HttpServer); the same garbage,
    methods it does not serve and junk queries get 4xx, never 5xx."""
    from prometheus_client import CollectorRegistry

    from gputopo.runtime.http import HttpServer

    async def go() -> list[int]:
        import aiohttp

        server = HttpServer(registry=CollectorRegistry())
        port = await server.start("127.0.0.1", 0)
        out = []
        try:
            async with aiohttp.ClientSession() as session:
                for path in ("/metrics", "/healthz", "/readyz", "/nope", "/metrics?name[]=%ff"):
                    for method in ("GET", "POST", "PUT", "DELETE"):
                        body = b"[" * 100_000 if method != "GET" else None
                        url = f"http://127.0.0.1:{port}{path}"
                        async with session.request(method, url, data=body) as resp:
                            out.append(resp.status)
        finally:
            await server.stop()
        return out

    statuses = asyncio.run(go())
    assert len(statuses) == 20
    assert all(s < 500 for s in statuses), statuses


def test_the_400_names_the_problem(served: tuple[_Served, _Tracebacks]) -> None:
    """What a client reads: the route (or field) and what is wrong, on one line."""
    s, _ = served
    base = f"http://127.0.0.1:{s.agg.http_port}"
    cases = {
        "/api/v1/placement/place": (_nest(5_000), "nested too deeply"),
        "/api/v1/placement/commit": (b"[1, 2]", "a JSON object expected, not list"),
        "/scheduler/filter": (b'{"Pod": {"metadata": [1]}, "NodeNames": []}', "Pod.metadata"),
        "/scheduler/prioritize": (b'{"Pod": {}, "NodeNames": [1]}', "NodeNames"),
    }
    for path, (body, words) in cases.items():
        req = urllib.request.Request(base + path, data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=30)
        assert info.value.code == 400
        text = info.value.read().decode()
        assert words in text, (path, text)
        assert "\n" not in text.strip()


def test_no_traceback_was_logged(served: tuple[_Served, _Tracebacks]) -> None:
    """Runs last in the module: every request above left no traceback in the log."""
    s, catcher = served
    assert s.counts["requests"] > 0
    assert [r.getMessage() for r in catcher.records] == []
    assert s.counts["http_500"] == 0
