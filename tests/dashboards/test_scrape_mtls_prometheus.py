"""A real Prometheus scrapes the aggregator and an exporter over mutual TLS with the shipped
scrape settings, and every dashboard panel returns series, the measured-bandwidth panels from a
copy probe that ran over the fake CUDA runtime.

Everything is as deployed except where a test cannot be a cluster:
- certificates are `gputopo certs`' (`gputopo.runtime.pki.default_secrets`), the aggregator's
  with 127.0.0.1 added, the address the in-process parts dial instead of its Service;
- the Prometheus jobs are `deploy/prometheus/scrape-configs.yaml`'s, scheme, `tls_config` and
  `server_name` as shipped, with static targets for the Kubernetes discovery (Debian's
  Prometheus is built without it) and the test's files for the mounted Secret;
- the exporter is the real agent (TLS on /metrics and to the aggregator) over a simulated
  machine: fake NVML and sysfs, and the real copy probe over `exporter.fake_cuda`.

A job with the CA but no client certificate must fail its scrapes: mutual TLS is enforced.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.server import Aggregator, AggregatorConfig
from exporter.agent import Agent, AgentConfig
from exporter.fake_cuda import FakeCudaRuntime, FakeGpu
from exporter.fake_machine import FakeMachine
from exporter.fake_nvml import FakeNvml
from exporter.fake_sysfs import write_sysfs
from exporter.nvml import Nvml
from exporter.probes.gpu import CudaCopyProbe
from exporter.probes.runner import ProbeSchedule
from exporter.simulate import SimulatedExporters
from gputopo.app.demo import demo_nodes
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.pki import default_secrets, issue_bundle
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from gputopo.runtime.tls import TlsFiles
from gputopo.topology import Measurement
from tests.dashboards.test_dashboards_prometheus import DASHBOARDS, panel_queries
from tests.deploy.manifests import COMPONENTS, overlay
from tests.harness.prometheus import Prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_CONFIGS = ROOT / "deploy" / "prometheus" / "scrape-configs.yaml"
NODE = "mtls-node"
PROFILE = "h100-nv6-4x"


class FakeCudaProbe:
    """The agent's GPU probe client, running the real copy probe over the fake CUDA runtime in
    a thread (the worker process would import the real cuda-bindings)."""

    def __init__(self, bus_ids: Sequence[str]) -> None:
        gpus = [
            FakeGpu(bus, peers={j: 350.0 for j in range(len(bus_ids)) if j != i})
            for i, bus in enumerate(bus_ids)
        ]
        runtime = FakeCudaRuntime(gpus)
        self.probe = CudaCopyProbe(
            runtime=runtime,
            monotonic=runtime.now,
            sleep=runtime.sleep,
            clock=time.time,  # measured_at: wall time, so the measurement is fresh
            size_bytes=64 << 20,
            min_samples=3,
            min_duration_s=0.05,
            latency_copies=3,
        )

    def installed(self) -> tuple[bool, str]:
        return True, ""

    async def start(self) -> tuple[bool, str]:
        return await asyncio.to_thread(self.probe.available)

    async def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        return await asyncio.to_thread(self.probe.peer, src_bus_id, dst_bus_id)

    async def host(self, bus_id: str, cpus: Sequence[int]) -> Measurement:
        # The probe pins itself to the GPU's NUMA CPUs; the simulated machine's are not this
        # machine's, so it pins to the CPUs this test may use.
        del cpus
        return await asyncio.to_thread(
            self.probe.host, bus_id, cpus=sorted(os.sched_getaffinity(0))
        )

    async def close(self) -> None:
        return None


def _files(root: Path, name: str, cert: bytes, key: bytes, ca: bytes) -> TlsFiles:
    directory = root / name
    directory.mkdir(parents=True)
    files = TlsFiles(directory / "tls.crt", directory / "tls.key", directory / "ca.crt")
    files.cert.write_bytes(cert)
    files.key.write_bytes(key)
    files.ca.write_bytes(ca)
    return files


def _pki(root: Path) -> dict[str, TlsFiles]:
    specs = [
        replace(s, dns_names=(*s.dns_names, "127.0.0.1")) if "aggregator" in s.name else s
        for s in default_secrets(namespace="gputopo-system", exporter_namespace="gputopo-exporter")
    ]
    bundle = issue_bundle(specs, days=1, now=datetime.datetime.now(datetime.UTC))
    out = {}
    for issued in bundle.issued:
        key = f"{issued.spec.namespace}/{issued.spec.name}"
        out[key] = _files(root, key.replace("/", "-"), issued.cert, issued.key, issued.ca)
    return out


def _jobs(prom_tls: TlsFiles, targets: dict[str, str]) -> list[dict[str, Any]]:
    """The shipped jobs, discovery swapped for static targets, the Secret's files for ours."""
    shipped = yaml.safe_load(SCRAPE_CONFIGS.read_text(encoding="utf-8"))["scrape_configs"]
    jobs = []
    for original in shipped:
        if original["job_name"] not in targets:
            continue
        job = copy.deepcopy(original)
        del job["kubernetes_sd_configs"], job["relabel_configs"]
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        tls = job["tls_config"]
        assert set(tls) == {"ca_file", "cert_file", "key_file", "server_name"}
        tls |= {"ca_file": str(prom_tls.ca), "cert_file": str(prom_tls.cert)}
        tls["key_file"] = str(prom_tls.key)
        jobs.append(job)
    # Mutual TLS enforced: the CA alone (no client certificate) must fail.
    stranger = copy.deepcopy(jobs[0])
    stranger["job_name"] = "no-client-certificate"
    del stranger["tls_config"]["cert_file"], stranger["tls_config"]["key_file"]
    return [*jobs, stranger]


def test_the_operator_monitors_say_what_the_scrape_configs_say() -> None:
    """One set of scrape settings, two spellings: the ServiceMonitor/PodMonitors of
    optional/prometheus-operator and deploy/prometheus/scrape-configs.yaml."""
    shipped = {
        j["job_name"]: j
        for j in yaml.safe_load(SCRAPE_CONFIGS.read_text(encoding="utf-8"))["scrape_configs"]
    }
    monitors = [
        d for d in overlay("default", components=COMPONENTS) if d["kind"].endswith("Monitor")
    ]
    assert {m["metadata"]["name"] for m in monitors} == set(shipped)
    for monitor in monitors:
        (endpoint,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        job = shipped[monitor["metadata"]["name"]]
        assert endpoint["scheme"] == job["scheme"] == "https"
        assert endpoint["tlsConfig"]["serverName"] == job["tls_config"]["server_name"]
        secret = endpoint["tlsConfig"]["keySecret"]["name"]
        assert secret == endpoint["tlsConfig"]["cert"]["secret"]["name"] == "gputopo-prometheus-tls"


def test_prometheus_scrapes_over_mutual_tls_and_every_panel_has_series(tmp_path: Path) -> None:
    pki = _pki(tmp_path / "pki")
    fake = FakeMachine.from_profile(PROFILE, node_name=NODE)
    bus_ids = [g.pci_bus_id for g in fake.topology.gpus]
    results: dict[str, Any] = {}
    targets_seen: list[dict[str, Any]] = []

    async def body() -> None:
        agg = Aggregator(
            AggregatorConfig(
                http_port=0,
                heartbeat_interval_s=0.5,
                tls=pki["gputopo-system/gputopo-aggregator-tls"],
            )
        )
        await agg.start()
        exporter_tls = pki["gputopo-exporter/gputopo-exporter-tls"]
        agent = Agent(
            AgentConfig(
                node_name=NODE,
                aggregator=agg.grpc_target,
                http_host="127.0.0.1",
                http_port=0,
                probe_host="127.0.0.1",
                probe_port=0,
                sysfs_root=write_sysfs(fake, tmp_path / "sys"),
                simulated=PROFILE,
                heartbeat_interval_s=0.5,
                peer_probes=False,
                tls=exporter_tls,
                probe_schedule=ProbeSchedule(interval_s=600.0, first_after_s=0.2, jitter=0.0),
            ),
            nvml=Nvml(FakeNvml(fake).library),
            gpu_probe=FakeCudaProbe(bus_ids),
        )
        await agent.start()
        try:
            async with SimulatedExporters(
                demo_nodes(), target=agg.grpc_target, heartbeat_interval_s=0.5, tls=exporter_tls
            ) as sim:
                await sim.wait_acked(timeout_s=60)
                scheduler_tls = pki["gputopo-system/gputopo-scheduler-tls"]
                async with grpcio.channel(agg.grpc_target, tls=scheduler_tls) as channel:
                    client = PlacementClient(channel)
                    one = {"job": "j", "groups": [{"name": "g", "pods": 1, "gpus_per_pod": 8}]}
                    huge = {"job": "h", "groups": [{"name": "g", "pods": 500, "gpus_per_pod": 8}]}
                    await client.place(request_from_mapping(one))
                    await client.place(request_from_mapping(one), dry_run=True)
                    await client.place(request_from_mapping(huge))
                    with pytest.raises(PlacementCallError):
                        await client.release("not-a-reservation")
                jobs = _jobs(
                    pki["gputopo-system/gputopo-prometheus-tls"],
                    {
                        "gputopo-aggregator": f"127.0.0.1:{agg.http_port}",
                        "gputopo-exporter": f"127.0.0.1:{agent.http_port}",
                    },
                )
                prom = await asyncio.to_thread(
                    Prometheus.start,
                    workdir=tmp_path / "prometheus",
                    targets=[],
                    scrape_configs=jobs,
                )
                try:
                    for promql in (
                        'up{job="gputopo-aggregator"} == 1',
                        'up{job="gputopo-exporter"} == 1',
                        "gputopo_link_bandwidth_measured_bytes_per_second",
                        'gputopo_probe_available{probe="gpu-copy"} == 1',
                        'up{job="no-client-certificate"} == 0',
                    ):
                        await asyncio.to_thread(prom.wait_for, promql, timeout_s=90)
                    await asyncio.sleep(6)  # a few scrapes, for rate() over 15 s
                    for name in DASHBOARDS:
                        for title, expr in panel_queries(name):
                            filled = expr.replace("$__rate_interval", "15s").replace("$node", NODE)
                            results[f"{name}: {title}: {expr}"] = prom.query(filled)
                    targets_seen.extend(prom.targets())
                finally:
                    prom.stop()
        finally:
            await agent.stop()
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(body(), timeout=280))
    empty = [key for key, rows in results.items() if not rows]
    assert not empty, "queries that returned nothing:\n" + "\n".join(empty)
    by_job = {t["labels"]["job"]: t for t in targets_seen}
    for job in ("gputopo-aggregator", "gputopo-exporter"):
        assert by_job[job]["scrapeUrl"].startswith("https://"), by_job[job]
        assert by_job[job]["health"] == "up", by_job[job]
    assert by_job["no-client-certificate"]["health"] == "down"
    print(f"MTLS-DASHBOARD-QUERIES {len(results)} panel queries, all returned series")
