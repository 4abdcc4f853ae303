"""`gputopo scheduler`: the gang binder, leader-elected, until SIGINT/SIGTERM.

    gputopo scheduler (--kubeconfig K | --in-cluster) --aggregator HOST:PORT
                      [--scheduler-name gputopo]

Binds every pod that names `--scheduler-name` in `spec.schedulerName`, a whole group at a time,
where gputopo's Placement API put it (see `scheduler.binder`). Exit codes: 0 stopped, 2 bad input.
"""

from __future__ import annotations

import argparse
import os

HELP = "run the gang-binding scheduler: bind each pod group where gputopo placed it, or none"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    env = os.environ.get
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default $KUBECONFIG)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    parser.add_argument(
        "--aggregator",
        default=env("GPUTOPO_AGGREGATOR", ""),
        metavar="HOST:PORT",
        help="the aggregator's Placement gRPC address (env GPUTOPO_AGGREGATOR)",
    )
    parser.add_argument("--scheduler-name", default="gputopo", help="spec.schedulerName served")
    parser.add_argument(
        "--namespace",
        default=env("POD_NAMESPACE", "gputopo-system"),
        help="namespace of the leader Lease (env POD_NAMESPACE; default gputopo-system)",
    )
    parser.add_argument("--lease-name", default="gputopo-scheduler", help="the leader Lease")
    parser.add_argument("--no-leader-election", action="store_true", help="bind without a Lease")
    parser.add_argument(
        "--identity", default=env("POD_NAME", ""), help="holder name (env POD_NAME; else hostname)"
    )
    parser.add_argument(
        "--reservation-ttl", type=float, default=30.0, metavar="SECONDS", help="default 30"
    )
    parser.add_argument(
        "--undo-grace",
        type=int,
        default=None,
        metavar="SECONDS",
        help="grace period of pods deleted by an undo (default: the pod's own)",
    )
    parser.add_argument(  # tests only: widens the windows a kill -9 test must hit
        "--step-pause", type=float, default=0.0, help=argparse.SUPPRESS
    )
    parser.add_argument("--http-host", default="0.0.0.0", help="address for /metrics, /healthz")
    parser.add_argument("--http-port", type=int, default=9404, help="0 for any free port")
    from gputopo.runtime.tls import add_health_port_flag, add_tls_flags

    add_tls_flags(parser, client=True)
    add_health_port_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    import asyncio
    import contextlib
    import signal
    import socket
    import sys

    from gputopo.runtime.kube import KubeClient, KubeError
    from gputopo.runtime.leader import LeaseConfig
    from gputopo.runtime.supervisor import RootTaskDiedError
    from scheduler.binder import BinderConfig
    from scheduler.preflight import missing
    from scheduler.server import SchedulerProcess, SchedulerProcessConfig

    if not args.aggregator:
        print("gputopo scheduler: --aggregator: required (HOST:PORT)", file=sys.stderr)
        return 2
    if args.reservation_ttl <= 0:
        print("gputopo scheduler: --reservation-ttl: must be > 0", file=sys.stderr)
        return 2
    from gputopo.runtime.tls import TlsUsageError, tls_from_args

    try:
        tls = tls_from_args(args, component="scheduler", dials=True)
    except TlsUsageError as err:
        print(f"gputopo scheduler: {err}", file=sys.stderr)
        return 2
    try:
        kube = (
            # 16 calls in flight: binds and Events of several gangs overlap (4 capped the
            # binder at about half of kube-scheduler's pods a second).
            KubeClient.in_cluster(workers=16)
            if args.in_cluster
            else KubeClient.from_kubeconfig(args.kubeconfig, workers=16)
        )
    except KubeError as err:
        print(
            f"gputopo scheduler: {'--in-cluster' if args.in_cluster else '--kubeconfig'}: {err}",
            file=sys.stderr,
        )
        return 2
    identity = args.identity or socket.gethostname()
    config = SchedulerProcessConfig(
        aggregator=args.aggregator,
        binder=BinderConfig(
            scheduler_name=args.scheduler_name,
            reservation_ttl_s=args.reservation_ttl,
            undo_grace_s=args.undo_grace,
            step_pause_s=args.step_pause,
        ),
        lease=None
        if args.no_leader_election
        else LeaseConfig(namespace=args.namespace, name=args.lease_name),
        identity=identity,
        http_host=args.http_host,
        http_port=args.http_port,
        tls=tls,
        tls_check_s=args.tls_check_interval,
        health_port=args.health_port,
    )

    async def main() -> int:
        # Namespace and RBAC first: without them every call would fail, warned every 2 s.
        problem = await missing(
            kube,
            namespace=args.namespace,
            leader_election=not args.no_leader_election,
            lease_name=args.lease_name,
        )
        if problem is not None:
            print(f"gputopo scheduler: {problem}", file=sys.stderr)
            return 2
        process = SchedulerProcess(config, kube)
        task = asyncio.create_task(process.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return 0

    try:
        return asyncio.run(main())
    except RootTaskDiedError as err:  # the binder died: exit non-zero, the Lease is released
        print(f"gputopo {err}", file=sys.stderr)
        return 1
    finally:
        kube.close()
