"""The `gputopo` command line.

Subcommands import their modules lazily, so `gputopo --help` is fast and a subcommand only
loads what it needs. Exit codes: 0 success, 1 the work failed (e.g. a request was not placed),
2 bad usage or input (argparse's convention).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _demo(args: argparse.Namespace) -> int:
    from gputopo.demo import main as demo_main

    return demo_main(as_json=args.json)


def _aggregator(args: argparse.Namespace) -> int:
    import asyncio
    import signal

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
        print(
            f"aggregator: gRPC {agg.grpc_target}"
            + (
                f", HTTP {config.http_host}:{agg.http_port}" if config.http_port is not None else ""
            ),
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("aggregator: shutting down", file=sys.stderr, flush=True)
        await agg.stop(grace_s=5)

    asyncio.run(serve())
    return 0


def _machines(args: argparse.Namespace) -> int:
    from gputopo.machines import describe_profiles

    for profile in describe_profiles():
        print(profile.line())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputopo", description="GPU topology made schedulable on Kubernetes."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="run a local demo cluster with simulated GPU nodes")
    demo.add_argument("--json", action="store_true", help="print the results as JSON")
    demo.set_defaults(handler=_demo)

    agg = sub.add_parser("aggregator", help="run the aggregator (gRPC + HTTP)")
    agg.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    agg.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0: any free one)")
    agg.add_argument(
        "--http-port",
        type=int,
        default=8080,
        help="HTTP port for /healthz, /readyz, /api/v1 (0: any free one)",
    )
    agg.add_argument(
        "--stale-after",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a node that stops reporting this long is stale (default %(default)s)",
    )
    agg.add_argument(
        "--reservation-ttl",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="default reservation lifetime (default %(default)s)",
    )
    agg.add_argument("--policy", default=None, help="default placement policy (default: gputopo)")
    agg.set_defaults(handler=_aggregator)

    machines = sub.add_parser("machines", help="list the machine profiles built from recordings")
    machines.set_defaults(handler=_machines)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    if args.command == "aggregator":
        level = min(level, logging.INFO)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gputopo demo --json | head`): stop quietly, like other CLIs.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
