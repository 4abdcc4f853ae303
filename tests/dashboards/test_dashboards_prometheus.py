"""Every dashboard panel's query returns data from a real Prometheus scraping the running parts.

What Prometheus scrapes here: an aggregator (the demo's nodes streaming to it, Place calls made
that place, fail to place, dry-run and are refused), a real `gputopo exporter --simulate`
process, the exporter's own collector over two more nodes (one whose GPUs have the UUIDs of a
recorded dcgm-exporter scrape, with measured and degraded links), and those recorded DCGM scrapes
themselves. Then each panel's PromQL from the generated JSON (variables filled in) must return
at least one series, and a gputopo per-GPU series must join the recorded DCGM series on
dcgm-exporter's own labels, without relabelling. The binder's dashboard is proven in
`test_binder_dashboard_kube.py` against a binder on the real API server.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from aggregator.server import Aggregator, AggregatorConfig
from exporter.metrics import ExporterView, register
from exporter.simulate import SimulatedExporters
from gputopo.app.demo import demo_nodes
from gputopo.links import LinkHealth, LinkKind
from gputopo.machines import load_machine
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.http import HttpServer
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from gputopo.topology import Measurement, NodeTopology
from tests.exporter_process import start_exporter
from tests.harness.prometheus import Prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DCGM = ROOT / "tests" / "data" / "dcgm"
RECORDED_A100 = DCGM / "dcgm_exporter_metrics_dgx_a100_nvlink_partial.prom"
RECORDED_3090 = DCGM / "dcgm_exporter_pci_bus_id_rtx3090.prom"
DASHBOARDS = ("gputopo-cluster.json", "gputopo-node.json", "gputopo-placement.json")


def panel_queries(name: str) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every panel of a generated dashboard, rows included."""
    board = json.loads((ROOT / "dashboards" / name).read_text(encoding="utf-8"))
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]


def _recorded_uuids(path: Path) -> list[str]:
    return re.findall(r'UUID="([^"]+)"', path.read_text(encoding="utf-8"))


def _axa() -> NodeTopology:
    """An 8-GPU A100 node named as the recorded scrape's host, whose first GPUs have the
    recorded UUIDs; one NVLink measured, one degraded, as a node with probes reports them."""
    topo = load_machine("hgx-a100-roce", node_name="axa")
    uuids = _recorded_uuids(RECORDED_A100)
    gpus = tuple(
        replace(g, uuid=uuids[i]) if i < len(uuids) else g for i, g in enumerate(topo.gpus)
    )
    links = list(topo.links)
    nvlinks = [i for i, lk in enumerate(links) if lk.kind is LinkKind.NVLINK]
    links[nvlinks[0]] = replace(
        links[nvlinks[0]], measured=Measurement(231.5, "cuda-memcpy", measured_at=1.0)
    )
    links[nvlinks[1]] = replace(
        links[nvlinks[1]], health=LinkHealth.DEGRADED, health_reason="lanes_down"
    )
    return replace(topo, gpus=gpus, links=tuple(links))


def _debian() -> NodeTopology:
    """The recorded RTX 3090 host: one GPU, its UUID and bus id as DCGM labelled them."""
    topo = load_machine("workstation-2x-rtx5090", node_name="debian")
    (uuid,) = _recorded_uuids(RECORDED_3090)
    gpu = replace(topo.gpus[0], uuid=uuid, pci_bus_id="0000:08:00.0")
    return replace(topo, gpus=(gpu, *topo.gpus[1:]))


async def _serve_view(topology: NodeTopology) -> HttpServer:
    registry = CollectorRegistry()
    view = ExporterView(node_name=topology.name, version="test", topology=topology)
    register(registry, lambda: view)
    server = HttpServer(registry=registry)
    await server.start("127.0.0.1", 0)
    return server


async def _serve_text(text: str) -> tuple[web.AppRunner, int]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return runner, int(sock.getsockname()[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exporter(port: int, target: str, log: Path) -> subprocess.Popen[bytes]:
    extra = ("--http-host=127.0.0.1", f"--http-port={port}")
    return start_exporter("real-exporter", target, log, extra=extra)


def _fill(expr: str) -> str:
    return expr.replace("$__rate_interval", "15s").replace("$node", "axa")


def test_every_panel_returns_data_and_gputopo_joins_dcgm(tmp_path: Path) -> None:
    results: dict[str, Any] = {}

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.5))
        await agg.start()
        port = _free_port()
        proc = _exporter(port, agg.grpc_target, tmp_path / "exporter.log")
        views = [await _serve_view(_axa()), await _serve_view(_debian())]
        recorded = [p.read_text(encoding="utf-8") for p in (RECORDED_A100, RECORDED_3090)]
        texts = [await _serve_text(text) for text in recorded]
        try:
            async with SimulatedExporters(
                demo_nodes(), target=agg.grpc_target, heartbeat_interval_s=0.5
            ) as sim:
                await sim.wait_acked(timeout_s=60)
                async with grpcio.channel(agg.grpc_target) as channel:
                    client = PlacementClient(channel)
                    one = {"job": "j", "groups": [{"name": "g", "pods": 1, "gpus_per_pod": 8}]}
                    huge = {"job": "h", "groups": [{"name": "g", "pods": 500, "gpus_per_pod": 8}]}
                    await client.place(request_from_mapping(one))
                    await client.place(request_from_mapping(one), dry_run=True)
                    await client.place(request_from_mapping(huge))
                    with pytest.raises(PlacementCallError):
                        await client.release("not-a-reservation")
                targets = [
                    f"127.0.0.1:{agg.http_port}",
                    f"127.0.0.1:{port}",
                    *(f"127.0.0.1:{v.port}" for v in views),
                    *(f"127.0.0.1:{p}" for _, p in texts),
                ]
                prom = await asyncio.to_thread(
                    Prometheus.start, workdir=tmp_path / "prometheus", targets=targets
                )
                try:
                    await asyncio.to_thread(prom.wait_for, "gputopo_exporter_info", timeout_s=60)
                    await asyncio.to_thread(
                        prom.wait_for,
                        'gputopo_aggregator_gpus{state="total"}',
                        timeout_s=60,
                    )
                    await asyncio.to_thread(
                        prom.wait_for, 'gputopo_exporter_info{node="real-exporter"}', timeout_s=60
                    )
                    await asyncio.sleep(6)  # a few scrapes, for rate() over 15 s
                    for name in DASHBOARDS:
                        for title, expr in panel_queries(name):
                            results[f"{name}: {title}: {expr}"] = prom.query(_fill(expr))
                    results["join on UUID"] = prom.query(
                        "gputopo_gpu_info * on(UUID) group_left DCGM_FI_PROF_NVLINK_TX_BYTES"
                    )
                    results["join on all four"] = prom.query(
                        "gputopo_gpu_info * on(gpu, UUID, pci_bus_id, Hostname) group_left "
                        "DCGM_FI_DEV_FB_FREE"
                    )
                    results["join on gpu, UUID, Hostname"] = prom.query(
                        "gputopo_gpu_nvlink_active_lanes * on(gpu, UUID, Hostname) group_left "
                        "DCGM_FI_PROF_NVLINK_TX_BYTES"
                    )
                finally:
                    prom.stop()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            for v in views:
                await v.stop()
            for runner, _ in texts:
                await runner.cleanup()
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(body(), timeout=280))
    empty = [key for key, rows in results.items() if not rows]
    assert not empty, "queries that returned nothing:\n" + "\n".join(empty)
    assert len(results["join on UUID"]) == 4  # the recording's four GPUs
    assert len(results["join on all four"]) == 1  # the RTX 3090, bus id as DCGM writes it
    assert len(results["join on gpu, UUID, Hostname"]) == 4
    panels = [k for k in results if k.startswith("gputopo-")]
    print(f"DASHBOARD-QUERIES {len(panels)} panel queries, all returned series")
