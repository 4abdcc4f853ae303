"""Exporter and aggregator over mutual TLS on loopback: the real `gputopo exporter` command with
the manifests' flags reaches an aggregator that requires client certificates, while a
plain-text exporter (`--insecure`) for another node never gets its report applied.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.runtime.tls import TlsFiles, ssl_client_context
from tests.aggregator.kubeutil import run
from tests.exporter_process import start_exporter
from tests.harness.certs import TestCA


def _exporter(node: str, port: int, tls: TlsFiles | None, logs: Path) -> subprocess.Popen[bytes]:
    return start_exporter(node, f"localhost:{port}", logs / f"{node}-{id(tls)}.log", tls=tls)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def test_a_node_certificate_may_report_only_its_own_node(tmp_path: Path) -> None:
    """The attack of issue 12: a valid certificate of node a100-01 reporting as a100-02."""
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "gputopo-aggregator.gputopo-system.svc")
    own = ca.issue(tmp_path / "own", "system:node:a100-01")
    anonymous = ca.issue(tmp_path / "anon", "exporter")

    async def body() -> None:
        agg = Aggregator(
            AggregatorConfig(heartbeat_interval_s=0.2, tls=server, require_node_identity=True)
        )
        await agg.start()
        procs = [
            _exporter("a100-02", agg.grpc_port, own, tmp_path),
            _exporter("a100-03", agg.grpc_port, anonymous, tmp_path),
            _exporter("a100-01", agg.grpc_port, own, tmp_path),
        ]
        try:
            denied = agg.reporter.stats.rejected
            for _ in range(600):
                if agg.state.record("a100-01") is not None and denied["node_identity"] >= 2:
                    break
                await asyncio.sleep(0.1)
            assert agg.state.record("a100-01") is not None
            assert denied["node_identity"] >= 2  # what the metric reports_rejected_total shows
            assert agg.state.record("a100-02") is None
            assert agg.state.record("a100-03") is None
        finally:
            _stop(procs)
            await agg.stop(grace_s=0.1)

    run(body(), timeout_s=200)


def test_exporter_and_aggregator_speak_mutual_tls_and_refuse_plain_text(tmp_path: Path) -> None:
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "gputopo-aggregator.gputopo-system.svc")
    client = ca.issue(tmp_path / "exporter", "exporter")

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.2, tls=server))
        await agg.start()
        procs = [
            _exporter("tls-node", agg.grpc_port, client, tmp_path),
            _exporter("plain-node", agg.grpc_port, None, tmp_path),
        ]
        try:
            for _ in range(600):
                if agg.state.record("tls-node") is not None:
                    break
                await asyncio.sleep(0.1)
            assert agg.state.record("tls-node") is not None
            # The plain-text exporter has had as long, and retries: nothing of it got in.
            await asyncio.sleep(2)
            assert agg.state.record("plain-node") is None
            url = f"https://localhost:{agg.http_port}/readyz"
            async with (
                aiohttp.ClientSession() as session,
                session.get(url, ssl=ssl_client_context(client)) as resp,
            ):
                assert resp.status == 200
        finally:
            _stop(procs)
            await agg.stop(grace_s=0.1)

    run(body(), timeout_s=200)


def test_the_probes_answer_in_plain_text_on_their_own_port_and_nothing_else_does(
    tmp_path: Path,
) -> None:
    """The kubelet's HTTP probes carry no client certificate: the health port serves them, and
    only them; the TLS port still refuses plain text."""
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "localhost")

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, health_port=0, tls=server))
        await agg.start()
        try:
            plain = f"http://localhost:{agg.health_port}"
            async with aiohttp.ClientSession() as session:
                for path in ("/healthz", "/readyz"):
                    async with session.get(plain + path) as resp:
                        assert resp.status == 200, path
                for path in ("/metrics", "/api/v1/topology"):
                    async with session.get(plain + path) as resp:
                        assert resp.status == 404, path
                refused = False
                try:
                    async with session.get(f"http://localhost:{agg.http_port}/healthz") as resp:
                        refused = resp.status >= 400
                except aiohttp.ClientError:
                    refused = True
                assert refused, "the TLS port answered plain text"
        finally:
            await agg.stop(grace_s=0.1)

    run(body(), timeout_s=60)
