"""`gputopo simulate`: replay a job trace on a modelled cluster with every policy, side by side.

    gputopo simulate --cluster SOURCE --trace SOURCE [--trace SOURCE ...]
                     [--policy P ...] [--backfill] [--json] [--plots DIR]

Cluster SOURCE: `inventory:MODEL.yaml` (or a bare path), `lingjun:topo.csv` (hosts of
`--node-profile`, 8x H100 by default), `openb:node_list.csv`, `nvl72:N` (or `--nvl72 N`).
Trace SOURCE: `openb:pod_list.csv`, `kalos:trace.csv`, `llm:JOBS[@SEED]` (the generated LLM mix,
offering `--load` times the cluster). Every policy replays the same jobs. Exit codes: 0 done,
1 a policy broke an invariant (a double-booked GPU, a broken gang), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

HELP = "replay a job trace on a modelled cluster with every placement policy, side by side"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument("--cluster", metavar="SOURCE", help="inventory:, lingjun:, openb:, nvl72:")
    parser.add_argument("--nvl72", type=int, metavar="N", help="N GB200 NVL72 racks as the cluster")
    parser.add_argument(
        "--node-profile",
        default="dgx-h100",
        metavar="PROFILE",
        help="machine profile of Lingjun's hosts and of inventory nodes naming none "
        "(default dgx-h100; `gputopo machines` lists them)",
    )
    parser.add_argument(
        "--trace",
        action="append",
        required=True,
        metavar="SOURCE",
        help="openb:FILE, kalos:FILE or llm:JOBS[@SEED]; repeat to merge traces",
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="a policy to replay (repeat); default: all of gputopo, kueue-bestfit, kai-binpack, "
        "tightest-fit, default, first-fit, random",
    )
    parser.add_argument("--backfill", action="store_true", help="let later jobs that fit start")
    parser.add_argument(
        "--backfill-window", type=int, default=64, metavar="N", help="jobs backfill looks at"
    )
    parser.add_argument(
        "--load", type=float, default=0.9, help="GPU load the llm: generator offers (default 0.9)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    parser.add_argument("--limit", type=int, default=0, metavar="N", help="replay only N jobs")
    parser.add_argument(
        "--comm-share",
        action="append",
        default=[],
        metavar="CLASS=S",
        help="communication share of a job class in the job-time model "
        "(pod, small, finetune, pretrain, train, serve; 0..1)",
    )
    parser.add_argument(
        "--spine-oversubscription",
        type=float,
        default=1.0,
        help="divide network bandwidth by this when a collective crosses leaves (default 1.0)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--plots", metavar="DIR", help="write PNG plots there (needs gputopo[sim])")


def _fail(why: str) -> int:
    print(f"gputopo simulate: {why}", file=sys.stderr)
    return 2


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def run(args: argparse.Namespace) -> int:
    """Load the cluster and the trace, replay each policy, print."""
    from pathlib import Path

    from gputopo.cluster import ClusterSnapshot, NodeState
    from gputopo.sim.clusters import ClusterSourceError, load_cluster
    from gputopo.sim.engine import SIM_POLICIES, Engine, InvariantError
    from gputopo.sim.jobtime import BANDWIDTH, COMM_SHARE, JobTimeModel
    from gputopo.sim.metrics import series, summarise
    from gputopo.sim.replay import ReplayOptions, replay, stderr_progress
    from gputopo.sim.report import PlotsUnavailableError, table, write_plots
    from gputopo.sim.traces import JobClass, TraceSourceError, merged, read_trace

    if (args.cluster is None) == (args.nvl72 is None):
        return _fail("give exactly one of --cluster and --nvl72")
    policies = args.policy or list(SIM_POLICIES)
    unknown = [p for p in policies if p not in SIM_POLICIES]
    if unknown:
        return _fail(f"--policy: unknown {', '.join(unknown)}; known: {', '.join(SIM_POLICIES)}")
    shares = dict(COMM_SHARE)
    for item in args.comm_share:
        name, _, value = item.partition("=")
        try:
            shares[JobClass(name)] = float(value)
        except ValueError:
            return _fail(
                f"--comm-share {item!r}: use CLASS=S with CLASS one of "
                f"{', '.join(c.value for c in JobClass)}"
            )
    source = args.cluster if args.cluster is not None else f"nvl72:{args.nvl72}"
    try:
        cluster = load_cluster(source, profile=args.node_profile)
    except ClusterSourceError as err:
        return _fail(f"--cluster: {err}")
    if not cluster.nodes:
        return _fail(f"--cluster: {source} has no GPU nodes")
    node_gpus = max(n.gpu_count for n in cluster.nodes)
    try:
        jobs = merged(
            read_trace(t, cluster_gpus=cluster.gpus, node_gpus=node_gpus, load=args.load)
            for t in args.trace
        )
    except TraceSourceError as err:
        return _fail(f"--trace: {err}")
    if args.limit > 0:
        jobs = jobs[: args.limit]
    try:
        model = JobTimeModel(
            {n.name: n for n in cluster.nodes},
            comm_share=shares,
            spine_oversubscription=args.spine_oversubscription,
        )
    except ValueError as err:
        return _fail(str(err))
    snapshot = ClusterSnapshot(
        NodeState(
            n,
            frozenset(range(n.gpu_count)) - cluster.used.get(n.name, frozenset()),
            cluster.labels.get(n.name, {}),
        )
        for n in cluster.nodes
    )
    print(
        f"gputopo simulate: {len(jobs)} jobs on {cluster.name} ({len(cluster.nodes)} nodes, "
        f"{cluster.gpus} GPUs), policies {', '.join(policies)}",
        file=sys.stderr,
    )
    options = ReplayOptions(backfill=args.backfill, backfill_window=args.backfill_window)
    summaries: list[dict[str, Any]] = []
    all_series: dict[str, dict[str, list[float]]] = {}
    jcts: dict[str, list[float]] = {}
    for policy in policies:
        engine = Engine(snapshot, policy, seed=args.seed)
        try:
            result = replay(jobs, engine, model, options=options, progress=stderr_progress)
        except InvariantError as err:
            print(f"gputopo simulate: invariant broken: {err}", file=sys.stderr)
            return 1
        summary = summarise(result)
        summaries.append(summary)
        all_series[policy] = series(result)
        jcts[policy] = [
            r.finish - r.arrival for r in result.records if r.started and math.isfinite(r.finish)
        ]
        print(
            f"gputopo simulate: {policy}: {summary['jobs']['ran']} ran, "
            f"{result.wall_seconds:.1f} s",
            file=sys.stderr,
        )
    plots: list[str] = []
    if args.plots:
        try:
            plots = [str(p) for p in write_plots(Path(args.plots), all_series, jcts)]
        except PlotsUnavailableError as err:
            return _fail(str(err))
        except OSError as err:
            return _fail(f"--plots: {err}")
    if args.json:
        data = {
            "cluster": {"source": cluster.name, "nodes": len(cluster.nodes), "gpus": cluster.gpus},
            "trace": {"sources": args.trace, "jobs": len(jobs), "load": args.load},
            "queue": {"backfill": args.backfill, "backfill_window": args.backfill_window},
            "job_time_model": {
                "comm_share": {c.value: s for c, s in shares.items()},
                "spine_oversubscription": args.spine_oversubscription,
                "bandwidth": {
                    k: {"gbps": f.gbps, "what": f.what, "source": f.source}
                    for k, f in BANDWIDTH.items()
                },
            },
            "policies": [{**s, "series": all_series[s["policy"]]} for s in summaries],
            "plots": plots,
        }
        json.dump(_clean(data), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(table(summaries))
        for path in plots:
            print(f"plot: {path}")
    return 0
