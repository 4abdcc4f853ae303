"""Clients follow a renewed certificate without a restart (the servers already did).

gRPC keeps a channel's credentials for its whole life, so the exporter and the scheduler make a
new channel when their files change. Proven end to end: an exporter whose certificate names the
wrong node is refused until its Secret is rotated to the right one, and then reports.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.runtime.tls import TlsFiles, follow_rotation
from tests.aggregator.kubeutil import run
from tests.exporter_process import start_exporter
from tests.harness.certs import TestCA


def _swap_in(
    new: TlsFiles, live: TlsFiles, *, parts: tuple[str, ...] = ("cert", "key", "ca")
) -> None:
    for part in parts:
        shutil.copyfile(getattr(new, part), getattr(live, part))


def _exporter(port: int, tls: TlsFiles, log: Path) -> subprocess.Popen[bytes]:
    return start_exporter(
        "n1", f"localhost:{port}", log, tls=tls, extra=("--tls-check-interval=0.2",)
    )


def test_follow_rotation_waits_for_a_whole_key_pair(tmp_path: Path) -> None:
    ca = TestCA("ca")
    live = ca.issue(tmp_path / "live", "first")
    second = ca.issue(tmp_path / "second", "second")
    calls: list[bytes] = []

    async def changed() -> None:
        calls.append(live.cert.read_bytes())

    async def body() -> None:
        task = asyncio.create_task(follow_rotation(live, changed, interval_s=0.05))
        try:
            await asyncio.sleep(0.2)
            assert calls == []  # nothing changed
            _swap_in(second, live, parts=("cert",))  # half-way: the old key with the new cert
            await asyncio.sleep(0.3)
            assert calls == [], "a certificate without its key must not be used"
            _swap_in(second, live, parts=("key",))
            for _ in range(100):
                if calls:
                    break
                await asyncio.sleep(0.05)
            assert calls == [second.cert.read_bytes()]
            await asyncio.sleep(0.3)
            assert len(calls) == 1  # once per change
        finally:
            task.cancel()

    run(body(), timeout_s=30)


def test_an_exporter_reconnects_with_its_renewed_certificate(tmp_path: Path) -> None:
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "localhost")
    live = ca.issue(tmp_path / "exporter", "system:node:someone-else")
    renewed = ca.issue(tmp_path / "renewed", "system:node:n1")

    async def body() -> None:
        agg = Aggregator(
            AggregatorConfig(heartbeat_interval_s=0.2, tls=server, require_node_identity=True)
        )
        await agg.start()
        proc = _exporter(agg.grpc_port, live, tmp_path / "exporter.log")
        try:
            denied = agg.reporter.stats.rejected
            for _ in range(600):
                if denied["node_identity"] >= 1:
                    break
                await asyncio.sleep(0.1)
            assert denied["node_identity"] >= 1, "the wrong certificate must be refused first"
            assert agg.state.record("n1") is None
            _swap_in(renewed, live)
            for _ in range(300):
                if agg.state.record("n1") is not None:
                    break
                await asyncio.sleep(0.1)
            assert agg.state.record("n1") is not None, (tmp_path / "exporter.log").read_text()
            assert proc.poll() is None, "the same process, not a restart"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            await agg.stop(grace_s=0.1)

    run(body(), timeout_s=200)
