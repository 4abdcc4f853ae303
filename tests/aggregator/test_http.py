"""The aggregator's HTTP side: health, readiness, JSON API, and metrics a real Prometheus reads."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aggregator.metrics import METRIC_NAMES
from aggregator.server import Aggregator, AggregatorConfig
from exporter.simulate import SimulatedExporters
from gputopo.machines import with_gpu_fabric
from tests.aggregator.kubeutil import run
from tests.builders import fabric_cluster

NODES = fabric_cluster(spines=1, leaves_per_spine=2, nodes_per_leaf=2, gpus=8)
UUID = "9277d399-0674-44a9-b64e-d85bb19ce2b0"
NODES[-1] = with_gpu_fabric(NODES[-1], cluster_uuid=UUID, clique_id=2)


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, str]:
    async with session.get(url) as response:
        text = await response.text()
        body = json.loads(text) if response.content_type == "application/json" else None
        return response.status, body, text


def test_health_readiness_json_api_and_metrics() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.2))
        await agg.start()
        base = f"http://127.0.0.1:{agg.http_port}"
        try:
            async with (
                SimulatedExporters(NODES, target=agg.grpc_target, heartbeat_interval_s=0.2) as sim,
                aiohttp.ClientSession() as session,
            ):
                await sim.wait_acked()
                status, health, _ = await get(session, f"{base}/healthz")
                assert (status, health) == (200, {"status": "ok"})
                status, ready, _ = await get(session, f"{base}/readyz")
                assert status == 200
                assert ready == {"ready": True, "role": "leader", "nodes": 4}
                status, topo, _ = await get(session, f"{base}/api/v1/topology?links=false")
                assert status == 200
                assert len(topo["nodes"]) == 4
                assert all(n["topology"]["links"] == [] for n in topo["nodes"])
                leaves = [d for d in topo["domains"] if d["level"] == "tier-0"]
                assert sorted(d["total_gpus"] for d in leaves) == [16, 16]
                name = NODES[0].name
                status, node, _ = await get(session, f"{base}/api/v1/nodes/{name}")
                assert status == 200
                assert node["topology"]["name"] == name
                assert node["placeable"] is True
                status, missing, _ = await get(session, f"{base}/api/v1/nodes/nope")
                assert status == 404
                assert "nope" in missing["error"]
                status, sources, _ = await get(
                    session, f"{base}/api/v1/nodes/{NODES[-1].name}/sources"
                )
                assert status == 200
                assert sources["chosen"] == {"tiers": "exporter", "accelerator": "nvml"}
                assert sources["fabric"]["accelerator_sub_domain"] == f"{UUID}.2"
                assert sources["desired_labels"]["gputopo.io/interconnect"] == "mnnvl"
                status, _, text = await get(session, f"{base}/metrics")
                assert status == 200
                metrics = {m.name: m for m in text_string_to_metric_families(text)}
                samples = {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for m in metrics.values()
                    for s in m.samples
                }
                assert samples[("gputopo_aggregator_nodes", (("status", "reporting"),))] == 4
                assert samples[("gputopo_aggregator_gpus", (("state", "total"),))] == 32
                leaf = (("domain", "core/spine-0/leaf-0-0"), ("level", "tier-0"), ("state", "free"))
                assert samples[("gputopo_aggregator_domain_gpus", leaf)] == 16
                snapshots = (("kind", "snapshot"), ("outcome", "accepted"))
                assert samples[("gputopo_aggregator_reports_total", snapshots)] == 4
                assert samples[("gputopo_aggregator_report_freshness_seconds_count", ())] >= 4
                assert samples[("gputopo_aggregator_leader", ())] == 1
                # Every family the collector yields has a name from the one list.
                for family in metrics.values():
                    assert family.name in {n.removesuffix("_total") for n in METRIC_NAMES}
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A real Prometheus whose config the test writes to the returned path before reload."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).is_file():
        pytest.fail(
            "prometheus is not installed: apt-get install prometheus (Debian), "
            "or run scripts/ensure-prometheus.sh",
            pytrace=False,
        )
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s}\n", encoding="utf-8")
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield config, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        data = json.load(response)
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


@pytest.mark.prometheus
def test_a_real_prometheus_scrapes_the_metrics(prometheus: tuple[Path, int]) -> None:
    config, port = prometheus

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.2))
        await agg.start()
        try:
            async with SimulatedExporters(
                NODES, target=agg.grpc_target, heartbeat_interval_s=0.2
            ) as sim:
                await sim.wait_acked()
                config.write_text(
                    "global: {scrape_interval: 1s}\n"
                    "scrape_configs:\n"
                    "  - job_name: aggregator\n"
                    f"    static_configs: [{{targets: ['127.0.0.1:{agg.http_port}']}}]\n",
                    encoding="utf-8",
                )
                deadline = time.monotonic() + 60
                reloaded = False
                while time.monotonic() < deadline:
                    try:
                        if not reloaded:
                            req = urllib.request.Request(
                                f"http://127.0.0.1:{port}/-/reload", method="POST"
                            )
                            await asyncio.to_thread(urllib.request.urlopen, req, timeout=5)
                            reloaded = True
                        total = await asyncio.to_thread(
                            _query, port, 'gputopo_aggregator_gpus{state="total"}'
                        )
                        up = await asyncio.to_thread(_query, port, 'up{job="aggregator"}')
                        if total and up:
                            break
                    except OSError:
                        pass  # still starting
                    await asyncio.sleep(0.5)
                else:
                    raise AssertionError("Prometheus never scraped the aggregator")
                assert up[0]["value"][1] == "1"
                assert total[0]["value"][1] == "32"
                freshness = await asyncio.to_thread(
                    _query, port, "gputopo_aggregator_report_freshness_seconds_count"
                )
                assert float(freshness[0]["value"][1]) >= 4
                domains = await asyncio.to_thread(
                    _query, port, 'gputopo_aggregator_domain_gpus{level="nvlink",state="total"}'
                )
                assert [d["value"][1] for d in domains] == ["8"]
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def test_sources_list_the_inventory_once_for_a_node_served_from_it() -> None:
    inventory = Path(__file__).parent.parent / "data" / "inventory_small.yaml"

    async def body() -> None:
        config = AggregatorConfig(http_port=0, inventory_path=str(inventory), inventory_nodes=True)
        agg = Aggregator(config)
        await agg.start()
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{agg.http_port}/api/v1/nodes/gb200-001/sources"
                status, sources, _ = await get(session, url)
        finally:
            await agg.stop(grace_s=0.1)
        assert status == 200
        assert [s["source"] for s in sources["sources"]] == ["inventory", "nvml"]
        assert set(sources["chosen"].values()) == {"inventory"}

    run(body())
