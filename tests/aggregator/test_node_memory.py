"""The aggregator keeps at most a budget per node (issue 25).

124 reports of about 15 MiB took the aggregator from 79 to 2,065 MiB in 34 s, past the
Deployment's 2 GiB limit. Every field is bounded now (tests/test_report_limits.py), and a
snapshot whose node would cost more than `NODE_MEMORY_BUDGET` to keep is refused before it is
decoded, so memory is at most nodes x budget plus the aggregator's own. Measured here over real
gRPC: what the worst honest nodes (128 GPUs) cost each, against the estimate and the budget.
"""

from __future__ import annotations

import gc
from pathlib import Path

import grpc
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.bounds import NODE_MEMORY_BUDGET, node_memory
from gputopo.codec import topology_to_proto
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from gputopo.v1 import topology_pb2 as tpb
from tests.aggregator.kubeutil import run
from tests.placement.test_intranode_worst import WORST

NODES = 12


def _rss_bytes() -> int:
    status = Path("/proc/self/status")
    if not status.exists():
        pytest.fail("needs /proc (Linux) to read the process's resident memory")
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _report(topo: tpb.NodeTopology) -> rpb.ReportRequest:
    return rpb.ReportRequest(
        node_name=topo.name, incarnation=1, sequence=1, snapshot=rpb.Snapshot(topology=topo)
    )


def test_a_snapshot_past_the_per_node_budget_is_refused_naming_it() -> None:
    topo = tpb.NodeTopology(name="huge")
    for i in range(128):
        topo.gpus.add(index=i, uuid=f"GPU-{i}")
    for j in range(64):
        topo.nics.add(index=j, name=f"mlx5_{j}")
    why = "x" * 700  # within the 1,024-character bound of a link's health_reason
    for a in range(128):
        for b in range(a + 1, 128):
            topo.links.add(a=tpb.DeviceRef(kind=1, index=a), b=tpb.DeviceRef(kind=1, index=b),
                           kind=3, health_reason=why)  # fmt: skip
        for j in range(64):
            topo.links.add(a=tpb.DeviceRef(kind=1, index=a), b=tpb.DeviceRef(kind=2, index=j),
                           kind=3, health_reason=why)  # fmt: skip
    estimate = node_memory(
        gpus=128, nics=64, numa_nodes=0, links=len(topo.links), wire_bytes=topo.ByteSize()
    )
    assert estimate > NODE_MEMORY_BUDGET  # the case: every count within its own bound

    async def go() -> None:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                call = rgrpc.ReporterStub(channel).Report()
                await call.write(_report(topo))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (caught.value.details() or "").startswith("snapshot.topology: would keep")
                assert "per-node budget of 16 MiB" in (caught.value.details() or "")
                assert agg.state.record("huge") is None
        finally:
            await agg.stop(grace_s=0.1)

    run(go(), timeout_s=120)


def test_the_worst_honest_nodes_cost_less_than_their_estimate_and_the_budget() -> None:
    base = topology_to_proto(WORST["every link measured with noise"])
    estimate = node_memory(
        gpus=len(base.gpus),
        nics=len(base.nics),
        numa_nodes=len(base.numa_nodes),
        links=len(base.links),
        wire_bytes=base.ByteSize(),
    )

    async def go() -> float:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                calls = []
                gc.collect()
                before = _rss_bytes()
                for i in range(NODES):
                    topo = tpb.NodeTopology()
                    topo.CopyFrom(base)
                    topo.name = f"big-{i:02}"
                    call = stub.Report()
                    await call.write(_report(topo))
                    assert (await call.read()).status == rpb.ReportResponse.STATUS_ACCEPTED
                    calls.append(call)
                agg.state.snapshot()  # what placement builds from them counts too
                gc.collect()
                per_node = (_rss_bytes() - before) / NODES
                for call in calls:
                    await call.done_writing()
                return per_node
        finally:
            await agg.stop(grace_s=0.1)

    per_node = run(go(), timeout_s=120)
    print(f"per node: {per_node / 2**20:.1f} MiB, estimate {estimate / 2**20:.1f} MiB")
    # The estimate must err high, or the budget would not bound memory; RSS also holds
    # allocator slack, so it is compared with 1.5x the estimate, and with the budget itself.
    assert per_node < 1.5 * estimate
    assert per_node < NODE_MEMORY_BUDGET


def test_a_delta_that_would_take_a_node_past_the_budget_is_refused_naming_it() -> None:
    base = tpb.NodeTopology(name="grows")
    for i in range(128):
        base.gpus.add(index=i, uuid=f"GPU-{i}")
    for j in range(64):
        base.nics.add(index=j, name=f"mlx5_{j}")
    delta = rpb.Delta()
    why = "x" * 500  # within the 1,024-character bound of a link's health_reason
    for a in range(128):
        for b in range(a + 1, 128):
            delta.links.add(a=tpb.DeviceRef(kind=1, index=a), b=tpb.DeviceRef(kind=1, index=b),
                            kind=3, health_reason=why)  # fmt: skip
        for j in range(64):
            delta.links.add(a=tpb.DeviceRef(kind=1, index=a), b=tpb.DeviceRef(kind=2, index=j),
                            kind=3, health_reason=why)  # fmt: skip

    async def go() -> None:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                call = rgrpc.ReporterStub(channel).Report()
                await call.write(_report(base))  # small: 192 devices, no links
                assert (await call.read()).status == rpb.ReportResponse.STATUS_ACCEPTED
                await call.write(
                    rpb.ReportRequest(node_name="grows", incarnation=1, sequence=2, delta=delta)
                )
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (caught.value.details() or "").startswith("delta: would keep")
                record = agg.state.record("grows")
                assert record is not None
                assert record.reported is not None
                assert not record.reported.links  # nothing of the delta applied
        finally:
            await agg.stop(grace_s=0.1)

    run(go(), timeout_s=120)
