"""Aggregator CPU per report, in process: what `ClusterState` costs for a delta and a heartbeat.

`gputopo bench ingest` measures the whole path (gRPC, codec, state) with a load generator on
the same cores; this isolates the state's share, which is what a report costs once decoded.
It builds a `--nodes`-node state of the ingest bench's nodes (DGX H100, fabric tiers from an
inventory source), then times `--reports` deltas of the kind the ingest bench sends (one
GPU-GPU link with a new measurement, alternating between two figures) and `--heartbeats`
heartbeats, round-robin over the nodes, then `--snapshots` snapshots of known nodes (each a
change: a resync), and prints µs per delta, per heartbeat and per snapshot as JSON, and what
the next cluster snapshot costs after a delta (what placement pays for ingest moving a node).

    PYTHONPATH=. .venv/bin/python scripts/bench_state.py --nodes 2000 --reports 20000

Side by side with another checkout (this script, that checkout's code, interleaved rounds,
medians and branch / base): `scripts/bench_compare.py`, which runs it as it runs `gputopo bench`

    .venv/bin/python scripts/bench_compare.py --base /tmp/gputopo-base \
        --script scripts/bench_state.py -- --nodes 2000

It uses only `ClusterState`'s public API, which older commits share.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import replace

from aggregator.state import ClusterState
from gputopo.delta import NodeDelta
from gputopo.machines import load_machine
from gputopo.topology import FabricPosition, Measurement

_LEAF, _SPINE = 32, 512  # as the ingest bench places its nodes


def state_fabric(state: ClusterState, name: str) -> FabricPosition:
    """The fabric position a node reported (its snapshots again say the same)."""
    rec = state.record(name)
    return rec.reported.fabric if rec is not None and rec.reported is not None else FabricPosition()


def measure(
    nodes: int, reports: int, heartbeats: int, snapshots: int, *, profile: str, after: int = 50
) -> dict[str, float]:
    """µs of `ClusterState` CPU per delta and per heartbeat (process time, GC off)."""
    clock = [1000.0]
    state = ClusterState(clock=lambda: clock[0], stale_after_s=1e9)
    template = load_machine(profile, node_name="template")
    link = next(iter(template.gpu_links()))
    deltas = [
        NodeDelta(links=(replace(link, measured=Measurement(gbps, "cuda-memcpy-peer-ce")),))
        for gbps in (360.0, 361.0)
    ]
    names = [f"node-{i:05d}" for i in range(nodes)]
    for i, name in enumerate(names):
        fabric = FabricPosition(
            tiers=(f"leaf-{i // _LEAF}", f"spine-{i // _SPINE}", "core"),
            source="inventory",
            confidence="high",
        )
        topo = load_machine(profile, node_name=name)
        state.apply_snapshot(replace(topo, fabric=fabric), incarnation=1, sequence=1)
    state.snapshot()
    # Snapshots again (an exporter restarted, or resynced): two versions of the first nodes,
    # alternating, so that each one really changes the node.
    resent = [
        [
            replace(
                load_machine(profile, node_name=name),
                fabric=state_fabric(state, name),
                links=tuple(
                    replace(lk, measured=Measurement(gbps, "cuda-memcpy-peer-ce"))
                    if lk.key == link.key
                    else lk
                    for lk in template.links
                ),
            )
            for gbps in (360.0, 361.0)
        ]
        for name in names[: min(nodes, 200)]
    ]
    sequence = 1
    gc.collect()
    gc.disable()
    try:
        began = time.process_time()
        for k in range(reports):
            sequence += 1
            name = names[k % nodes]
            state.apply_delta(name, deltas[(k // nodes) % 2], incarnation=1, sequence=sequence)
        delta_s = time.process_time() - began
        began = time.process_time()
        for k in range(heartbeats):
            sequence += 1
            state.heartbeat(names[k % nodes], incarnation=1, sequence=sequence)
        heartbeat_s = time.process_time() - began
        # What placement pays after ingest moved a node: the next cluster snapshot.
        began = time.process_time()
        for k in range(after):
            sequence += 1
            state.apply_delta(names[k % nodes], deltas[k % 2], incarnation=1, sequence=sequence)
            state.snapshot()
        after_s = time.process_time() - began
        began = time.process_time()
        for k in range(snapshots):
            sequence += 1
            topo = resent[k % len(resent)][(k // len(resent)) % 2]
            state.apply_snapshot(topo, incarnation=1, sequence=sequence)
        snapshot_s = time.process_time() - began
    finally:
        gc.enable()
    return {
        "nodes": nodes,
        "reports": reports,
        "us_per_delta": round(delta_s / reports * 1e6, 2),
        "heartbeats": heartbeats,
        "us_per_heartbeat": round(heartbeat_s / heartbeats * 1e6, 3),
        "ms_per_cluster_snapshot_after_a_delta": round(after_s / after * 1e3, 3) if after else 0.0,
        "snapshots": snapshots,
        "us_per_snapshot": round(snapshot_s / snapshots * 1e6, 2) if snapshots else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--reports", type=int, default=20000, help="deltas")
    parser.add_argument("--heartbeats", type=int, default=200000)
    parser.add_argument("--snapshots", type=int, default=2000, help="snapshots of known nodes")
    parser.add_argument("--profile", default="dgx-h100")
    args = parser.parse_args()
    figures = measure(
        args.nodes, args.reports, args.heartbeats, args.snapshots, profile=args.profile
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
