"""Metrics: what a real Prometheus scrapes from running agents, and that every name is defined."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import metric_names
from exporter.agent import Agent
from exporter.metrics import ExporterView, register
from exporter.probes.results import ProbeResults
from gputopo.topology import Measurement, gpu
from tests.exporter.conftest import FakeNode
from tests.exporter.test_agent import config, fake_agent, run
from tests.harness.prometheus import Prometheus

DEFINED = {spec.name: spec for spec in metric_names.ALL}


def families(text: str) -> dict[str, str]:
    """Family name -> type, as a Prometheus text parser reads them."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_every_family_served_is_defined_in_one_module_with_its_type(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("gb200-tray")
    node.nvml.set_nvlink_down(1, 0)
    result = node.discovery.run()
    probes = ProbeResults()
    probes.record_link(
        "gpu-copy",
        gpu(0),
        gpu(1),
        Measurement(
            gbps=700.0, method="m", duration_s=1, low_gbps=650.0, high_gbps=710.0, samples=11
        ),
    )
    probes.available["gpu-copy"] = (True, "")
    registry = CollectorRegistry()
    register(
        registry,
        lambda: ExporterView(
            node_name="tray",
            version="0",
            topology=probes.apply(result.topology),
            discovery=result,
            discovery_runs=1,
            probes=probes,
        ),
    )
    served = families(generate_latest(registry).decode())
    assert set(served) <= set(DEFINED)
    assert all(served[name] == DEFINED[name].type for name in served)
    assert all(spec.name.startswith("gputopo_") for spec in metric_names.ALL)
    assert {"gputopo_probe_bandwidth_spread_bytes_per_second", "gputopo_probe_samples"} <= set(
        served
    )


@pytest.mark.prometheus
def test_prometheus_scrapes_a_gpu_node_and_a_node_without_gpus(
    fake_node: Callable[..., FakeNode], prometheus: Callable[..., Prometheus]
) -> None:
    node = fake_node("dgx-h100", node_name="h100-01")
    node.nvml.set_nvlink_down(3, 0)

    async def scenario() -> None:
        async with fake_agent(node) as gpus, Agent(config("cpu-01")) as bare:
            prom = await asyncio.to_thread(
                prometheus, f"127.0.0.1:{gpus.http_port}", f"127.0.0.1:{bare.http_port}"
            )
            await asyncio.to_thread(prom.wait_for_scrape)

            def value(query: str) -> dict[str, float]:
                return {
                    r["metric"].get("instance", ""): float(r["value"][1]) for r in prom.query(query)
                }

            up = await asyncio.to_thread(value, "gputopo_nvml_up")
            assert up == {f"127.0.0.1:{gpus.http_port}": 1.0, f"127.0.0.1:{bare.http_port}": 0.0}
            why = await asyncio.to_thread(
                prom.query, 'gputopo_nvml_info{reason=~".*libnvidia-ml.*"}'
            )
            assert [r["metric"]["instance"] for r in why] == [f"127.0.0.1:{bare.http_port}"]
            gpus_seen = await asyncio.to_thread(value, "gputopo_gpus")
            assert gpus_seen[f"127.0.0.1:{gpus.http_port}"] == 8
            assert gpus_seen[f"127.0.0.1:{bare.http_port}"] == 0
            nominal = await asyncio.to_thread(
                value, 'gputopo_link_bandwidth_nominal_bytes_per_second{a="gpu0",b="gpu1"}'
            )
            assert list(nominal.values()) == [450e9]
            degraded = await asyncio.to_thread(
                prom.query, 'gputopo_link_health{state="degraded",kind="NVLINK"}'
            )
            assert len(degraded) == 7  # GPU3's seven switched pairs
            assert {r["metric"]["reason"] for r in degraded} == {"1 of 18 NVLinks to NVSwitch down"}
            lanes = await asyncio.to_thread(value, 'gputopo_gpu_nvlink_active_lanes{gpu="3"}')
            assert list(lanes.values()) == [17.0]
            errors = await asyncio.to_thread(
                value, "sum by (instance) (gputopo_discovery_errors_total)"
            )
            assert set(errors.values()) == {0.0}
            runs = await asyncio.to_thread(value, "gputopo_discovery_runs_total")
            assert all(v >= 1 for v in runs.values())

    run(scenario(), timeout_s=120)


@pytest.mark.parametrize(
    ("sysfs", "dcgm"),
    [
        ("0000:18:00.0", "00000000:18:00.0"),
        ("0000:b1:00.0", "00000000:B1:00.0"),
        ("0001:00:00.0", "00000001:00:00.0"),
        ("not an address", "not an address"),
    ],
)
def test_bus_ids_are_labelled_as_dcgm_exporter_writes_them(sysfs: str, dcgm: str) -> None:
    from exporter.metrics import dcgm_bus_id

    assert dcgm_bus_id(sysfs) == dcgm
