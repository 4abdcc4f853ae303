"""Reports that claim what no hardware can be are refused over real gRPC, naming the field, and
nothing of them reaches the state (what a hostile client on loopback did before: 10,000 GPUs on
a node grew the aggregator by gigabytes, a fake 10^12 GB/s NVLink drew honest placements)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.codec import CodecError, delta_from_proto, timestamp, topology_to_proto
from gputopo.runtime import grpcio
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from gputopo.v1 import topology_pb2 as tpb
from tests.builders import nvswitch_node


@dataclass(frozen=True)
class Absurd:
    change: Callable[[tpb.NodeTopology], None]
    want_field: str


def _many_gpus(msg: tpb.NodeTopology) -> None:
    for i in range(len(msg.gpus), 10_000):
        msg.gpus.add(index=i, uuid=f"GPU-{i}", name="fake")


def _deep_fabric(msg: tpb.NodeTopology) -> None:
    msg.fabric.tiers.extend(f"t{i}" for i in range(12_000))


def _fast_nvlink(msg: tpb.NodeTopology) -> None:
    msg.links[0].nominal_gbps = 1e12


def _nan_latency(msg: tpb.NodeTopology) -> None:
    msg.links[0].measured.gbps = 400.0
    msg.links[0].measured.latency_us = math.nan


def _huge_memory(msg: tpb.NodeTopology) -> None:
    msg.gpus[0].memory_mib = 2**63


def _lanes(msg: tpb.NodeTopology) -> None:
    msg.links[0].lanes = 2**32 - 1


def _twin_uuids(msg: tpb.NodeTopology) -> None:
    msg.gpus[1].uuid = msg.gpus[0].uuid


CASES = [
    pytest.param(Absurd(_many_gpus, "snapshot.topology.gpus"), id="10,000 GPUs on one node"),
    pytest.param(Absurd(_deep_fabric, "snapshot.topology.fabric.tiers"), id="12,000 tiers"),
    pytest.param(Absurd(_fast_nvlink, "snapshot.topology.links[0].nominal_gbps"), id="1e12 GB/s"),
    pytest.param(
        Absurd(_nan_latency, "snapshot.topology.links[0].measured.latency_us"), id="NaN latency"
    ),
    pytest.param(Absurd(_huge_memory, "snapshot.topology.gpus[0].memory_mib"), id="2^63 MiB"),
    pytest.param(Absurd(_lanes, "snapshot.topology.links[0].lanes"), id="2^32-1 lanes"),
    pytest.param(Absurd(_twin_uuids, "snapshot.topology.gpus"), id="two GPUs, one UUID"),
]


@pytest.mark.parametrize("case", CASES)
def test_an_absurd_report_is_refused_and_changes_nothing(case: Absurd) -> None:
    topology = topology_to_proto(nvswitch_node("liar", gpus=8), observed_at=time.time())
    case.change(topology)
    request = rpb.ReportRequest(
        node_name="liar",
        incarnation=time.time_ns(),
        sequence=1,
        sent_at=timestamp(time.time()),
        snapshot=rpb.Snapshot(topology=topology),
    )

    async def scenario() -> None:
        aggregator = Aggregator(AggregatorConfig())
        await aggregator.start()
        try:
            async with grpcio.channel(aggregator.grpc_target) as channel:
                call = rgrpc.ReporterStub(channel).Report()
                await call.write(request)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert (refused.value.details() or "").startswith(case.want_field + ":")
            assert aggregator.state.node_names == []
        finally:
            await aggregator.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_delta_claiming_more_gpus_than_any_node_is_refused_before_it_is_built() -> None:
    delta = rpb.Delta()
    for i in range(200):
        delta.gpus.add(index=i, uuid=f"GPU-{i}")
    with pytest.raises(CodecError) as refused:
        delta_from_proto(delta)
    assert refused.value.field == "delta.gpus"
