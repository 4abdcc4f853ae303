"""`gputopo bench ingest`: many simulated exporters against one aggregator, over real gRPC.

What runs (each in its own process, so the aggregator's RSS and CPU are its own):

1. the aggregator (`aggregator.server.Aggregator`, gRPC on a free loopback port);
2. `--workers` load processes sharing `--nodes` simulated nodes (DGX H100 machines built
   from a recording, under leaves of 32 and spines of 512). Each node streams the exporter
   protocol on its own Report stream: a snapshot, then a delta every `--delta-interval`
   seconds (a new link measurement: the topology really changes), each phase staggered at
   random, and a heartbeat after as much silence as the aggregator's acknowledgements ask
   (`--max-heartbeats-per-second` paces it: 5 s up to 5,000 nodes by default, a heartbeat
   half-way between deltas; 20 s at 20,000, so deltas alone keep a node fresh). The load
   side is cheap on purpose (`_ingest_load`: pre-encoded messages over HTTP/2 spoken
   directly, `--nodes-per-connection` streams per connection, streams opened at most
   `--ramp` per second with at most `--in-flight` snapshots unacknowledged), and its CPU is
   reported beside the aggregator's;
3. the same load against an ack-only gRPC server (decodes nothing, applies nothing, announces
   the heartbeat interval the aggregator would for as many live streams): the baseline, so the
   figures show what the aggregator's own work adds to the transport.

Figures (JSON with `--json`), from a window of `--duration` seconds after all snapshots were
acknowledged and one more delta interval passed:

- `reports_per_second` (accepted messages of every kind), `deltas_per_second` and
  `heartbeats_per_second` (acknowledged, by send time in the window), and
  `heartbeat_interval_announced_seconds` (what most acknowledgements in the window announced;
  `heartbeat_intervals_announced` counts them all);
- `p99_freshness_seconds`: from an exporter sending a delta to it receiving the aggregator's
  acknowledgement, which is sent after the report was applied to the cluster state, so any
  snapshot taken from then on contains it (an upper bound on sent-to-visible);
- `aggregator_rss_mib`, `aggregator_cpu_percent` (of one core, over the window) and
  `generator_cpu_percent` (the load processes together, same window);
- `aggregator_loop_running_percent` and `aggregator_loop_waiting_for_cpu_percent`: the share of
  the window the aggregator's event-loop thread ran, and was ready but waited for a CPU
  (/proc schedstat); both together near 100 % say the loop, not the load, is the limit;
- `settled`: false when `--settle-timeout` passed before every snapshot was acknowledged (or
  its stream failed); the window is measured anyway, beside `reports_sent_in_window`;
- `streams_failed` (a stream that ended before the bench stopped it, by reason: RST_STREAM
  CANCEL, trailers, GOAWAY, a lost connection), `errors` (those, refused messages and
  snapshots never acknowledged); `seconds_until_all_snapshots_acked` is None unless every
  snapshot was;
- `rss_mib_10k_nodes`: RSS of a separate process holding a 10,000-node, 80,000-GPU cluster
  state (every topology decoded from its own protobuf message, as ingest holds them, with
  fabric positions, the domain index and a placement snapshot built).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from gputopo.app.benchmarks._ingest_load import fabric_tiers, run_load

HELP = "simulated exporters against one aggregator: throughput, freshness, RSS, CPU"

# gRPC, protobuf and the aggregator are imported inside the functions the child processes run:
# `gputopo --help` imports every benchmark module to list it, and must stay fast.

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The aggregator's own heartbeat interval before pacing (AggregatorConfig's default), and what
# the load's nodes wait before an acknowledgement announces one (the exporter's default).
HEARTBEAT_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--nodes", type=int, default=2000, help="simulated nodes (default 2000)")
    parser.add_argument(
        "--workers", type=int, default=2, help="exporter processes (default %(default)s)"
    )
    parser.add_argument(
        "--nodes-per-connection",
        type=int,
        default=100,
        metavar="N",
        help="report streams per HTTP/2 connection (default %(default)s)",
    )
    parser.add_argument(
        "--ramp",
        type=float,
        default=2000.0,
        metavar="PER_SECOND",
        help="streams opened per second at most, all processes together (default %(default)g)",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=1000,
        metavar="N",
        help="snapshots sent and not yet acknowledged at most while connecting, all processes "
        "together (default %(default)s)",
    )
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="measure anyway after this long connecting, the nodes not connected counted as "
        "errors and the figures saying settled: false (default 0: 120 s + 30 ms per node)",
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
        default=30.0,
        metavar="SECONDS",
        help="measurement window (default %(default)s)",
    )
    parser.add_argument(
        "--memory-nodes",
        type=int,
        default=10_000,
        help="nodes of the separate memory figure, 0 to skip (default %(default)s)",
    )
    parser.add_argument(
        "--grpc-servers",
        type=int,
        default=0,
        metavar="N",
        help="gRPC servers sharing the aggregator's port (default 0: the aggregator's default)",
    )
    parser.add_argument(
        "--max-heartbeats-per-second",
        type=float,
        default=None,
        metavar="N",
        help="the aggregator's --max-heartbeats-per-second, also for the ack-only baseline"
        " (0: heartbeats every 5 s whatever the nodes; default: the aggregator's default)",
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


def _main_thread_ns(pid: int) -> tuple[int, int] | None:
    """(ns running, ns runnable but waiting for a CPU) of a process's main thread, from
    /proc/PID/task/PID/schedstat; None where the kernel does not keep it."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", encoding="ascii") as fh:
            running, waiting, _ = fh.read().split()
    except (OSError, ValueError):
        return None
    return int(running), int(waiting)


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _open_files_to_hard_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit. 20,000 nodes in
    connections of 100 need 200 sockets a side, but a small `--nodes-per-connection` needs a
    socket per few nodes, and the soft default is 1,024 on many systems."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _serve(
    conn: Connection,
    kind: str,
    cprofile: str = "",
    servers: int = 0,
    heartbeats_per_second: float | None = None,
) -> None:
    """Child: serve the aggregator (or the ack-only baseline) until told to stop, on `servers`
    gRPC servers sharing its port (0: the aggregator's default), pacing heartbeats to
    `heartbeats_per_second` (None: the aggregator's default); with `cprofile`, profile the
    whole process's work and write the stats there."""
    _open_files_to_hard_limit()
    if not cprofile:
        asyncio.run(_serve_async(conn, kind, servers, heartbeats_per_second))
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(_serve_async(conn, kind, servers, heartbeats_per_second))
    finally:
        profiler.disable()
        profiler.dump_stats(cprofile)


async def _serve_async(
    conn: Connection, kind: str, servers: int, heartbeats_per_second: float | None
) -> None:
    import grpc
    from google.protobuf.duration_pb2 import Duration

    from aggregator.server import GRPC_SERVERS, SERVER_OPTIONS, Aggregator, AggregatorConfig
    from gputopo.heartbeats import DEFAULT_MAX_HEARTBEATS_PER_SECOND, HeartbeatPacer
    from gputopo.runtime import grpcio
    from gputopo.v1 import reporter_pb2 as rpb
    from gputopo.v1 import reporter_pb2_grpc as rgrpc

    servers = servers or GRPC_SERVERS
    budget = heartbeats_per_second
    if budget is None:
        budget = DEFAULT_MAX_HEARTBEATS_PER_SECOND
    agg: Aggregator | None = None
    ack_only: list[grpc.aio.Server] = []
    if kind == "aggregator":
        # The collector as `gputopo aggregator` runs it (its --heap-freeze default).
        agg = Aggregator(
            AggregatorConfig(
                heartbeat_interval_s=HEARTBEAT_S,
                stale_after_s=120.0,
                max_heartbeats_per_second=budget,
                heap_freeze_s=30.0,
                grpc_servers=servers,
            )
        )
        await agg.start()
        port = agg.grpc_port
    else:
        # The interval the aggregator would announce for as many live streams, moved once a
        # second as its housekeeping does: the baseline carries the same load.
        pacer = HeartbeatPacer(
            base_s=HEARTBEAT_S, stale_after_s=120.0, max_per_second=budget, clock=time.time
        )
        every = Duration()
        every.FromNanoseconds(round(HEARTBEAT_S * 1e9))
        live = [0]

        class AckOnly(rgrpc.ReporterServicer):
            async def Report(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
                live[0] += 1
                try:
                    async for msg in request_iterator:
                        yield rpb.ReportResponse(
                            status=rpb.ReportResponse.STATUS_ACCEPTED,
                            acked_sequence=msg.sequence,
                            heartbeat_interval=every,
                        )
                finally:
                    live[0] -= 1

        async def pace() -> None:
            while True:
                await asyncio.sleep(1.0)
                if pacer.update(live[0]):
                    every.FromNanoseconds(round(pacer.interval_s * 1e9))

        pacing = asyncio.create_task(pace())

        # The same servers as the aggregator's (gputopo.runtime.grpcio, SERVER_OPTIONS, as many
        # sharing the port).
        for _ in range(servers):
            server = grpcio.server(options=SERVER_OPTIONS, share_port=servers > 1)
            rgrpc.add_ReporterServicer_to_server(AckOnly(), server)
            ack_only.append(server)
        port = grpcio.bind_shared(ack_only, "127.0.0.1", 0)
        await asyncio.gather(*(server.start() for server in ack_only))
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
    else:
        pacing.cancel()
    await asyncio.gather(*(server.stop(1.0) for server in ack_only))


def _exporters(conn: Connection, target: str, names: list[str], options: dict[str, Any]) -> None:
    """Child: one process's share of the simulated nodes (`_ingest_load`)."""
    _open_files_to_hard_limit()
    base = _node_messages("template", options["profile"], 0)
    result = asyncio.run(run_load(conn, target, names, options, base))
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
            tiers=tuple(fabric_tiers(index)),
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


# --- one run ------------------------------------------------------------------------------------


def _run_load(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One server kind under the full load; figures from the measurement window."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    cprofile = args.cprofile if kind == "aggregator" else ""
    server = ctx.Process(
        target=_serve,
        args=(child, kind, cprofile, args.grpc_servers, args.max_heartbeats_per_second),
        daemon=True,
    )
    server.start()
    port = parent.recv()
    target = f"127.0.0.1:{port}"
    names = [f"bench-{i:05d}" for i in range(args.nodes)]
    workers = []
    # Connecting is paced by the server (a few ms of its CPU per snapshot) and the machine may
    # be shared: generous, and past it the window is measured anyway, with the nodes that did
    # not connect counted as snapshots not acknowledged.
    limit_s = args.settle_timeout or 120 + 0.03 * args.nodes
    began = time.monotonic()
    for w in range(args.workers):
        share = list(range(w, args.nodes, args.workers))
        a, b = ctx.Pipe()
        options = {
            "nodes_per_connection": args.nodes_per_connection,
            "ramp": args.ramp / args.workers,
            "in_flight": max(1, args.in_flight // args.workers),
            "settle_by": began + limit_s,
            "delta_interval": args.delta_interval,
            "heartbeat_interval": HEARTBEAT_S,
            "profile": args.profile,
            "seed": args.seed + w,
            "indices": share,
        }
        proc = ctx.Process(
            target=_exporters, args=(b, target, [names[i] for i in share], options), daemon=True
        )
        proc.start()
        workers.append((proc, a))
    unacked = 0
    settled = True
    for _, pipe in workers:
        if not pipe.poll(max(0.0, began + limit_s + 60 - time.monotonic())):
            raise RuntimeError(f"a load process did not answer within {limit_s + 60:.0f} s")
        ready, failed, worker_settled = pipe.recv()
        assert ready == "ready"
        unacked += failed
        settled = settled and worker_settled
    snapshots_s = time.monotonic() - began
    start = time.monotonic() + args.delta_interval  # every node is in its steady cycle
    end = start + args.duration
    for _, pipe in workers:
        pipe.send((start, end))
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0, _ = _proc_stat(server.pid or 0)
    loop0 = _main_thread_ns(server.pid or 0)
    gen0 = sum(_proc_stat(proc.pid or 0)[0] for proc, _ in workers)
    parent.send("stats")
    stats0 = parent.recv()
    time.sleep(max(0.0, end - time.monotonic()))
    cpu1, rss = _proc_stat(server.pid or 0)
    loop1 = _main_thread_ns(server.pid or 0)
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
    sent_kinds: collections.Counter[str] = collections.Counter()
    announced: collections.Counter[str] = collections.Counter()
    for r in results:
        failed_streams.update(r["failed_streams"])
        sent_kinds.update(r["sent_kinds"])
        announced.update(r["announced"])
    expected_deltas = args.nodes * args.duration / args.delta_interval
    out = {
        "server": kind,
        # False: --settle-timeout passed before every snapshot was acknowledged or failed; the
        # ramp stopped there (the nodes not yet opened never are) and the window was measured
        "settled": settled,
        "settle_timeout_seconds": round(limit_s, 3),
        # None unless every snapshot was acknowledged: a failed stream is not an acked one.
        "seconds_until_all_snapshots_acked": round(snapshots_s, 2) if not unacked else None,
        "snapshots_not_acked": unacked,
        "streams_failed": sum(failed_streams.values()),
        "streams_failed_by_code": dict(failed_streams),
        "channels": sum(r["channels"] for r in results),
        "reports_per_second": round(sum(counts.values()) / args.duration, 1),
        # sent in the window, acknowledged or not: 0 acked of many sent is a server behind
        "reports_sent_in_window": sum(r["sent_in_window"] for r in results),
        "deltas_per_second": round(counts["delta"] / args.duration, 1),
        "heartbeats_per_second": round(counts["heartbeat"] / args.duration, 1),
        # sent in the window by kind, acknowledged or not
        "sent_per_second": {k: round(n / args.duration, 1) for k, n in sorted(sent_kinds.items())},
        # what acknowledgements in the window announced (seconds -> acks); the commonest
        "heartbeat_intervals_announced": dict(sorted(announced.items(), key=lambda kv: kv[0])),
        "heartbeat_interval_announced_seconds": (
            float(announced.most_common(1)[0][0]) if announced else None
        ),
        "delta_fraction_acked": round(len(samples) / expected_deltas, 4) if expected_deltas else 0,
        # None without a delta acknowledged in the window: not measured, not 0 s (nor NaN,
        # which is not JSON)
        "p50_freshness_seconds": _quantile(samples, 0.50),
        "p99_freshness_seconds": _quantile(samples, 0.99),
        "max_freshness_seconds": round(samples[-1], 4) if samples else None,
        "cpu_percent": round(100 * (cpu1 - cpu0) / args.duration, 1),
        # The server's event-loop thread (all of grpc.aio and the state run on it): the share
        # of the window it ran, and the share it was ready to run but waited for a CPU that
        # other processes held. Together near 100 %: the loop was never idle, so it is the
        # limit; a large wait: the machine's other work is.
        **_loop_shares(loop0, loop1, args.duration),
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


def _loop_shares(
    before: tuple[int, int] | None, after: tuple[int, int] | None, seconds: float
) -> dict[str, float | None]:
    if before is None or after is None:
        return {"loop_running_percent": None, "loop_waiting_for_cpu_percent": None}
    return {
        "loop_running_percent": round((after[0] - before[0]) / seconds / 1e7, 1),
        "loop_waiting_for_cpu_percent": round((after[1] - before[1]) / seconds / 1e7, 1),
    }


def _quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of sorted `values`, rounded to 0.1 ms; None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 4)
    return round(statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1], 4)


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
        msg.fabric.tiers[:] = fabric_tiers(i)
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
    positive = {
        "--nodes": args.nodes,
        "--workers": args.workers,
        "--duration": args.duration,
        "--delta-interval": args.delta_interval,
        "--nodes-per-connection": args.nodes_per_connection,
        "--ramp": args.ramp,
        "--in-flight": args.in_flight,
    }
    if args.settle_timeout < 0:
        positive["--settle-timeout"] = args.settle_timeout
    if args.grpc_servers < 0:
        positive["--grpc-servers"] = args.grpc_servers
    for option, value in positive.items():
        if not value > 0:
            print(f"gputopo bench ingest: {option} must be positive, not {value}", file=sys.stderr)
            return 2
    import importlib.util

    if importlib.util.find_spec("h2") is None:
        print(
            "gputopo bench ingest: the load generator needs the h2 package:"
            " pip install 'gputopo[bench]'",
            file=sys.stderr,
        )
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
        "settled": main["settled"],
        "reports_per_second": main["reports_per_second"],
        "deltas_per_second": main["deltas_per_second"],
        "heartbeats_per_second": main["heartbeats_per_second"],
        "heartbeat_interval_announced_seconds": main["heartbeat_interval_announced_seconds"],
        "max_heartbeats_per_second": args.max_heartbeats_per_second,
        "target_deltas_per_second": round(args.nodes / args.delta_interval, 1),
        "p99_freshness_seconds": main["p99_freshness_seconds"],
        "aggregator_rss_mib": main["rss_mib"],
        "aggregator_cpu_percent": main["cpu_percent"],
        "generator_cpu_percent": main["generator_cpu_percent"],
        "aggregator_loop_running_percent": main["loop_running_percent"],
        "aggregator_loop_waiting_for_cpu_percent": main["loop_waiting_for_cpu_percent"],
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
        "p99_freshness_at_most_1s": (
            main["p99_freshness_seconds"] is not None and main["p99_freshness_seconds"] <= 1.0
        ),
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


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _print(f: dict[str, Any]) -> None:
    print(
        f"ingest: {f['nodes']} nodes in {f['exporter_processes']} exporter processes, one delta "
        f"per node every {f['delta_interval_seconds']:g} s, {f['window_seconds']:g} s window"
    )
    main = f["aggregator"]
    if not f["settled"]:
        print(
            f"  NOT SETTLED: {main['snapshots_not_acked']} snapshots not acknowledged after "
            f"{main['settle_timeout_seconds']:g} s (--settle-timeout); measured anyway, "
            f"{main['reports_sent_in_window']} reports sent in the window"
        )
    print(
        f"  {f['reports_per_second']} reports/s ({f['deltas_per_second']} deltas/s, target "
        f"{f['target_deltas_per_second']}; {f['heartbeats_per_second']} heartbeats/s at the "
        f"{f['heartbeat_interval_announced_seconds']} s announced), "
        f"p99 freshness {f['p99_freshness_seconds']} s, "
        f"aggregator {f['aggregator_rss_mib']} MiB, {f['aggregator_cpu_percent']} % CPU "
        f"(its loop ran {f['aggregator_loop_running_percent']} % of the time and waited for a "
        f"CPU {f['aggregator_loop_waiting_for_cpu_percent']} %), "
        f"generator {f['generator_cpu_percent']} % CPU, {f['streams_failed']} streams failed "
        f"{main['streams_failed_by_code']}, {f['errors']} errors"
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
