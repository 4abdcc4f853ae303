"""Every exporter says per probe, from its first scrape, whether the probe can run and why not:
`gputopo_probe_available{probe, reason}`. Without it a deployment whose image lacks
cuda-bindings, or a simulated node, looked the same as one whose first round was still due."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from exporter.agent import Agent
from exporter.nvml import Nvml
from exporter.probes.runner import ProbeSchedule, WorkerGpuProbe
from tests.exporter.conftest import FakeNode
from tests.exporter.test_agent import config

LATER = ProbeSchedule(interval_s=600, first_after_s=600, jitter=0.0)


class NotInstalled(WorkerGpuProbe):
    """The real worker client, in an environment without cuda-bindings (this one may have it)."""

    def installed(self) -> tuple[bool, str]:
        return False, "cuda-bindings is not installed (pip install 'gputopo[cuda]')"


def _metrics(agent_factory: Callable[[], Agent]) -> str:
    async def scenario() -> str:
        async with agent_factory() as agent:
            url = f"http://127.0.0.1:{agent.http_port}/metrics"
            with await asyncio.to_thread(urllib.request.urlopen, url, timeout=5) as response:
                body: bytes = response.read()
            return body.decode()

    return asyncio.run(asyncio.wait_for(scenario(), timeout=60))


def _available(metrics: str, probe: str) -> list[str]:
    prefix = f'gputopo_probe_available{{probe="{probe}",'
    return [line for line in metrics.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize(
    ("options", "gpu_probe", "want"),
    [
        pytest.param(
            {"gpu_probes": True, "probe_schedule": LATER},
            NotInstalled(),
            'gputopo_probe_available{probe="gpu-copy",reason="cuda-bindings is not installed'
            " (pip install 'gputopo[cuda]')\"} 0.0",
            id="no cuda-bindings: said at once, not after the first round",
        ),
        pytest.param(
            {"gpu_probes": False, "simulated": "dgx-h100"},
            None,
            'gputopo_probe_available{probe="gpu-copy",reason="simulated machine: no GPU or CUDA'
            ' here is real (--simulate)"} 0.0',
            id="the simulated exporter says why it never copies",
        ),
        pytest.param(
            {"gpu_probes": False},
            None,
            'gputopo_probe_available{probe="gpu-copy",reason="turned off (--no-gpu-probes)"} 0.0',
            id="turned off by the operator",
        ),
    ],
)
def test_the_gpu_copy_probe_says_whether_it_runs_from_the_first_scrape(
    fake_node: Callable[..., FakeNode],
    options: dict[str, Any],
    gpu_probe: WorkerGpuProbe | None,
    want: str,
) -> None:
    node = fake_node("workstation-2x-rtx5090")
    cfg = config(node.discovery.node_name, sysfs_root=node.sysfs_root, **options)
    metrics = _metrics(lambda: Agent(cfg, nvml=Nvml(node.nvml.library), gpu_probe=gpu_probe))
    assert _available(metrics, "gpu-copy") == [want]
    assert _available(metrics, "tcp") == [
        'gputopo_probe_available{probe="tcp",reason="no aggregator to name peers'
        ' (--aggregator)"} 0.0'
    ]
