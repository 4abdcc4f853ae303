"""The agent against a real aggregator on loopback: streaming, changes, outages, no GPU."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from exporter.agent import Agent, AgentConfig
from exporter.nvml import Nvml
from exporter.probes.runner import ProbeSchedule
from exporter.probes.tcp import TcpProbeServer
from gputopo.codec import peer_probe_from_proto
from gputopo.links import LinkHealth
from gputopo.runtime.backoff import Backoff
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.exporter.conftest import FakeNode

T = TypeVar("T")
FAST = Backoff(base_s=0.1, cap_s=1.0)


def run(coro: Awaitable[T], timeout_s: float = 60) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout_s))


def config(name: str, aggregator: str = "", **overrides: Any) -> AgentConfig:
    options: dict[str, Any] = {
        "node_name": name,
        "aggregator": aggregator,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "probe_host": "127.0.0.1",
        "probe_port": 0,
        "heartbeat_interval_s": 0.2,
        "backoff": FAST,
        "gpu_probes": False,
        "peer_probes": False,
    }
    return AgentConfig(**(options | overrides))


def fake_agent(node: FakeNode, aggregator: str = "", **overrides: Any) -> Agent:
    cfg = config(node.discovery.node_name, aggregator, sysfs_root=node.sysfs_root, **overrides)
    return Agent(cfg, nvml=Nvml(node.nvml.library))


async def http_get(port: int, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    return await asyncio.to_thread(get)


async def until(check: Callable[[], bool], *, timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


def test_the_agent_streams_its_node_and_a_lane_going_down_arrives_as_a_delta(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("dgx-h100", node_name="h100-01")

    async def scenario() -> None:
        aggregator = Aggregator(AggregatorConfig(heartbeat_interval_s=0.2))
        await aggregator.start()
        try:
            async with fake_agent(node, aggregator.grpc_target) as agent:
                await until(lambda: "h100-01" in aggregator.state.node_names, what="the snapshot")
                seen = aggregator.state.snapshot().node("h100-01").topology
                assert seen.gpu_count == 8
                assert seen == agent.topology
                node.nvml.set_nvlink_down(6, 2)
                await agent.discover()

                def degraded() -> bool:
                    t = aggregator.state.snapshot().node("h100-01").topology
                    return t.gpu_link(6, 7).health is LinkHealth.DEGRADED  # type: ignore[union-attr]

                await until(degraded, what="the degraded link")
                assert agent.stream is not None
                assert agent.stream.stats.deltas_sent >= 1
                assert agent.stream.stats.snapshots_sent == 1
                assert aggregator.state.snapshot().node("h100-01").topology == agent.topology
        finally:
            await aggregator.stop(grace_s=0)

    run(scenario())


def test_a_node_without_gpu_or_driver_runs_reports_an_empty_node_and_says_why() -> None:
    """The real NVML adapter and the real /sys of this GPU-less machine."""

    async def scenario() -> None:
        aggregator = Aggregator(AggregatorConfig(heartbeat_interval_s=0.2))
        await aggregator.start()
        try:
            async with Agent(config("cpu-node", aggregator.grpc_target)) as agent:
                await until(lambda: "cpu-node" in aggregator.state.node_names)
                topology = aggregator.state.snapshot().node("cpu-node").topology
                assert topology.gpus == ()
                assert not topology.nvml.up
                assert "libnvidia-ml.so.1" in topology.nvml.reason
                assert topology.numa_nodes
                status, body = await http_get(agent.http_port, "/healthz")
                assert status == 200
                assert json.loads(body)["nvml_up"] is False
                assert (await http_get(agent.http_port, "/readyz"))[0] == 200
                _, metrics = await http_get(agent.http_port, "/metrics")
                assert "gputopo_nvml_up 0.0" in metrics
                assert 'reason="NVML library libnvidia-ml.so.1 not found' in metrics
        finally:
            await aggregator.stop(grace_s=0)

    run(scenario())


def test_the_reason_nvml_is_down_is_logged_once(
    caplog: pytest.LogCaptureFixture, fake_node: Callable[..., FakeNode]
) -> None:
    node = fake_node("g5-a10g-8x", driver=False)

    async def scenario() -> None:
        async with fake_agent(node) as agent:
            for _ in range(3):
                await agent.discover()

    with caplog.at_level("WARNING", logger="exporter.agent"):
        run(scenario())
    lines = [r.getMessage() for r in caplog.records if "NVML is not available" in r.getMessage()]
    assert len(lines) == 1
    assert "libnvidia-ml.so.1 not found" in lines[0]


async def _restart_on(port: int) -> Aggregator:
    aggregator = Aggregator(AggregatorConfig(grpc_port=port, heartbeat_interval_s=0.2))
    for _ in range(50):  # the old socket may linger a moment
        try:
            await aggregator.start()
            return aggregator
        except (OSError, RuntimeError):
            await asyncio.sleep(0.1)
    raise AssertionError(f"cannot bind port {port} again")


async def _survive_an_outage(node: FakeNode, *, down_s: float, backoff: Backoff) -> dict[str, Any]:
    first = Aggregator(AggregatorConfig(heartbeat_interval_s=0.2))
    await first.start()
    port = first.grpc_port
    name = node.discovery.node_name
    async with fake_agent(node, first.grpc_target, backoff=backoff) as agent:
        await until(lambda: name in first.state.node_names)
        await first.stop(grace_s=0)
        served = 0
        began = time.monotonic()
        while time.monotonic() - began < down_s:
            status, _ = await http_get(agent.http_port, "/healthz")
            assert status == 200  # the agent keeps serving while the aggregator is gone
            served += 1
            await asyncio.sleep(min(1.0, down_s / 5))
        assert agent.stream is not None
        failures = agent.stream.stats.failures
        assert failures >= 1
        assert not agent.stream.stats.connected
        second = await _restart_on(port)
        try:
            back = time.monotonic()
            await until(lambda: name in second.state.node_names, timeout_s=backoff.cap_s + 10)
            resumed_s = time.monotonic() - back
            assert second.state.snapshot().node(name).topology == agent.topology
            _, metrics = await http_get(agent.http_port, "/metrics")
            assert "gputopo_report_stream_connected 1.0" in metrics
            interval = next(
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("gputopo_report_heartbeat_interval_seconds ")
            )
            assert interval == agent.stream.heartbeat_interval_s > 0
            return {"failures": failures, "resumed_s": resumed_s, "served": served}
        finally:
            await second.stop(grace_s=0)


def test_the_agent_resumes_streaming_when_the_aggregator_returns(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("h100-nv6-4x", node_name="nv6-01")
    found = run(_survive_an_outage(node, down_s=3.0, backoff=Backoff(base_s=0.1, cap_s=1.0)))
    assert found["resumed_s"] < 5


@pytest.mark.slow
def test_the_agent_survives_the_aggregator_being_down_for_two_minutes(
    fake_node: Callable[..., FakeNode],
) -> None:
    """With the agent's default backoff shape (capped at 10 s here, 30 s by default)."""
    node = fake_node("hgx-a100-roce", node_name="a100-01")
    found = run(
        _survive_an_outage(node, down_s=120.0, backoff=Backoff(base_s=0.5, cap_s=10.0)),
        timeout_s=200,
    )
    # Jittered exponential backoff: tries grow to the cap, not one try per heartbeat.
    assert 5 <= found["failures"] <= 40
    assert found["resumed_s"] < 20


class _ProbingAggregator(rgrpc.ReporterServicer):
    """A Reporter that names one peer to probe in every ack and keeps the peer probes it gets.

    Stands in for the aggregator side of network probes, which the aggregator owns.
    """

    def __init__(self, target: rpb.ProbeTarget) -> None:
        self.target = target
        self.peer_probes: list[rpb.PeerProbe] = []
        self.probe_address = ""

    async def Report(  # noqa: N802
        self, request_iterator: AsyncIterator[rpb.ReportRequest], context: object
    ) -> AsyncIterator[rpb.ReportResponse]:
        async for msg in request_iterator:
            self.probe_address = msg.probe_address
            if msg.WhichOneof("payload") == "delta":
                self.peer_probes.extend(msg.delta.peer_probes)
            yield rpb.ReportResponse(
                status=rpb.ReportResponse.STATUS_ACCEPTED,
                acked_sequence=msg.sequence,
                probe_targets=[self.target],
            )


def test_peers_named_by_the_aggregator_are_probed_and_reported_as_peer_probes(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("workstation-2x-rtx5090", node_name="ws-1")

    async def scenario() -> None:
        peer = TcpProbeServer(host="127.0.0.1", port=0)
        await peer.start()
        servicer = _ProbingAggregator(
            rpb.ProbeTarget(node_name="ws-2", address=f"127.0.0.1:{peer.port}")
        )
        server = grpc.aio.server()
        rgrpc.add_ReporterServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        schedule = ProbeSchedule(interval_s=0.5, first_after_s=0.1, jitter=0.1)
        try:
            async with fake_agent(
                node, f"127.0.0.1:{port}", peer_probes=True, probe_schedule=schedule
            ) as agent:
                await until(lambda: bool(servicer.peer_probes), what="a peer probe")
                name, measured = peer_probe_from_proto(servicer.peer_probes[0])
                assert name == "ws-2"
                assert measured.method == "tcp"
                assert measured.gbps > 0
                assert measured.latency_us is not None
                assert servicer.probe_address == f"{agent._advertised_probe_address()}"
                assert servicer.probe_address.endswith(f":{agent.probe_port}")
                _, metrics = await http_get(agent.http_port, "/metrics")
                assert (
                    'gputopo_probe_bandwidth_bytes_per_second{method="tcp",probe="tcp",target="ws-2"}'
                    in metrics
                )
        finally:
            await server.stop(0)
            await peer.stop()

    run(scenario())


def test_http_and_probe_ports_are_real_sockets_chosen_by_the_kernel(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("workstation-2x-rtx5090")

    async def scenario() -> None:
        async with fake_agent(node) as first, fake_agent(node) as second:
            assert first.http_port != second.http_port
            assert first.probe_port != second.probe_port
            for agent in (first, second):
                assert (await http_get(agent.http_port, "/readyz"))[0] == 200

    run(scenario())


def test_healthz_fails_only_when_discovery_has_stopped_passing(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("workstation-2x-rtx5090")
    now = [1_000_000.0]

    async def scenario() -> None:
        cfg = config("ws", sysfs_root=node.sysfs_root, discovery_interval_s=60.0)
        async with Agent(cfg, nvml=Nvml(node.nvml.library), clock=lambda: now[0]) as agent:
            assert (await http_get(agent.http_port, "/healthz"))[0] == 200
            now[0] += 3 * 60 + 59  # overdue, but within three intervals and a minute
            assert (await http_get(agent.http_port, "/healthz"))[0] == 200
            now[0] += 2
            status, body = await http_get(agent.http_port, "/healthz")
            assert (status, json.loads(body)["status"]) == (503, "discovery stalled")
            await agent.discover()
            assert (await http_get(agent.http_port, "/healthz"))[0] == 200

    run(scenario())


class InstalledGpuProbe:
    """A GPU probe client whose cuda-bindings are installed; no round runs in these tests."""

    def installed(self) -> tuple[bool, str]:
        return True, ""

    async def start(self) -> tuple[bool, str]:
        raise AssertionError("no round was due")

    async def peer(self, src_bus_id: str, dst_bus_id: str) -> Any:
        raise AssertionError("no round was due")

    async def host(self, bus_id: str, cpus: Any) -> Any:
        raise AssertionError("no round was due")

    async def close(self) -> None:
        return None


def test_before_the_first_round_the_metrics_say_not_yet_probed(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("workstation-2x-rtx5090")
    schedule = ProbeSchedule(interval_s=600, first_after_s=600, jitter=0.0)

    cfg = config(
        node.discovery.node_name,
        sysfs_root=node.sysfs_root,
        gpu_probes=True,
        probe_schedule=schedule,
    )

    async def scenario() -> None:
        # cuda-bindings present (whether or not this machine has it): only the round is due.
        agent = Agent(cfg, nvml=Nvml(node.nvml.library), gpu_probe=InstalledGpuProbe())
        async with agent:
            await until(lambda: bool(agent.runner.results.available), what="probe state")
            _, metrics = await http_get(agent.http_port, "/metrics")
            assert (
                'gputopo_probe_available{probe="gpu-copy",reason="not yet probed"} 0.0' in metrics
            )

    run(scenario())


@pytest.mark.parametrize(
    ("interval_s", "want_first_s"),
    [
        pytest.param(30.0, 30.0, id="--probe-interval 30: the first round within 30 s too"),
        pytest.param(900.0, 120.0, id="the default: first round after two minutes"),
    ],
)
def test_the_probe_interval_also_bounds_the_first_round(
    interval_s: float, want_first_s: float
) -> None:
    schedule = ProbeSchedule.every(interval_s)
    assert (schedule.interval_s, schedule.first_after_s) == (interval_s, want_first_s)
