"""Every per-GPU series carries the labels current dcgm-exporter writes, valued as it values them
(internal/pkg/rendermetrics/render_metrics.go and collector/base_collector.go in NVIDIA's
dcgm-exporter): `gpu`, `UUID`, `pci_bus_id` in NVML's form, `device` `nvidiaN`, `modelName`,
`hostname` (and `Hostname`, the spelling of releases up to 3.x); `gpu_p2p_status` and the link
series too, so a join with DCGM series needs no relabelling."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from exporter.agent import Agent
from exporter.metric_names import GPU_LABELS
from exporter.nvml import Nvml
from tests.exporter.conftest import FakeNode
from tests.exporter.test_agent import config

NODE = "dgx-7"


def _scrape(node: FakeNode) -> dict[str, list[dict[str, str]]]:
    cfg = config(NODE, sysfs_root=node.sysfs_root)

    async def scenario() -> str:
        async with Agent(cfg, nvml=Nvml(node.nvml.library)) as agent:
            url = f"http://127.0.0.1:{agent.http_port}/metrics"
            with await asyncio.to_thread(urllib.request.urlopen, url, timeout=5) as response:
                body: bytes = response.read()
            return body.decode()

    text = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_per_gpu_p2p_and_link_series_carry_dcgm_exporters_labels(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("dgx-h100", node_name=NODE)
    series = _scrape(node)
    gpu0 = node.machine.topology.gpus[0]
    (info,) = [s for s in series["gputopo_gpu_info"] if s["gpu"] == "0"]
    assert {k: info[k] for k in GPU_LABELS} == {
        "gpu": "0",
        "UUID": gpu0.uuid,
        "pci_bus_id": info["pci_bus_id"],
        "device": "nvidia0",
        "modelName": gpu0.name,
        "Hostname": NODE,
        "hostname": NODE,
    }
    # NVML's form, as DCGM writes it: 8-digit domain, upper-case hex
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", info["pci_bus_id"])
    assert gpu0.name.startswith("NVIDIA")
    p2p = series["gputopo_gpu_p2p_status"]
    assert p2p, "the fake DGX reports P2P status"
    for s in p2p:
        assert s["device"] == f"nvidia{s['gpu']}"
        assert s["hostname"] == NODE
        assert s["UUID"]
        assert s["peer"] != s["UUID"]
    nominal = series["gputopo_link_bandwidth_nominal_bytes_per_second"]
    gpu_links = [s for s in nominal if s["a"].startswith("gpu")]
    assert gpu_links
    for s in gpu_links:
        assert s["gpu"] == s["a"].removeprefix("gpu")
        assert s["hostname"] == NODE
    assert all(set(GPU_LABELS) <= set(s) for s in series["gputopo_link_health"])
