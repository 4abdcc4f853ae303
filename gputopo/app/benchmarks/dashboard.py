"""`gputopo bench dashboard`: does a dashboard polling the topology slow placement down?

A dashboard that GETs `/api/v1/topology` every few seconds once took Place p99 from 53 to 402 ms
at 500 nodes: the dump was built on the event loop Place is served from. This measures it.

What runs: an aggregator in its own process (`--nodes` DGX H100 nodes of the placement
scenarios, HTTP and gRPC on loopback ports), and in this process a placement client calling
Place (an 8-GPU reservation, released at once) `--rate` times a second, for `--phase` seconds
in each of three phases, one after the other on the same aggregator:

1. `quiet`: no dashboard (the baseline);
2. `dashboard_5s`: a dashboard GETs the whole topology (links included) every 5 s;
3. `dashboard_0_5s`: the same every 0.5 s, ten times harsher than the issue's case.

Figures (JSON with `--json`): per phase the Place latency p50/p99 (ms), calls, errors and
dashboard GETs made (and the median GET time); `p99_ratio_*` is each phase's p99 over the quiet
one (acceptance: within 1.5 for the 5 s dashboard). `first_get_ms` is the first dump after the
start, made before the phases: it encodes every node's topology, which later dumps reuse.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

HELP = "Place latency with and without a dashboard polling the topology"

PHASES = (("quiet", 0.0), ("dashboard_5s", 5.0), ("dashboard_0_5s", 0.5))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--nodes", type=int, default=500, help="nodes (default %(default)s)")
    parser.add_argument(
        "--rate", type=float, default=20.0, help="Place calls a second (default %(default)s)"
    )
    parser.add_argument(
        "--phase", type=float, default=30.0, help="seconds of each phase (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def _serve(conn: Connection, nodes: int) -> None:
    """The aggregator process: static nodes, ports sent back, serve until told to stop."""
    from aggregator.server import Aggregator, AggregatorConfig
    from gputopo.sim.scenarios import build_nodes

    async def main() -> None:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0))
        for topo in build_nodes("dgx-h100", nodes * 8)[:nodes]:  # DGX H100s, 32 to a leaf
            agg.state.add_static(topo)
        await agg.start()
        conn.send((agg.grpc_port, agg.http_port))
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await agg.stop(grace_s=0.5)

    asyncio.run(main())


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _phase(
    grpc_target: str, http_url: str, *, rate: float, seconds: float, poll_s: float
) -> dict[str, Any]:
    import aiohttp

    from gputopo.request import request_from_mapping
    from gputopo.runtime import grpcio
    from gputopo.runtime.placement_client import PlacementCallError, PlacementClient

    request = request_from_mapping(
        {"job": "bench", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]}
    )
    latencies: list[float] = []
    gets: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def dashboard(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            began = time.monotonic()
            async with session.get(f"{http_url}/api/v1/topology") as resp:
                await resp.read()
            gets.append(time.monotonic() - began)
            await asyncio.sleep(max(0.0, poll_s - (time.monotonic() - began)))

    async with grpcio.channel(grpc_target) as channel, aiohttp.ClientSession() as session:
        client = PlacementClient(channel)
        poller = asyncio.create_task(dashboard(session)) if poll_s else None
        interval = 1.0 / rate
        next_at = time.monotonic()
        while time.monotonic() < stop:
            began = time.monotonic()
            try:
                answer = await client.place(request, ttl_s=30)
                latencies.append(time.monotonic() - began)
                if answer.reservation is not None:
                    await client.release(answer.reservation.id)
            except PlacementCallError:
                errors += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if poller is not None:
            await poller
    return {
        "place_p50_ms": round(_percentile(latencies, 0.5) * 1e3, 2),
        "place_p99_ms": round(_percentile(latencies, 0.99) * 1e3, 2),
        "calls": len(latencies),
        "errors": errors,
        "dashboard_gets": len(gets),
        "dashboard_get_median_ms": round(statistics.median(gets) * 1e3, 1) if gets else None,
    }


async def _first_get(url: str) -> float:
    """The first dump after a start encodes every node (later ones reuse that): timed on its
    own, before the phases, as a dashboard that has been polling all along would have."""
    import aiohttp

    began = time.monotonic()
    async with aiohttp.ClientSession() as session, session.get(f"{url}/api/v1/topology") as r:
        await r.read()
    return round((time.monotonic() - began) * 1e3, 1)


def run(args: argparse.Namespace) -> int:
    """Run the three phases and print the figures."""
    from gputopo.app.progress import Progress

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child, args.nodes), daemon=True)
    server.start()
    figures: dict[str, Any] = {"nodes": args.nodes, "rate_per_s": args.rate, "phase_s": args.phase}
    try:
        if not parent.poll(300):
            print("gputopo bench dashboard: the aggregator did not start", file=sys.stderr)
            return 1
        grpc_port, http_port = parent.recv()
        target, url = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
        figures["first_get_ms"] = asyncio.run(_first_get(url))
        with Progress("bench dashboard", len(PHASES)) as progress:
            for name, poll_s in PHASES:
                progress.advance(0, f"{name} for {args.phase:g} s")
                figures[name] = asyncio.run(
                    _phase(target, url, rate=args.rate, seconds=args.phase, poll_s=poll_s)
                )
                progress.advance(1)
    finally:
        parent.send("stop")
        server.join(timeout=30)
    quiet = figures["quiet"]["place_p99_ms"]
    for name, _ in PHASES[1:]:
        figures[f"p99_ratio_{name}"] = round(figures[name]["place_p99_ms"] / quiet, 2)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, _ in PHASES:
            f = figures[name]
            print(
                f"{name:16} Place p50 {f['place_p50_ms']:7.2f} ms  p99 {f['place_p99_ms']:7.2f} ms"
                f"  ({f['calls']} calls, {f['errors']} errors, {f['dashboard_gets']} GETs)"
            )
        for name, _ in PHASES[1:]:
            print(f"p99 ratio {name}: {figures[f'p99_ratio_{name}']}")
    return 0
