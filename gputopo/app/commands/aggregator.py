"""`gputopo aggregator`: run the aggregator until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from gputopo.heartbeats import DEFAULT_MAX_HEARTBEATS_PER_SECOND, MAX_INTERVAL_S

if TYPE_CHECKING:
    from aggregator.labels import LabelScheme

HELP = "run the aggregator (Reporter and Placement gRPC, HTTP endpoints)"

LABEL_PROFILES = ("topograph-v1", "topograph-v0", "own")  # aggregator.labels.Profile
CLUSTER_OPTIONS = "--kubeconfig PATH or --in-cluster"


def add_label_arguments(parser: argparse._ActionsContainer, *, profile_help: str) -> None:
    """`--label-profile` and `--label-prefix`: the label keys this command writes, and the
    keys `gputopo export`'s objects name (which must be the same ones)."""
    parser.add_argument(
        "--label-profile",
        choices=LABEL_PROFILES,
        default="topograph-v1",
        help=profile_help,
    )
    parser.add_argument(
        "--label-prefix", default="gputopo.io/", help="prefix of the project's own label keys"
    )


def label_scheme(args: argparse.Namespace) -> LabelScheme:
    """The label scheme the options of `add_label_arguments` chose."""
    from aggregator.labels import LabelScheme

    return LabelScheme(profile=args.label_profile, prefix=args.label_prefix)


# The shipped Lease timing: client-go's 15/10/2 s made a follower lead 17 s after the leader
# died. 5 s is what a follower waits, the leader gives up after 3 s without a renewal (so it
# stops writing well before another may start), and both try every second: a Lease write per
# second per replica, which the API server does not notice.
LEASE_DURATION_S = 5.0
RENEW_DEADLINE_S = 3.0
RETRY_PERIOD_S = 1.0


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
        "--grpc-servers",
        type=int,
        default=4,
        metavar="N",
        help="gRPC servers sharing the port, each taking new calls on its own: a herd of"
        " reconnecting exporters is taken N at a time (default %(default)s)",
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
        help="a node that stops reporting this long is stale, with heartbeats every 5 s; paced"
        " heartbeats stretch it by as much (default %(default)s)",
    )
    parser.add_argument(
        "--max-heartbeats-per-second",
        type=float,
        # a string from the environment is converted (and refused, naming the option) by argparse
        default=os.environ.get("GPUTOPO_MAX_HEARTBEATS_PER_SECOND")
        or DEFAULT_MAX_HEARTBEATS_PER_SECOND,
        metavar="N",
        help="lengthen the heartbeat interval announced to exporters (5 s, whole seconds, at most"
        f" {MAX_INTERVAL_S:g} s) so that all streams together send at most N heartbeats a second;"
        " 0: always 5 s (env GPUTOPO_MAX_HEARTBEATS_PER_SECOND; default %(default)s)",
    )
    parser.add_argument(
        "--heap-freeze",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="move objects that lived this long out of the garbage collector's walks, 0 for"
        " Python's default collector (default %(default)s)",
    )
    parser.add_argument(
        "--heap-full-collection",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="with --heap-freeze, collect the whole heap this often (default %(default)s)",
    )
    parser.add_argument(
        "--reservation-ttl",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="default reservation lifetime (default %(default)s)",
    )
    parser.add_argument(
        "--max-reservation-ttl",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="longest reservation lifetime a Place may ask for (default %(default)s)",
    )
    parser.add_argument("--policy", default=None, help="default placement policy (gputopo)")
    parser.add_argument(
        "--inventory",
        metavar="FILE",
        help="static inventory (topograph's model YAML): the highest-precedence fabric source",
    )
    parser.add_argument(
        "--inventory-nodes",
        action="store_true",
        help="also serve the inventory's nodes from their machine profiles (a simulated cluster)",
    )
    from gputopo.runtime.tls import add_health_port_flag, add_tls_flags

    add_tls_flags(parser)
    add_health_port_flag(parser)
    parser.add_argument(
        "--extender-client",
        action="append",
        default=None,
        metavar="NAME",
        help="with TLS: a client certificate name the scheduler extender answers (repeatable;"
        " default system:kube-scheduler); every other caller gets 403",
    )
    parser.add_argument(
        "--exporter-client",
        action="append",
        default=None,
        metavar="NAME",
        help="with TLS: the exporters' client certificate name (or group:ORG, every certificate"
        " with O=ORG); it may Report and nothing else (repeatable; default gputopo-exporter;"
        " system:node:NAME certificates likewise)",
    )
    parser.add_argument(
        "--placement-client",
        action="append",
        default=None,
        metavar="NAME",
        help="with TLS: a certificate name (or group:ORG, every certificate with O=ORG) that may"
        " Place, Commit, Release and Explain its own reservations (repeatable; default: any"
        " certificate but a node agent's)",
    )
    parser.add_argument(
        "--operator",
        action="append",
        default=None,
        metavar="NAME",
        help="with TLS: a certificate name (or group:ORG) that may call everything and Explain"
        " any reservation",
    )
    parser.add_argument(
        "--ghost-ttl",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="forget a node silent this long that has no report stream and no Node object"
        " (default %(default)s; 0 never)",
    )
    parser.add_argument(
        "--max-nodes",
        type=int,
        default=50_000,
        help="refuse reports for new nodes past this many (default %(default)s)",
    )
    parser.add_argument(
        "--search-deadline",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="a placement search or topology dump running longer answers DEADLINE_EXCEEDED"
        " (default %(default)s)",
    )
    parser.add_argument(
        "--exporter-account",
        action="append",
        default=None,
        metavar="NAMESPACE:NAME",
        help="with a cluster: exporters of this ServiceAccount may prove their node with a"
        " projected token (repeatable; default gputopo-exporter:gputopo-exporter)",
    )
    parser.add_argument(
        "--token-audience",
        default="gputopo-aggregator",
        help="the audience exporters' identity tokens must be for (default %(default)s)",
    )
    parser.add_argument(
        "--anonymous-exporters",
        action="store_true",
        help="with TLS: also apply reports from exporters that prove no node (default: only a"
        " certificate of CN system:node:NAME, or a token of a pod on NAME, may report NAME)",
    )
    kube = parser.add_argument_group("Kubernetes (labels, scheduler objects, leader election)")
    kube.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="talk to this cluster (default: none; see --in-cluster)",
    )
    kube.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    kube.add_argument(
        "--no-labels",
        action="store_true",
        help="do not publish node labels (Node objects are still read, on every replica)",
    )
    kube.add_argument(
        "--dry-run",
        action="store_true",
        help=f"print the label patches instead of sending them (needs {CLUSTER_OPTIONS})",
    )
    add_label_arguments(kube, profile_help="which label keys to write (default %(default)s)")
    kube.add_argument(
        "--label-qps",
        type=float,
        default=10.0,
        help="client-side limit on label patches per second (default %(default)s)",
    )
    kube.add_argument(
        "--label-burst",
        type=int,
        default=20,
        help="patches allowed in a burst (default %(default)s)",
    )
    kube.add_argument(
        "--scheduler-objects",
        default="",
        metavar="KINDS",
        help=(
            "also write scheduler objects: comma-separated kueue,kai,volcano (default none; "
            f"needs {CLUSTER_OPTIONS})"
        ),
    )
    kube.add_argument(
        "--leader-elect",
        action="store_true",
        help=f"one of several replicas: only the Lease holder writes (needs {CLUSTER_OPTIONS})",
    )
    kube.add_argument(
        "--lease-name", default="gputopo-aggregator", help="Lease name (default %(default)s)"
    )
    kube.add_argument(
        "--lease-duration",
        type=float,
        default=LEASE_DURATION_S,
        metavar="S",
        help="seconds a follower waits on an unrenewed Lease before taking it (default"
        " %(default)s: a Place succeeds within about 10 s of the leader's kill -9)",
    )
    kube.add_argument(
        "--renew-deadline",
        type=float,
        default=RENEW_DEADLINE_S,
        metavar="S",
        help="seconds the leader keeps leading without a successful renewal (default %(default)s)",
    )
    kube.add_argument(
        "--retry-period",
        type=float,
        default=RETRY_PERIOD_S,
        metavar="S",
        help="seconds between attempts to take or renew the Lease (default %(default)s)",
    )
    kube.add_argument(
        "--lease-namespace",
        default="",
        help="Lease namespace (default: $POD_NAMESPACE, else default)",
    )
    kube.add_argument(
        "--reservations-namespace",
        default="",
        metavar="NAMESPACE",
        help="keep reservations as GpuReservation objects here, so a restart or failover loses"
        " none (needs the CRD in deploy/aggregator); default: in memory only",
    )


def options_without_a_cluster(args: argparse.Namespace) -> list[str]:
    """The options given that act only on a cluster, when no cluster is given.

    Without `--kubeconfig` or `--in-cluster` the aggregator has no Kubernetes client, so these
    would be accepted and then do nothing at all; refusing them says so before anything starts.
    """
    if args.kubeconfig or args.in_cluster:
        return []
    given = {
        "--dry-run": args.dry_run,
        "--scheduler-objects": bool(args.scheduler_objects),
        "--leader-elect": args.leader_elect,
    }
    return [option for option, on in given.items() if on]


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; shut down gracefully."""
    import asyncio
    import signal
    import socket
    import sys

    if idle := options_without_a_cluster(args):
        print(
            f"gputopo aggregator: {', '.join(idle)} act only on a Kubernetes cluster, and none "
            f"is given: add {CLUSTER_OPTIONS} (without one nothing is labelled, written or "
            "elected)",
            file=sys.stderr,
        )
        return 2

    from aggregator.publisher import PublisherConfig
    from aggregator.roles import DEFAULT_EXPORTER_CLIENTS
    from aggregator.server import (
        DEFAULT_EXTENDER_CLIENTS,
        Aggregator,
        AggregatorConfig,
        KubeOptions,
    )
    from gputopo.inventory import InventoryError
    from gputopo.runtime.kube import KubeClient, KubeError
    from gputopo.runtime.leader import LeaseConfig
    from gputopo.runtime.supervisor import RootTaskDiedError

    if args.leader_elect and not 0 < args.retry_period < args.renew_deadline < args.lease_duration:
        print(
            "gputopo aggregator: --retry-period, --renew-deadline, --lease-duration: need"
            f" 0 < {args.retry_period:g} < {args.renew_deadline:g} < {args.lease_duration:g}",
            file=sys.stderr,
        )
        return 2
    pod_namespace = os.environ.get("POD_NAMESPACE", "")
    pod_name = os.environ.get("POD_NAME", "")
    kinds = tuple(k for k in args.scheduler_objects.split(",") if k)
    kube_options = KubeOptions(
        publish_labels=not args.no_labels,
        publisher=PublisherConfig(
            scheme=label_scheme(args),
            qps=args.label_qps,
            burst=args.label_burst,
            dry_run=args.dry_run,
        ),
        scheduler_objects=kinds,
        lease=LeaseConfig(
            namespace=args.lease_namespace or pod_namespace or "default",
            name=args.lease_name,
            lease_duration_s=args.lease_duration,
            renew_deadline_s=args.renew_deadline,
            retry_period_s=args.retry_period,
        )
        if args.leader_elect
        else None,
        identity=pod_name or socket.gethostname(),
        pod_name=pod_name,
        pod_namespace=pod_namespace,
        reservations_namespace=args.reservations_namespace,
    )
    from gputopo.runtime.tls import TlsUsageError, tls_from_args, warn_plaintext

    try:
        tls = tls_from_args(args, component="aggregator", warn=False)
    except TlsUsageError as err:
        print(f"gputopo aggregator: {err}", file=sys.stderr)
        return 2
    from gputopo.core import ttl_limits_problem

    if (problem := ttl_limits_problem(args.reservation_ttl, args.max_reservation_ttl)) is not None:
        print(f"gputopo aggregator: {problem}", file=sys.stderr)
        return 2
    from gputopo.runtime.heap import heap_problem

    if (problem := heap_problem(args.heap_freeze, args.heap_full_collection)) is not None:
        print(f"gputopo aggregator: {problem}", file=sys.stderr)
        return 2
    if not args.max_heartbeats_per_second >= 0:
        print(
            "gputopo aggregator: --max-heartbeats-per-second must be at least 0 (0: no pacing),"
            f" not {args.max_heartbeats_per_second}",
            file=sys.stderr,
        )
        return 2
    if args.grpc_servers < 1:
        print(
            f"gputopo aggregator: --grpc-servers must be at least 1, not {args.grpc_servers}",
            file=sys.stderr,
        )
        return 2
    config = AggregatorConfig(
        heap_freeze_s=args.heap_freeze,
        heap_full_collection_s=args.heap_full_collection,
        tls=tls,
        require_node_identity=tls is not None and not args.anonymous_exporters,
        extender_clients=tuple(args.extender_client or DEFAULT_EXTENDER_CLIENTS),
        exporter_clients=tuple(args.exporter_client or DEFAULT_EXPORTER_CLIENTS),
        placement_clients=tuple(args.placement_client or ()),
        operators=tuple(args.operator or ()),
        exporter_accounts=tuple(args.exporter_account or ("gputopo-exporter:gputopo-exporter",)),
        token_audience=args.token_audience,
        health_port=args.health_port,
        search_deadline_s=args.search_deadline,
        ghost_ttl_s=args.ghost_ttl,
        max_nodes=args.max_nodes,
        grpc_host=args.host,
        grpc_port=args.grpc_port,
        grpc_servers=args.grpc_servers,
        http_host=args.host,
        http_port=args.http_port,
        stale_after_s=args.stale_after,
        max_heartbeats_per_second=args.max_heartbeats_per_second,
        reservation_ttl_s=args.reservation_ttl,
        max_reservation_ttl_s=args.max_reservation_ttl,
        default_policy=args.policy,
        inventory_path=args.inventory,
        inventory_nodes=args.inventory_nodes,
        kube=kube_options,
    )
    kube: KubeClient | None = None
    try:
        if args.in_cluster:
            kube = KubeClient.in_cluster()
        elif args.kubeconfig:
            kube = KubeClient.from_kubeconfig(args.kubeconfig)
    except KubeError as err:
        print(f"gputopo aggregator: {err}", file=sys.stderr)
        return 2

    async def serve() -> None:
        agg = Aggregator(config, kube=kube, out=sys.stdout)
        await agg.start()  # reads the inventory: a bad file is the one line an operator sees
        if tls is None:
            warn_plaintext("aggregator")
        http = f", HTTP {config.http_host}:{agg.http_port}" if config.http_port is not None else ""
        print(f"aggregator: gRPC {agg.grpc_target}{http}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await agg.tasks.wait(stop)  # a root task that dies ends the process, non-zero
        finally:
            print("aggregator: shutting down", file=sys.stderr, flush=True)
            await agg.stop(grace_s=5)  # releases the Lease: a successor takes over at once

    try:
        asyncio.run(serve())
    except (OSError, InventoryError) as err:
        print(f"gputopo aggregator: {err}", file=sys.stderr)
        return 2
    except RootTaskDiedError as err:
        print(f"gputopo {err}", file=sys.stderr)
        return 1
    finally:
        if kube is not None:
            kube.close()
    return 0
