"""Cold-cache Place of 1 and 8 GPUs beside three 128-GPU PCIe nodes, in process and over gRPC.

Issue 25's acceptance figures (under 0.1 s and 1 s). The nodes are the worst shapes of
tests/placement/test_intranode_worst.py: two uneven PCIe trees (two and four sockets) and one
with every GPU pair measured within 10 % of nominal. `--write DIR` saves them as NodeTopology
messages (needs a checkout with `pcie_tree`); `--read DIR` measures any checkout on them, so an
older commit can be compared on the same input:

    .venv/bin/python scripts/bench_big_nodes.py --write /tmp/big
    for side in /tmp/gputopo-base . /tmp/gputopo-base .; do
        (cd $side && PYTHONPATH=$side .venv/bin/python scripts/bench_big_nodes.py --read /tmp/big)
    done

Prints one JSON line of seconds: inproc_1, inproc_8, grpc_1, grpc_8 (wall time), the same
with `cpu_` (the process's CPU time: less swayed by other work on a shared machine), and
`shapes`, what reading the three nodes' shapes costs (once per reported topology; the first
in-process Place pays it, the gRPC ones find it done).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path

import grpc

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.codec import topology_from_proto, topology_to_proto
from gputopo.placement import clear_caches, place
from gputopo.request import request_from_mapping
from gputopo.runtime.placement_client import PlacementClient
from gputopo.shape import node_shape
from gputopo.v1 import topology_pb2 as tpb

NAMES = ("tree-2-sockets", "tree-4-sockets", "measured")


def write(directory: Path) -> None:
    # here, not at the top: older checkouts measured with --read have no pcie_tree
    from gputopo.sim.pcieserver import (  # noqa: PLC0415
        measured_with_noise,
        pcie_tree,
        uneven_tree,
    )

    topologies = [
        pcie_tree("tree-2-sockets", sockets=uneven_tree(128, seed=1)),
        pcie_tree("tree-4-sockets", sockets=uneven_tree(128, seed=3, sockets=4)),
        # measured now: the aggregator reads links at its clock, where measurements taken at 0
        # are stale (the node would be a plain tree); read within 6 hours of writing
        measured_with_noise(
            pcie_tree("measured", sockets=uneven_tree(128, seed=4)),
            seed=4,
            measured_at=time.time(),
        ),
    ]
    directory.mkdir(parents=True, exist_ok=True)
    for topo in topologies:
        (directory / f"{topo.name}.pb").write_bytes(topology_to_proto(topo).SerializeToString())


def measure(directory: Path) -> dict[str, float]:
    topologies = []
    for name in NAMES:
        msg = tpb.NodeTopology()
        msg.ParseFromString((directory / f"{name}.pb").read_bytes())
        topologies.append(topology_from_proto(msg))
    requests = {
        g: request_from_mapping({"job": f"tp{g}", "groups": [{"name": "tp", "gpus_per_pod": g}]})
        for g in (1, 8)
    }
    out: dict[str, float] = {}
    snapshot = ClusterSnapshot(NodeState(t, frozenset(range(t.gpu_count))) for t in topologies)
    for g, request in requests.items():
        clear_caches()
        start, cpu = time.perf_counter(), time.process_time()
        result, _ = place(snapshot, request)
        out[f"inproc_{g}"] = round(time.perf_counter() - start, 3)
        out[f"cpu_inproc_{g}"] = round(time.process_time() - cpu, 3)
        assert result.placed, result.reason
    copies = [dataclasses.replace(t) for t in topologies]  # new link tuples: read afresh
    start = time.perf_counter()
    for topo in copies:
        node_shape(topo, now=time.time())
    out["shapes"] = round(time.perf_counter() - start, 3)

    async def over_grpc() -> None:
        agg = Aggregator(AggregatorConfig(search_deadline_s=60))
        for topo in topologies:
            agg.state.add_static(topo)
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                client = PlacementClient(channel)
                for g, request in requests.items():
                    clear_caches()
                    start, cpu = time.perf_counter(), time.process_time()
                    answer = await client.place(request, dry_run=True)
                    out[f"grpc_{g}"] = round(time.perf_counter() - start, 3)
                    out[f"cpu_grpc_{g}"] = round(time.process_time() - cpu, 3)
                    assert answer.result.placed, answer.result.reason
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(over_grpc())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, metavar="DIR")
    group.add_argument("--read", type=Path, metavar="DIR")
    args = parser.parse_args()
    if args.write:
        write(args.write)
    else:
        print(json.dumps(measure(args.read)))


if __name__ == "__main__":
    main()
