"""The gang binder's dashboard returns data from a real Prometheus scraping a real binder.

The binder runs against the real test API server and an aggregator with simulated exporters
(the binder tests' setup), binds two pods (each a gang of one), and its metrics are served by
the collector `gputopo scheduler` registers; every panel query of `gputopo-binder.json` must
then return at least one series.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gputopo.runtime.http import HttpServer
from scheduler.binder import BinderConfig
from scheduler.metrics import SchedulerCollector
from tests.aggregator.kubeutil import eventually
from tests.builders import fabric_cluster
from tests.dashboards.test_dashboards_prometheus import panel_queries
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.harness.prometheus import Prometheus
from tests.scheduler.kubeutil import binder_stack, create, gpu_pod, pods_of

pytestmark = [pytest.mark.kube, pytest.mark.prometheus, pytest.mark.slow]


def test_every_binder_panel_returns_data(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8, prefix=kube_scope.name("d")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("binder")
    config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=1.0)
    results: dict[str, object] = {}

    async def body() -> None:
        async with binder_stack(kube_apiserver, nodes, config) as (kube, _agg, running):
            registry = CollectorRegistry()
            registry.register(SchedulerCollector(running.stats))
            http = HttpServer(registry=registry)
            await http.start("127.0.0.1", 0)
            try:
                for i in range(2):
                    pod = gpu_pod(ns, f"p-{i}", 8, scheduler=name)
                    await create(kube, f"/api/v1/namespaces/{ns}/pods", pod)

                async def bound() -> bool:
                    pods = await pods_of(kube, ns)
                    return sum(1 for p in pods if p["spec"].get("nodeName")) == 2

                await eventually(bound, timeout_s=60, what="both pods bound")
                prom = await asyncio.to_thread(
                    Prometheus.start,
                    workdir=tmp_path / "prometheus",
                    targets=[f"127.0.0.1:{http.port}"],
                    job="gputopo-scheduler",
                )
                try:
                    await asyncio.to_thread(
                        prom.wait_for, "gputopo_scheduler_decisions_total", timeout_s=60
                    )
                    await asyncio.sleep(4)
                    for title, expr in panel_queries("gputopo-binder.json"):
                        fill = expr.replace("$__rate_interval", "15s")
                        results[f"{title}: {expr}"] = prom.query(fill)
                finally:
                    prom.stop()
            finally:
                await http.stop()

    asyncio.run(asyncio.wait_for(body(), timeout=240))
    empty = [key for key, rows in results.items() if not rows]
    assert results
    assert not empty, "queries that returned nothing:\n" + "\n".join(empty)
