"""Probes: the TCP endpoint and client, and probe rounds driven through the runner.

There is no GPU here, so GPU rounds run against a probe that answers from a real nvbandwidth
recording of an 8-GPU A100 NVSwitch machine (NVIDIA's README example): the runner, the busy
gate and the way results land on the topology are the real ones. The CUDA code itself runs
only on a GPU machine (`pytest -m gpu`, tests/exporter/test_gpu.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from exporter.probes.results import ProbeOutcome, ProbeResults
from exporter.probes.runner import (
    GPU_PROBE,
    TCP_PROBE,
    ProbeError,
    ProbeRunner,
    ProbeSchedule,
    WorkerGpuProbe,
)
from exporter.probes.tcp import TcpProbeServer, probe_peer
from exporter.readings import GpuActivity
from gputopo.importers import render_topo_matrix
from gputopo.topology import Measurement, NodeTopology, gpu, numa
from tests.exporter.conftest import FakeNode

RECORDING = Path(__file__).parent.parent / "data" / "nvbandwidth_readme_example_8gpu.txt"


def read_nvbandwidth(text: str) -> dict[str, list[list[float]]]:
    """nvbandwidth's matrices by test name (rows as printed)."""
    found: dict[str, list[list[float]]] = {}
    current = ""
    for line in text.splitlines():
        match = re.match(r"Running (\w+)\.", line)
        if match:
            current = match.group(1)
            found[current] = []
        elif current and re.match(r"^\d+\s+[\d.]", line):
            found[current].append([float(v) for v in line.split()[1:]])
    return found


class RecordedGpuProbe:
    """Answers GPU probes from the nvbandwidth recording; GPUs by PCI address of a topology."""

    def __init__(
        self, topology: NodeTopology, *, fail: frozenset[tuple[int, int]] = frozenset()
    ) -> None:
        tables = read_nvbandwidth(RECORDING.read_text())
        self.d2d = tables["device_to_device_memcpy_write_ce"]  # row dst <- column src
        self.h2d = tables["host_to_device_memcpy_ce"][0]
        self.index = {g.pci_bus_id: g.index for g in topology.gpus}
        self.fail = fail
        self.started = self.closed = 0

    def installed(self) -> tuple[bool, str]:
        return True, ""

    async def start(self) -> tuple[bool, str]:
        self.started += 1
        return True, ""

    async def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        a, b = self.index[src_bus_id], self.index[dst_bus_id]
        if (a, b) in self.fail:
            raise ProbeError("cudaMemcpyPeerAsync: cudaErrorLaunchFailure")
        gbps = min(self.d2d[b][a], self.d2d[a][b])
        return Measurement(
            gbps=gbps, method="recorded nvbandwidth d2d write ce", size_bytes=1 << 28
        )

    async def host(self, bus_id: str, cpus: Sequence[int]) -> Measurement:
        assert cpus
        return Measurement(gbps=self.h2d[self.index[bus_id]], method="recorded nvbandwidth h2d ce")

    async def close(self) -> None:
        self.closed += 1


def runner_for(probe: object, activity: dict[int, GpuActivity] | None = None) -> ProbeRunner:
    async def read_activity() -> tuple[GpuActivity, ...]:
        return tuple((activity or {}).values())

    return ProbeRunner(
        results=ProbeResults(),
        gpu_probe=probe,  # type: ignore[arg-type]
        activity=read_activity,
        schedule=ProbeSchedule(busy_percent=10),
    )


def test_a_gpu_round_measures_every_pair_and_host_path_and_keeps_nominal(
    fake_node: Callable[..., FakeNode],
) -> None:
    topology = fake_node("hgx-a100-roce").discovery.run().topology
    probe = RecordedGpuProbe(topology)
    runner = runner_for(probe)
    measured = asyncio.run(runner.gpu_round(topology))
    assert measured == 28 + 8 * 2  # 28 pairs, 8 GPUs x 2 NUMA nodes
    assert (probe.started, probe.closed) == (1, 1)
    probed = runner.results.apply(topology)
    pair = probed.gpu_link(0, 6)
    assert pair is not None
    assert pair.measured is not None
    assert pair.measured.gbps == 274.89  # GPU6 <- GPU0 was the slower direction
    assert pair.nominal_gbps == 300.0  # NV12 of NVLink 3: both stay
    assert pair.bandwidth_gbps() == 274.89
    host = probed.link(gpu(3), numa(1))
    assert host is not None
    assert host.measured is not None
    assert host.measured.gbps == 26.00
    assert runner.results.available[GPU_PROBE] == (True, "")
    assert "274.9*" in render_topo_matrix(probed)


def test_busy_gpus_are_left_alone(fake_node: Callable[..., FakeNode]) -> None:
    topology = fake_node("hgx-a100-roce").discovery.run().topology
    busy = {
        3: GpuActivity(3, utilization_percent=95, processes=None),
        5: GpuActivity(5, utilization_percent=0, processes=2),
    }
    runner = runner_for(RecordedGpuProbe(topology), busy)
    measured = asyncio.run(runner.gpu_round(topology))
    touched = {
        i
        for key in runner.results.links
        for ref in key
        if ref.kind.name == "GPU"
        for i in [ref.index]
    }
    assert 3 not in touched
    assert 5 not in touched
    skipped = runner.results.outcomes[(GPU_PROBE, ProbeOutcome.SKIPPED_BUSY)]
    assert skipped == 13 + 2 * 2  # 13 pairs touch GPU3 or GPU5, and their 4 host paths
    assert measured == 44 - skipped


def test_when_every_gpu_is_busy_no_worker_starts(fake_node: Callable[..., FakeNode]) -> None:
    topology = fake_node("workstation-2x-rtx5090").discovery.run().topology
    probe = RecordedGpuProbe(topology)
    busy = {i: GpuActivity(i, 100, 1) for i in range(2)}
    assert asyncio.run(runner_for(probe, busy).gpu_round(topology)) == 0
    assert probe.started == 0


def test_a_failed_measurement_is_counted_and_the_round_goes_on(
    fake_node: Callable[..., FakeNode],
) -> None:
    topology = fake_node("hgx-a100-roce").discovery.run().topology
    runner = runner_for(RecordedGpuProbe(topology, fail=frozenset({(0, 1)})))
    assert asyncio.run(runner.gpu_round(topology)) == 43
    assert runner.results.outcomes[(GPU_PROBE, ProbeOutcome.FAILED)] == 1
    assert runner.results.apply(topology).gpu_link(0, 1).measured is None  # type: ignore[union-attr]


def test_without_cuda_bindings_the_worker_says_so(fake_node: Callable[..., FakeNode]) -> None:
    """The real worker process, here: cuda-bindings is not installed (or sees no GPU)."""
    probe = WorkerGpuProbe()
    ok, why = asyncio.run(probe.start())
    assert not ok
    assert "cuda" in why.lower()
    runner = runner_for(probe)
    topology = fake_node("workstation-2x-rtx5090").discovery.run().topology
    assert asyncio.run(runner.gpu_round(topology)) == 0
    available, reason = runner.results.available[GPU_PROBE]
    assert not available
    assert "cuda" in reason.lower()


def test_a_node_without_gpus_has_nothing_to_probe() -> None:
    runner = runner_for(RecordedGpuProbe(NodeTopology(name="empty")))
    assert asyncio.run(runner.gpu_round(NodeTopology(name="empty"))) == 0
    assert runner.results.available[GPU_PROBE] == (False, "no GPU on this node")


def test_tcp_probe_measures_bandwidth_and_round_trip_to_a_peer() -> None:
    async def scenario() -> Measurement:
        server = TcpProbeServer(host="127.0.0.1", port=0)
        await server.start()
        try:
            found = await probe_peer(f"127.0.0.1:{server.port}", size_bytes=8 << 20, pings=10)
            assert server.served == 2
            return found
        finally:
            await server.stop()

    m = asyncio.run(scenario())
    assert m.method == "tcp"
    assert m.size_bytes == 8 << 20
    assert m.gbps > 0.01  # loopback moves far more than 10 MB/s
    assert m.latency_us is not None
    assert 0 < m.latency_us < 100_000
    assert m.duration_s > 0
    assert m.measured_at > 0


def test_the_probe_endpoint_refuses_what_is_not_a_probe() -> None:
    async def scenario() -> bytes:
        server = TcpProbeServer(host="127.0.0.1", port=0)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert server.served == 0
            return answer
        finally:
            await server.stop()

    assert asyncio.run(scenario()) == b""  # closed without an answer


def test_a_peer_round_records_what_it_reached_and_counts_what_it_did_not() -> None:
    async def scenario() -> tuple[dict[str, Measurement], ProbeResults]:
        server = TcpProbeServer(host="127.0.0.1", port=0)
        await server.start()
        try:
            runner = runner_for(None)
            found = await runner.peer_round(
                [("node-b", f"127.0.0.1:{server.port}"), ("node-c", "127.0.0.1:1")]
            )
            return found, runner.results
        finally:
            await server.stop()

    found, results = asyncio.run(scenario())
    assert list(found) == ["node-b"]
    assert results.peers["node-b"].measurement.method == "tcp"
    assert results.outcomes[(TCP_PROBE, ProbeOutcome.FAILED)] == 1


def test_probe_waits_are_jittered_around_the_interval() -> None:
    runner = runner_for(None)
    runner.schedule = ProbeSchedule(interval_s=100, first_after_s=10, jitter=0.2)
    waits = [runner.wait_s() for _ in range(200)]
    assert all(80 <= w <= 120 for w in waits)
    assert max(waits) - min(waits) > 20  # they spread, not one value
    assert all(8 <= runner.wait_s(first=True) <= 12 for _ in range(50))


def test_the_recording_is_an_nvswitch_machine_like_the_profile() -> None:
    tables = read_nvbandwidth(RECORDING.read_text())
    d2d = tables["device_to_device_memcpy_write_ce"]
    assert len(d2d) == 8
    assert all(v > 250 for r, row in enumerate(d2d) for c, v in enumerate(row) if r != c)
