"""`gputopo bench ingest`: many simulated exporters against one aggregator, over real gRPC.

What runs (each in its own process, so the aggregator's RSS and CPU are its own):

1. the aggregator (`aggregator.server.Aggregator`, gRPC on a free loopback port);
2. `--workers` exporter processes sharing `--nodes` simulated nodes (DGX H100 machines built
   from a recording, under leaves of 32 and spines of 512). Each node streams the exporter
   protocol: a snapshot, then a delta every `--delta-interval` seconds (a new link
   measurement: the topology really changes) and a heartbeat half-way between, each phase
   staggered at random;
3. the same load against an ack-only gRPC server (decodes nothing, applies nothing): the
   baseline, so the figures show what the aggregator's own work adds to the transport.

Figures (JSON with `--json`), from a window of `--duration` seconds after all snapshots were
acknowledged and one more delta interval passed:

- `reports_per_second` (accepted messages of every kind) and `deltas_per_second`;
- `p99_freshness_seconds`: from an exporter sending a delta to it receiving the aggregator's
  acknowledgement, which is sent after the report was applied to the cluster state, so any
  snapshot taken from then on contains it (an upper bound on sent-to-visible);
- `aggregator_rss_mib`, `aggregator_cpu_percent` (of one core, over the window), `errors`;
- `rss_mib_10k_nodes`: RSS of a separate process holding a 10,000-node, 80,000-GPU cluster
  state (every topology decoded from its own protobuf message, as ingest holds them, with
  fabric positions, the domain index and a placement snapshot built).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

HELP = "simulated exporters against one aggregator: throughput, freshness, RSS, CPU"

# gRPC, protobuf and the aggregator are imported inside the functions the child processes run:
# `gputopo --help` imports every benchmark module to list it, and must stay fast.

_LEAF, _SPINE = 32, 512
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--nodes", type=int, default=2000, help="simulated nodes (default 2000)")
    parser.add_argument(
        "--workers", type=int, default=4, help="exporter processes (default %(default)s)"
    )
    parser.add_argument(
        "--delta-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="each node sends a delta this often (default %(default)s)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="measurement window (default %(default)s)",
    )
    parser.add_argument(
        "--memory-nodes",
        type=int,
        default=10_000,
        help="nodes of the separate memory figure, 0 to skip (default %(default)s)",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the ack-only baseline run")
    parser.add_argument("--profile", default="dgx-h100", help="machine profile of every node")
    parser.add_argument(
        "--cprofile",
        default="",
        metavar="PATH",
        help="write a cProfile of the aggregator process (whole run) to PATH",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


# --- processes ----------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds used, RSS MiB) of a process, from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    rss = int(fields[21]) * _PAGE / 2**20
    return cpu, rss


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _serve(conn: Connection, kind: str, cprofile: str = "") -> None:
    """Child: serve the aggregator (or the ack-only baseline) until told to stop; with
    `cprofile`, profile the whole process's work and write the stats there."""
    if not cprofile:
        asyncio.run(_serve_async(conn, kind))
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(_serve_async(conn, kind))
    finally:
        profiler.disable()
        profiler.dump_stats(cprofile)


async def _serve_async(conn: Connection, kind: str) -> None:
    import grpc

    from aggregator.server import Aggregator, AggregatorConfig
    from gputopo.runtime import grpcio
    from gputopo.v1 import reporter_pb2 as rpb
    from gputopo.v1 import reporter_pb2_grpc as rgrpc

    agg: Aggregator | None = None
    server: grpc.aio.Server | None = None
    if kind == "aggregator":
        agg = Aggregator(AggregatorConfig(heartbeat_interval_s=5.0, stale_after_s=120.0))
        await agg.start()
        port = agg.grpc_port
    else:

        class AckOnly(rgrpc.ReporterServicer):
            async def Report(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
                async for msg in request_iterator:
                    yield rpb.ReportResponse(
                        status=rpb.ReportResponse.STATUS_ACCEPTED, acked_sequence=msg.sequence
                    )

        # The same server as the aggregator's (gputopo.runtime.grpcio).
        server = grpcio.server()
        rgrpc.add_ReporterServicer_to_server(AckOnly(), server)
        port = grpcio.bind(server, "127.0.0.1", 0)
        await server.start()
    conn.send(port)
    while True:
        command = await asyncio.to_thread(conn.recv)
        if command == "stats" and agg is not None:
            stats = agg.reporter.stats
            conn.send(
                {
                    "nodes": len(agg.state.node_names),
                    "freshness_buckets": list(stats.freshness_buckets),
                    "freshness_count": stats.freshness_count,
                    "rejected": sum(stats.rejected.values()),
                }
            )
        elif command == "stats":
            conn.send({})
        elif command == "stop":
            break
    if agg is not None:
        await agg.stop(grace_s=1.0)
    if server is not None:
        await server.stop(1.0)


def _exporters(conn: Connection, target: str, names: list[str], options: dict[str, Any]) -> None:
    """Child: one process's share of the simulated nodes."""
    result = asyncio.run(_exporters_async(conn, target, names, options))
    conn.send(result)


def _node_messages(name: str, profile: str, index: int) -> tuple[bytes, list[bytes]]:
    """A node's snapshot topology and two alternating deltas (serialised, reused)."""
    from gputopo.codec import delta_to_proto, topology_to_proto
    from gputopo.delta import NodeDelta
    from gputopo.machines import load_machine
    from gputopo.topology import FabricPosition, Measurement

    topo = load_machine(profile, node_name=name)
    topo = replace(
        topo,
        fabric=FabricPosition(
            tiers=(f"leaf-{index // _LEAF}", f"spine-{index // _SPINE}", "core"),
            source="inventory",
            confidence="high",
        ),
    )
    link = next(iter(topo.gpu_links()))
    deltas = [
        delta_to_proto(
            NodeDelta(links=(replace(link, measured=Measurement(gbps, "cuda-memcpy-peer-ce")),))
        ).SerializeToString()
        for gbps in (360.0, 361.0)
    ]
    return topology_to_proto(topo).SerializeToString(), deltas


async def _exporters_async(
    conn: Connection, target: str, names: list[str], options: dict[str, Any]
) -> dict[str, Any]:
    import grpc

    from gputopo.runtime import grpcio
    from gputopo.v1 import reporter_pb2 as rpb
    from gputopo.v1 import topology_pb2 as tpb

    rng = random.Random(options["seed"])
    interval = options["delta_interval"]
    base = _node_messages("template", options["profile"], 0)
    # One HTTP/2 connection per 100 nodes (a local subchannel pool keeps channels with equal
    # arguments from sharing one connection); a process's nodes go round them in turn.
    channels = [
        grpcio.channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, len(names) // 100))
    ]
    samples: list[float] = []
    counts: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    # Streams that ended before the bench stopped them (by status code, EOF when the server
    # closed it cleanly), and nodes whose snapshot was never acknowledged: both are errors.
    failed: collections.Counter[str] = collections.Counter()
    unacked_snapshots = 0
    stopping = False
    acked = asyncio.Event()
    pending_snapshots = len(names)
    window = asyncio.get_running_loop().create_future()

    async def node(i: int, slot: int, name: str) -> None:
        nonlocal unacked_snapshots
        topo = tpb.NodeTopology()
        topo.ParseFromString(base[0])
        topo.name = name
        topo.fabric.tiers[:] = [f"leaf-{i // _LEAF}", f"spine-{i // _SPINE}", "core"]
        incarnation, seq = time.time_ns(), 0
        # Messages encoded once: the node's fixed fields and payload; each send appends only
        # its sequence and send time (protobuf merges concatenated messages), so the generator
        # spends its CPU on the wire, not on building messages.
        head = rpb.ReportRequest(node_name=name, incarnation=incarnation)
        encoded = {
            "snapshot": [
                rpb.ReportRequest(
                    node_name=name,
                    incarnation=incarnation,
                    snapshot=rpb.Snapshot(topology=topo),
                ).SerializeToString()
            ],
            "delta": [
                head.SerializeToString()
                + rpb.ReportRequest(delta=rpb.Delta.FromString(d)).SerializeToString()
                for d in base[1]
            ],
            "heartbeat": [
                rpb.ReportRequest(
                    node_name=name, incarnation=incarnation, heartbeat=rpb.Heartbeat()
                ).SerializeToString()
            ],
        }
        call: Any = channels[slot % len(channels)].stream_stream(
            "/gputopo.v1.Reporter/Report",
            request_serializer=None,
            response_deserializer=rpb.ReportResponse.FromString,
        )()
        sent: collections.deque[tuple[str, float]] = collections.deque()
        settled = False

        def settle(ok: bool) -> None:
            """The node's snapshot was acknowledged (ok), or its stream failed first."""
            nonlocal settled, pending_snapshots, unacked_snapshots
            if not settled:
                settled = True
                unacked_snapshots += not ok
                pending_snapshots -= 1
                if pending_snapshots == 0:
                    acked.set()

        async def send(kind: str, k: int = 0) -> None:
            nonlocal seq
            seq += 1
            stamp = rpb.ReportRequest(sequence=seq)
            stamp.sent_at.FromNanoseconds(time.time_ns())
            sent.append((kind, time.monotonic()))
            await call.write(encoded[kind][k % len(encoded[kind])] + stamp.SerializeToString())

        async def read() -> None:
            try:
                await read_acks()
                if not stopping:
                    failed["EOF"] += 1
                    errors.append(f"{name}: the server ended the stream")
            except grpc.aio.AioRpcError as err:
                if not stopping:
                    failed[err.code().name] += 1
                    errors.append(f"{name}: {err.code().name} {err.details()}")
            settle(False)

        async def read_acks() -> None:
            first = True
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    return
                assert isinstance(resp, rpb.ReportResponse)
                kind, at = sent.popleft()
                now = time.monotonic()
                if resp.status != rpb.ReportResponse.STATUS_ACCEPTED:
                    errors.append(f"{name} seq {resp.acked_sequence}: status {resp.status}")
                    continue
                if first:
                    first = False
                    settle(True)
                if window.done():
                    start, end = window.result()
                    if start <= at < end:
                        counts[kind] += 1
                        if kind == "delta":
                            samples.append(now - at)

        reader = asyncio.create_task(read())
        try:
            await send("snapshot")
            await asyncio.sleep(rng.uniform(0, interval))
            k = 0
            while True:
                await send("delta", k)
                k += 1
                await asyncio.sleep(interval / 2)
                await send("heartbeat")
                await asyncio.sleep(interval / 2)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as err:
            if not stopping:  # the reader records the stream's status; this is the write side
                errors.append(f"{name}: write failed: {type(err).__name__}")
        finally:
            settle(False)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            call.cancel()

    tasks = [
        asyncio.create_task(node(i, slot, n))
        for slot, (i, n) in enumerate(zip(options["indices"], names, strict=True))
    ]
    await acked.wait()
    conn.send(("ready", unacked_snapshots))
    start, end = await asyncio.to_thread(conn.recv)
    window.set_result((start, end))
    await asyncio.sleep(max(0.0, end - time.monotonic()) + 3.0)  # outstanding acks
    stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    return {
        "samples": samples,
        "counts": dict(counts),
        "errors": errors,
        "failed_streams": dict(failed),
        "unacked_snapshots": unacked_snapshots,
        "channels": len(channels),
    }


# --- one run ------------------------------------------------------------------------------------


def _run_load(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One server kind under the full load; figures from the measurement window."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    cprofile = args.cprofile if kind == "aggregator" else ""
    server = ctx.Process(target=_serve, args=(child, kind, cprofile), daemon=True)
    server.start()
    port = parent.recv()
    target = f"127.0.0.1:{port}"
    names = [f"bench-{i:05d}" for i in range(args.nodes)]
    workers = []
    for w in range(args.workers):
        share = list(range(w, args.nodes, args.workers))
        a, b = ctx.Pipe()
        options = {
            "delta_interval": args.delta_interval,
            "profile": args.profile,
            "seed": args.seed + w,
            "indices": share,
        }
        proc = ctx.Process(
            target=_exporters, args=(b, target, [names[i] for i in share], options), daemon=True
        )
        proc.start()
        workers.append((proc, a))
    began = time.monotonic()
    unacked = 0
    for _, pipe in workers:
        if not pipe.poll(300):
            raise RuntimeError("an exporter process did not settle its nodes' snapshots")
        ready, failed = pipe.recv()
        assert ready == "ready"
        unacked += failed
    snapshots_s = time.monotonic() - began
    start = time.monotonic() + args.delta_interval  # every node is in its steady cycle
    end = start + args.duration
    for _, pipe in workers:
        pipe.send((start, end))
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0, _ = _proc_stat(server.pid or 0)
    gen0 = sum(_proc_stat(proc.pid or 0)[0] for proc, _ in workers)
    parent.send("stats")
    stats0 = parent.recv()
    time.sleep(max(0.0, end - time.monotonic()))
    cpu1, rss = _proc_stat(server.pid or 0)
    gen1 = sum(_proc_stat(proc.pid or 0)[0] for proc, _ in workers)
    peak = _peak_rss_mib(server.pid or 0)
    parent.send("stats")
    stats1 = parent.recv()
    results = [pipe.recv() for _, pipe in workers]
    for proc, _ in workers:
        proc.join(timeout=30)
    parent.send("stop")
    server.join(timeout=30)
    samples = sorted(s for r in results for s in r["samples"])
    counts: collections.Counter[str] = collections.Counter()
    for r in results:
        counts.update(r["counts"])
    errors = [e for r in results for e in r["errors"]]
    failed_streams: collections.Counter[str] = collections.Counter()
    for r in results:
        failed_streams.update(r["failed_streams"])
    expected_deltas = args.nodes * args.duration / args.delta_interval
    out = {
        "server": kind,
        # None unless every snapshot was acknowledged: a failed stream is not an acked one.
        "seconds_until_all_snapshots_acked": round(snapshots_s, 2) if not unacked else None,
        "snapshots_not_acked": unacked,
        "streams_failed": sum(failed_streams.values()),
        "streams_failed_by_code": dict(failed_streams),
        "channels": sum(r["channels"] for r in results),
        "reports_per_second": round(sum(counts.values()) / args.duration, 1),
        "deltas_per_second": round(counts["delta"] / args.duration, 1),
        "delta_fraction_acked": round(len(samples) / expected_deltas, 4) if expected_deltas else 0,
        "p50_freshness_seconds": round(_quantile(samples, 0.50), 4),
        "p99_freshness_seconds": round(_quantile(samples, 0.99), 4),
        "max_freshness_seconds": round(samples[-1], 4) if samples else None,
        "cpu_percent": round(100 * (cpu1 - cpu0) / args.duration, 1),
        # the exporter processes together, over the same window: if it nears 100 % per core
        # the machine, not the aggregator, limits the load
        "generator_cpu_percent": round(100 * (gen1 - gen0) / args.duration, 1),
        "rss_mib": round(rss, 1),
        "peak_rss_mib": round(peak, 1),
        "errors": len(errors) + stats1.get("rejected", 0) + unacked,
        "error_examples": errors[:5],
    }
    if stats1.get("freshness_count"):
        # The aggregator's own histogram (send time to applied), over the window only.
        window = {
            "freshness_count": stats1["freshness_count"] - stats0["freshness_count"],
            "freshness_buckets": [
                b - a
                for a, b in zip(
                    stats0["freshness_buckets"], stats1["freshness_buckets"], strict=True
                )
            ],
        }
        out["aggregator_p99_freshness_bucket_seconds"] = _bucket_quantile(window, 0.99)
    return out


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def _bucket_quantile(stats: dict[str, Any], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile q (None: beyond the last)."""
    from aggregator.ingest import FRESHNESS_BUCKETS

    want = q * stats["freshness_count"]
    for bound, n in zip(FRESHNESS_BUCKETS, stats["freshness_buckets"], strict=True):
        if n >= want:
            return bound
    return None


# --- memory of a large state --------------------------------------------------------------------


def _memory(conn: Connection, nodes: int, profile: str) -> None:
    """Child: build a `nodes`-node state the way ingest holds it; report its RSS."""
    from aggregator.state import ClusterState
    from gputopo.codec import topology_from_proto
    from gputopo.v1 import topology_pb2 as tpb

    before = _proc_stat(os.getpid())[1]
    began = time.perf_counter()
    data, _ = _node_messages("template", profile, 0)
    state = ClusterState(clock=time.time, stale_after_s=1e9)
    gpus = 0
    for i in range(nodes):
        msg = tpb.NodeTopology.FromString(data)
        msg.name = f"node-{i:05d}"
        msg.fabric.tiers[:] = [f"leaf-{i // _LEAF}", f"spine-{i // _SPINE}", "core"]
        topo = topology_from_proto(msg)
        gpus += topo.gpu_count
        state.apply_snapshot(topo, incarnation=1, sequence=1)
    # Snapshots build their placement indexes on first use; build them now, as the first
    # placement would, so that the figure includes them.
    snapshot = state.snapshot().indexed()
    loaded = time.perf_counter() - began
    conn.send(
        {
            "nodes": len(snapshot.nodes),
            "gpus": gpus,
            "rss_mib": round(_proc_stat(os.getpid())[1], 1),
            "interpreter_rss_mib": round(before, 1),
            "seconds_to_build": round(loaded, 1),
            "domains": len(state.index.domains("tier-0")),
        }
    )


def _memory_figure(nodes: int, profile: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_memory, args=(child, nodes, profile), daemon=True)
    proc.start()
    result: dict[str, Any] = parent.recv()
    proc.join(timeout=30)
    return result


# --- the command --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its figures."""
    if args.nodes < 1 or args.workers < 1 or args.duration <= 0 or args.delta_interval <= 0:
        print("gputopo bench ingest: nodes, workers, duration and interval must be positive")
        return 2
    from gputopo.app.progress import Progress

    phases = 1 + (not args.no_baseline) + bool(args.memory_nodes)
    with Progress("bench ingest", phases) as progress:
        window = f"{args.nodes} nodes for {args.duration} s"
        progress.advance(0, f"the aggregator under {window}")
        main = _run_load("aggregator", args)
        baseline = None
        if not args.no_baseline:
            progress.advance(1, f"the ack-only baseline under {window}")
            baseline = _run_load("ack-only", args)
        memory = None
        if args.memory_nodes:
            progress.advance(1, f"memory of {args.memory_nodes} nodes")
            memory = _memory_figure(args.memory_nodes, args.profile)
        progress.advance(1)
    figures: dict[str, Any] = {
        "benchmark": "ingest",
        "nodes": args.nodes,
        "exporter_processes": args.workers,
        "profile": args.profile,
        "delta_interval_seconds": args.delta_interval,
        "window_seconds": args.duration,
        "reports_per_second": main["reports_per_second"],
        "deltas_per_second": main["deltas_per_second"],
        "target_deltas_per_second": round(args.nodes / args.delta_interval, 1),
        "p99_freshness_seconds": main["p99_freshness_seconds"],
        "aggregator_rss_mib": main["rss_mib"],
        "aggregator_cpu_percent": main["cpu_percent"],
        "generator_cpu_percent": main["generator_cpu_percent"],
        "streams_failed": main["streams_failed"],
        "errors": main["errors"],
        "freshness": "exporter send to the aggregator's ack, sent after the state applied it",
        "aggregator": main,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    if baseline is not None:
        figures["baseline"] = baseline
        figures["ratios"] = {
            "p99_freshness_vs_ack_only": _ratio(
                main["p99_freshness_seconds"], baseline["p99_freshness_seconds"]
            ),
            "cpu_vs_ack_only": _ratio(main["cpu_percent"], baseline["cpu_percent"]),
        }
    if memory is not None:
        figures["rss_mib_10k_nodes" if args.memory_nodes == 10_000 else "rss_mib_memory_nodes"] = (
            memory["rss_mib"]
        )
        figures["memory"] = memory
    figures["targets"] = {
        "one_delta_per_node_per_interval_sustained": main["delta_fraction_acked"] >= 0.99,
        "p99_freshness_at_most_1s": main["p99_freshness_seconds"] <= 1.0,
        "zero_errors": main["errors"] == 0,
        "zero_streams_failed": main["streams_failed"] == 0 and main["snapshots_not_acked"] == 0,
    }
    if memory is not None and args.memory_nodes == 10_000:
        figures["targets"]["rss_10k_nodes_at_most_1024_mib"] = memory["rss_mib"] <= 1024
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(figures)
    return 0


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def _print(f: dict[str, Any]) -> None:
    print(
        f"ingest: {f['nodes']} nodes in {f['exporter_processes']} exporter processes, one delta "
        f"per node every {f['delta_interval_seconds']:g} s, {f['window_seconds']:g} s window"
    )
    print(
        f"  {f['reports_per_second']} reports/s ({f['deltas_per_second']} deltas/s, target "
        f"{f['target_deltas_per_second']}), p99 freshness {f['p99_freshness_seconds']} s, "
        f"aggregator {f['aggregator_rss_mib']} MiB, {f['aggregator_cpu_percent']} % CPU, "
        f"generator {f['generator_cpu_percent']} % CPU, {f['streams_failed']} streams failed "
        f"{f['aggregator']['streams_failed_by_code']}, {f['errors']} errors"
    )
    if "baseline" in f:
        b = f["baseline"]
        print(
            f"  ack-only baseline: p99 {b['p99_freshness_seconds']} s, {b['cpu_percent']} % CPU "
            f"(ratios {f['ratios']})"
        )
    if "memory" in f:
        m = f["memory"]
        print(f"  {m['nodes']} nodes, {m['gpus']} GPUs held in {m['rss_mib']} MiB")
    print(f"  targets: {f['targets']}")
