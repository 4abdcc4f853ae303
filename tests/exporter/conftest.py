"""Fixtures for exporter tests: fake machines with their NVML and sysfs, a real Prometheus."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.discovery import Discovery
from exporter.fake_machine import FakeMachine
from exporter.fake_nvml import FakeNvml
from exporter.fake_sysfs import write_sysfs
from exporter.nvml import Nvml
from exporter.sysfs import Sysfs
from tests.harness.prometheus import Prometheus, PrometheusNotFoundError


@dataclass
class FakeNode:
    """A fake machine wired up for discovery: its fake NVML, its sysfs tree, a Discovery."""

    machine: FakeMachine
    nvml: FakeNvml
    sysfs_root: Path
    discovery: Discovery


@pytest.fixture
def fake_node(tmp_path: Path) -> Callable[..., FakeNode]:
    """Build a `FakeNode` for a profile: `fake_node("dgx-h100")`."""

    def build(profile: str, *, node_name: str = "node-a", **nvml_options: object) -> FakeNode:
        machine = FakeMachine.from_profile(profile, node_name=node_name)
        root = write_sysfs(machine, tmp_path / f"sys-{profile}-{node_name}")
        nvml = FakeNvml(machine, **nvml_options)  # type: ignore[arg-type]
        discovery = Discovery(node_name=node_name, nvml=Nvml(nvml.library), sysfs=Sysfs(root))
        return FakeNode(machine=machine, nvml=nvml, sysfs_root=root, discovery=discovery)

    return build


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """Start real Prometheus servers scraping given targets; stopped after the test."""
    started: list[Prometheus] = []

    def start(*targets: str) -> Prometheus:
        try:
            server = Prometheus.start(
                workdir=tmp_path / f"prometheus-{len(started)}", targets=targets
            )
        except PrometheusNotFoundError as error:
            pytest.fail(str(error), pytrace=False)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
