"""Three 128-GPU PCIe nodes reported over real gRPC do not hold placement up (issue 25).

Three reports of the worst nodes the limits allow (128 GPUs on uneven PCIe trees, one with every
link measured) used to end 5 of 5 honest Places in DEADLINE_EXCEEDED. Here they arrive through
the Reporter service as snapshots, and a 1-GPU and an 8-GPU Place over gRPC answer placed,
several times each, with the search caches cold before each round.
"""

from __future__ import annotations

import time

import grpc

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.codec import topology_to_proto
from gputopo.placement import clear_caches
from gputopo.request import request_from_mapping
from gputopo.runtime.placement_client import PlacementClient
from gputopo.shape import node_shape
from gputopo.sim.pcieserver import measured_with_noise, pcie_tree, uneven_tree
from gputopo.topology import NodeTopology
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.aggregator.kubeutil import run
from tests.placement.test_intranode_worst import WORST

ROUNDS = 3


def _nodes() -> list[NodeTopology]:
    """Two uneven trees and a node with every link measured, measured now: the aggregator reads
    links at its clock, where `WORST`'s measurements (taken at 0) are stale and that node would
    be one more plain tree."""
    noisy = measured_with_noise(
        pcie_tree("d", sockets=uneven_tree(128, seed=4)), seed=4, measured_at=time.time()
    )
    assert len({g for row in node_shape(noisy, now=time.time()).bw for g in row}) > 1000
    return [WORST["an uneven two-socket PCIe tree"], WORST["an uneven four-socket tree"], noisy]


def test_an_honest_place_answers_quickly_beside_three_128_gpu_nodes() -> None:
    async def go() -> tuple[dict[int, list[float]], dict[int, list[float]]]:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        took: dict[int, list[float]] = {1: [], 8: []}
        cpu: dict[int, list[float]] = {1: [], 8: []}
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                calls = []
                for topo in _nodes():
                    call = stub.Report()
                    msg = rpb.ReportRequest(
                        node_name=topo.name,
                        incarnation=1,
                        sequence=1,
                        snapshot=rpb.Snapshot(topology=topology_to_proto(topo)),
                    )
                    assert msg.ByteSize() > 100_000  # the size of a real 128-GPU report
                    await call.write(msg)
                    answer = await call.read()
                    assert answer.status == rpb.ReportResponse.STATUS_ACCEPTED, answer
                    calls.append(call)
                client = PlacementClient(channel)
                for _ in range(ROUNDS):
                    clear_caches()
                    for gpus in (1, 8):
                        req = request_from_mapping(
                            {"job": f"tp{gpus}", "groups": [{"name": "tp", "gpus_per_pod": gpus}]}
                        )
                        start, cpu_start = time.perf_counter(), time.process_time()
                        answer = await client.place(req)
                        took[gpus].append(time.perf_counter() - start)
                        cpu[gpus].append(time.process_time() - cpu_start)
                        assert answer.result.placed, answer.result.reason
                        assert answer.result.gpu_count == gpus
                for call in calls:
                    await call.done_writing()
        finally:
            await agg.stop(grace_s=0.1)
        return took, cpu

    took, cpu = run(go(), timeout_s=120)
    # Client, server and search share this process, so its CPU time is what a Place costs,
    # and other processes on a loaded machine do not inflate it: measured 0.010-0.039 s and
    # 0.017-0.018 s here on 2 shared cores at a load of 0.8-1.7, the third node's links
    # measured, against the acceptance figures of 0.1 s and 1 s. 0.5 s leaves 12x for a slower
    # CPU.
    assert max(cpu[1]) < 0.5, cpu
    assert max(cpu[8]) < 0.5, cpu
    # Wall time waits for the CPU as well: only the old failure (8-19 s per Place,
    # DEADLINE_EXCEEDED at 20 s) is certain to pass 5 s on any machine.
    assert max(took[1] + took[8]) < 5.0, took
