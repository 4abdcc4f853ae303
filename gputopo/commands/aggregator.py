"""`gputopo aggregator`: run the aggregator until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse

HELP = "run the aggregator (Reporter and Placement gRPC, HTTP endpoints)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=50051,
        help="gRPC port, 0 for any free one (default %(default)s)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=8080,
        help="HTTP port for /healthz, /readyz, /api/v1, 0 for any free one (default %(default)s)",
    )
    parser.add_argument(
        "--stale-after",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a node that stops reporting this long is stale (default %(default)s)",
    )
    parser.add_argument(
        "--reservation-ttl",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="default reservation lifetime (default %(default)s)",
    )
    parser.add_argument("--policy", default=None, help="default placement policy (gputopo)")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; shut down gracefully."""
    import asyncio
    import signal
    import sys

    from aggregator.server import Aggregator, AggregatorConfig

    config = AggregatorConfig(
        grpc_host=args.host,
        grpc_port=args.grpc_port,
        http_host=args.host,
        http_port=args.http_port,
        stale_after_s=args.stale_after,
        reservation_ttl_s=args.reservation_ttl,
        default_policy=args.policy,
    )

    async def serve() -> None:
        agg = Aggregator(config)
        await agg.start()
        http = f", HTTP {config.http_host}:{agg.http_port}" if config.http_port is not None else ""
        print(f"aggregator: gRPC {agg.grpc_target}{http}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("aggregator: shutting down", file=sys.stderr, flush=True)
        await agg.stop(grace_s=5)

    asyncio.run(serve())
    return 0
