"""Run the aggregator: gRPC (Reporter, Placement), HTTP and the Kubernetes writers in one loop.

`Aggregator.start()` binds the gRPC server (port 0 picks a free port; the bound port is
reported), the HTTP endpoints (`aggregator.http`) and the housekeeping task (expire
reservations, announce stale nodes, re-infer probe tiers). With a Kubernetes client every
replica watches the Node objects (`aggregator.nodewatch`: labels for node selectors, deleted
Nodes leave the state), and it runs the writers (the label publisher and, opt-in, the
scheduler objects) either at once or, with leader election, only while this replica holds the
Lease (`gputopo.runtime.leader`). The leader also labels its own Pod `gputopo.io/role=leader`
(when it knows its Pod), so a Service selecting that label routes exporters and placement
clients to the leader; a new leader then rebuilds its state from the streams that reconnect to
it and from the Node objects.

`stop()` shuts down gracefully: the lease is released (a successor takes over at once), the
writers stop, in-flight calls get a grace period. `stop(release_lease=False)` is what a crash
looks like to the other replicas, for tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import grpc
from prometheus_client import CollectorRegistry

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.choices import Mismatch
from aggregator.claimwatch import ClaimWatcher
from aggregator.fabric import FabricSources
from aggregator.http import HttpEndpoints
from aggregator.http_placement import add_placement_routes
from aggregator.ingest import DEFAULT_MAX_NODES, ReporterService
from aggregator.labels import desired_labels
from aggregator.metrics import AggregatorCollector, Sources
from aggregator.nodewatch import NodeWatcher
from aggregator.podwatch import PodWatcher
from aggregator.probes import ProbeCoordinator
from aggregator.promises import KubePromises
from aggregator.publisher import LabelPublisher, PublisherConfig, node_facts
from aggregator.roles import DEFAULT_EXPORTER_CLIENTS, RoleInterceptor, Roles
from aggregator.schedwriter import SchedulerObjectWriter
from aggregator.service import PlacementService
from aggregator.state import ClusterState
from aggregator.tokens import DEFAULT_AUDIENCE, TokenNodes
from gputopo.core import (
    DEFAULT_RESERVATION_TTL_S,
    DEFAULT_SEARCH_DEADLINE_S,
    MAX_RESERVATION_TTL_S,
    PlacementCore,
)
from gputopo.heartbeats import DEFAULT_MAX_HEARTBEATS_PER_SECOND
from gputopo.inventory import Inventory, inventory_labels, inventory_topologies, load_inventory
from gputopo.placement import intranode
from gputopo.reservations import INVENTORY_OWNER, Reservation, new_reservation_id
from gputopo.runtime import grpcio
from gputopo.runtime.heap import LongLivedHeap
from gputopo.runtime.kube import KubeClient, KubeError
from gputopo.runtime.leader import LeaderElector, LeaseConfig
from gputopo.runtime.supervisor import Supervisor
from gputopo.runtime.tls import TlsFiles, ssl_server_context
from gputopo.v1 import placement_pb2_grpc as pgrpc
from gputopo.v1 import reporter_pb2_grpc as rgrpc

__all__ = [
    "DEFAULT_EXTENDER_CLIENTS",
    "GRPC_SERVERS",
    "SERVER_OPTIONS",
    "Aggregator",
    "AggregatorConfig",
    "KubeOptions",
]

log = logging.getLogger(__name__)

LEADER_POD_LABEL = "gputopo.io/role"

# gRPC options of the aggregator's server, on top of `gputopo.runtime.grpcio.server`'s.
# After a restart or failover every exporter reconnects within seconds and sends its snapshot;
# the event loop takes new calls from Core one per loop turn, while the turns are busy decoding
# those snapshots. Core cancels a call that waited longer than 30 s (its default) to be taken,
# and the exporter then reconnects and sends its snapshot again: at 20,000 nodes 15,000 of the
# streams ended CANCELLED that way and the herd never settled. A call waits instead; keepalive
# still finds dead peers, and no maximum connection age ever cuts a report stream.
# While a call waits, Core keeps what its stream's HTTP/2 window let in. BDP probing grows that
# window toward the whole message (a waiting 11 MiB report held 5.8 MiB, a 453 KB one 0.58 MiB);
# without it the window stays at the lookahead, and a waiting stream costs about 0.2 MiB, TLS
# included, whatever it sends (scripts/bench_identities.py, README "Memory per node"). A call
# the handler reads gets its whole message still: Core opens the window for a pending read.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.server_max_unrequested_time_in_server", 600),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 64 * 1024),
)
# The name kube-scheduler's own client certificate carries: the extender's one legitimate caller.
DEFAULT_EXTENDER_CLIENTS = ("system:kube-scheduler",)
# How many gRPC servers share the port by default. grpc.aio takes one new call per server at a
# time (a completion-queue round trip: a few loop turns), so while the loop is busy with the
# nodes already connected, new ones are taken at tens per second per server. A server costs a
# listening socket and an accept task; past about 4 the loop's turns, not the servers, bound the
# rate (scripts/bench_accept.py, README "Scale").
GRPC_SERVERS = 4


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """What the aggregator does with Kubernetes (only with a client)."""

    publish_labels: bool = True
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
    scheduler_objects: tuple[str, ...] = ()
    lease: LeaseConfig | None = None  # None: no election, this replica writes
    identity: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    # Keep reservations as GpuReservation objects in this namespace (aggregator.promises);
    # "" keeps them in memory only, and a restart forgets them.
    reservations_namespace: str = ""


@dataclass(frozen=True, slots=True)
class AggregatorConfig:
    """Where and how the aggregator serves."""

    grpc_host: str = "127.0.0.1"
    grpc_port: int = 0
    # gRPC servers sharing the port (SO_REUSEPORT), each taking new calls on its own, the
    # servicers (one state) shared: grpc.aio takes a server's new calls one at a time, a few
    # event-loop turns each, so under load one server connects 20,000 exporters too slowly
    # (`GRPC_SERVERS`).
    grpc_servers: int = GRPC_SERVERS
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # None: no HTTP endpoints
    # A node silent this long, with no report stream and no Node object, is forgotten (0: never).
    ghost_ttl_s: float = 600.0
    # New nodes past this many are refused (RESOURCE_EXHAUSTED): state grows with the cluster.
    max_nodes: int = DEFAULT_MAX_NODES
    # A placement search or topology dump longer than this answers DEADLINE_EXCEEDED.
    search_deadline_s: float = DEFAULT_SEARCH_DEADLINE_S
    # Also /healthz and /readyz alone in plain text here (the kubelet's probes cannot present a
    # client certificate to the TLS port); None: not served.
    health_port: int | None = None
    stale_after_s: float = 30.0
    heartbeat_interval_s: float = 5.0
    # Lengthen the announced heartbeat interval so that live streams send at most this many
    # heartbeats a second, staleness following it (`gputopo.heartbeats`); 0: always the above.
    max_heartbeats_per_second: float = DEFAULT_MAX_HEARTBEATS_PER_SECOND
    reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S
    max_reservation_ttl_s: float = MAX_RESERVATION_TTL_S
    housekeeping_interval_s: float = 1.0
    default_policy: str | None = None
    inventory_path: str | None = None
    # Also serve the inventory's nodes as static ones (machine profile + `used` GPUs held):
    # a cluster simulated from an inventory file, no exporters needed.
    inventory_nodes: bool = False
    probe_interval_s: float = 60.0
    probe_inference_interval_s: float = 10.0
    kube: KubeOptions = field(default_factory=KubeOptions)
    # Mutual TLS on the gRPC and HTTP endpoints (`gputopo.runtime.tls`); None is plain text.
    tls: TlsFiles | None = None
    # Refuse reports from streams whose certificate names no node (system:node:NAME).
    require_node_identity: bool = False
    # Exporters may also prove their node with a projected ServiceAccount token of one of these
    # accounts (namespace:name) for this audience, checked by TokenReview (needs a Kubernetes
    # client; aggregator.tokens). Empty: certificates only.
    exporter_accounts: tuple[str, ...] = ()
    token_audience: str = DEFAULT_AUDIENCE
    # With TLS, the client certificate names the scheduler extender answers (kube-scheduler's).
    extender_clients: tuple[str, ...] = DEFAULT_EXTENDER_CLIENTS
    # With TLS, roles (aggregator.roles): exporters' certificate names (they Report only), the
    # names that may Place/Commit/Release/Explain (empty: any but a node agent's), operators.
    exporter_clients: tuple[str, ...] = DEFAULT_EXPORTER_CLIENTS
    placement_clients: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    # Freeze the objects that lived this long out of the garbage collector's walks, and collect
    # everything once per `heap_full_collection_s` (gputopo.runtime.heap); 0: Python's default.
    # Off here: the process decides its collector (`gputopo aggregator` turns it on; an
    # aggregator embedded in a test or benchmark process must not freeze that process's heap).
    heap_freeze_s: float = 0.0
    heap_full_collection_s: float = 3600.0


class Aggregator:
    """A running aggregator (see the module docstring)."""

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        clock: Callable[[], float] = time.time,
        kube: KubeClient | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.heap = LongLivedHeap(
            freeze_every_s=config.heap_freeze_s, full_every_s=config.heap_full_collection_s
        )
        inventory = load_inventory(config.inventory_path) if config.inventory_path else None
        self.state = ClusterState(
            clock=clock,
            stale_after_s=config.stale_after_s,
            sources=FabricSources(inventory=inventory),
        )
        if inventory is not None and config.inventory_nodes:
            self._add_inventory_nodes(inventory)
        self.probes = ProbeCoordinator(interval_s=config.probe_interval_s)
        self.state.subscribe(self._forget_silent_prober)
        self.reporter = ReporterService(
            self.state,
            heartbeat_interval_s=config.heartbeat_interval_s,
            stale_after_s=config.stale_after_s,
            max_heartbeats_per_second=config.max_heartbeats_per_second,
            probes=self.probes,
            wall_clock=clock,
            require_node_identity=config.require_node_identity,
            max_nodes=config.max_nodes,
            token_nodes=TokenNodes(
                kube, accounts=config.exporter_accounts, audience=config.token_audience
            )
            if kube is not None and config.exporter_accounts
            else None,
        )
        opts = config.kube
        self.promises = (
            KubePromises(kube, opts.reservations_namespace)
            if kube is not None and opts.reservations_namespace
            else None
        )
        # Place, Commit, Release, Explain: one core, whichever transport asks.
        self.placement = PlacementCore(
            state=self.state,
            clock=clock,
            store=self.promises,
            restored=self.promises is None,
            default_ttl_s=config.reservation_ttl_s,
            max_ttl_s=config.max_reservation_ttl_s,
            default_policy=config.default_policy,
            leading=lambda: self.leading,
            search_deadline_s=config.search_deadline_s,
        )
        self.service = PlacementService(self.placement, self.state, clock=clock)
        self.kube = kube
        # Node objects are read on every replica, leader or not, labels published or not.
        self.nodes = (
            NodeWatcher(self.state, kube, scheme=opts.publisher.scheme)
            if kube is not None
            else None
        )
        # So are bound pods: what someone else's pods hold is not free for placement.
        self.pods = PodWatcher(self.state, kube) if kube is not None else None
        self.claims = ClaimWatcher(self.state, kube) if kube is not None else None
        if kube is not None:  # a pod the kubelet gave other GPUs than recorded: say so on it
            self.state.choices.listeners.append(self._mismatch_event)
        self.publisher = (
            LabelPublisher(self.state, kube, self.nodes, opts.publisher, out=out)
            if kube is not None and self.nodes is not None and opts.publish_labels
            else None
        )
        self.scheduler_objects = (
            SchedulerObjectWriter(
                self.state, kube, kinds=opts.scheduler_objects, scheme=opts.publisher.scheme
            )
            if kube is not None and opts.scheduler_objects
            else None
        )
        self.elector = (
            LeaderElector(
                kube,
                opts.lease,
                identity=opts.identity or "aggregator",
                on_started=self._lead,
                on_stopped=self._follow,
            )
            if kube is not None and opts.lease is not None
            else None
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            AggregatorCollector(
                Sources(
                    state=self.state,
                    ingest=self.reporter.stats,
                    publisher=self.publisher,
                    elector=self.elector,
                    probes=self.probes,
                    placement=self.placement.stats,
                )
            )
        )
        self.roles = Roles.of(
            enforced=config.tls is not None,
            exporter_clients=config.exporter_clients,
            placement_clients=config.placement_clients,
            operators=config.operators,
        )
        self.http = HttpEndpoints(
            self.state,
            registry=self.registry,
            clock=clock,
            ready=lambda: bool(self._grpc),
            role=lambda: "leader" if self.leading else "follower",
            desired_labels=self._desired_labels,
            extra_routes=lambda app: add_placement_routes(
                app,
                self.service,
                extender_callers=frozenset(config.extender_clients) if config.tls else None,
                roles=self.roles,
                holder_of=self._holder_of,
            ),
            ssl_context=ssl_server_context(config.tls) if config.tls else None,
            off_loop=self.placement.off_loop,
        )
        self._grpc: list[grpc.aio.Server] = []  # sharing one port, or none before start
        # Root tasks: one that ends on its own ends the process (`gputopo aggregator`).
        self.tasks = Supervisor("aggregator")
        self._tasks: list[asyncio.Task[None]] = []
        self._events: set[asyncio.Task[None]] = set()  # Events being written
        self._writers: list[asyncio.Task[None]] = []
        self.grpc_port = 0
        self.http_port = 0
        self.health_port = 0

    def _add_inventory_nodes(self, inventory: Inventory) -> None:
        topologies, used = inventory_topologies(inventory)
        labels = inventory_labels(inventory, topologies)
        for topo in topologies:
            self.state.add_static(topo, labels=labels[topo.name])
        self.state.restore(
            Reservation(
                id=f"inventory-{new_reservation_id()}",
                gpus={node: gpus},
                expires_at=None,
                owner=INVENTORY_OWNER,
                job="inventory/used",
            )
            for node, gpus in used.items()
        )

    def _forget_silent_prober(self, event: ChangeEvent) -> None:
        """A node that went stale (or was removed) answers no probes: peers are no longer sent
        to it, until its next report names its probe address again."""
        if event.kind in (ChangeKind.STALE, ChangeKind.REMOVED):
            self.probes.forget(event.node)

    def _holder_of(self, reservation_id: str) -> str | None:
        """Who holds a reservation (for Explain's role check); None when there is none."""
        found = self.state.reservation(reservation_id)
        return None if found is None else found.holder

    @property
    def grpc_target(self) -> str:
        """host:port clients connect to."""
        return f"{self.config.grpc_host}:{self.grpc_port}"

    @property
    def leading(self) -> bool:
        """Whether this replica writes (always, without leader election)."""
        return self.elector is None or self.elector.is_leader

    def _desired_labels(self, name: str) -> dict[str, str] | None:
        facts = node_facts(self.state, name)
        return desired_labels(facts, self.config.kube.publisher.scheme) if facts else None

    def _mismatch_event(self, found: Mismatch) -> None:
        namespace, name = found.pod.split("/", 1)
        pod = {"kind": "Pod", "metadata": {"namespace": namespace, "name": name}}
        assert self.kube is not None
        event = self.kube.create_event(
            pod,
            reason="GpuChoiceMismatch",
            message=found.message,
            type_="Warning",
            component="gputopo-aggregator",
        )
        task = asyncio.create_task(event, name="mismatch-event")
        task.add_done_callback(_log_failure)
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def start(self) -> None:
        """Bind and serve; returns once the servers accept connections."""
        if self.config.grpc_servers < 1:
            raise ValueError(f"grpc_servers must be at least 1, not {self.config.grpc_servers}")
        roles = RoleInterceptor(self.roles, self._holder_of)
        servers = []
        for _ in range(self.config.grpc_servers):
            server = grpcio.server(
                options=SERVER_OPTIONS,
                interceptors=[roles],
                share_port=self.config.grpc_servers > 1,
            )
            rgrpc.add_ReporterServicer_to_server(self.reporter, server)
            pgrpc.add_PlacementServicer_to_server(self.service, server)
            servers.append(server)
        self.grpc_port = grpcio.bind_shared(
            servers, self.config.grpc_host, self.config.grpc_port, tls=self.config.tls
        )
        await asyncio.gather(*(server.start() for server in servers))
        self._grpc = servers
        if self.config.http_port is not None:
            try:
                self.http_port = await self.http.start(self.config.http_host, self.config.http_port)
                if self.config.health_port is not None:
                    port = self.config.health_port
                    self.health_port = await self.http.start_health(self.config.http_host, port)
            except OSError as err:  # the HTTP port is taken: stop the gRPC side, say which port
                await self.http.stop()
                await self._stop_grpc(0)
                address = f"{self.config.http_host}:{self.config.http_port}"
                if self.http_port:
                    address = f"{self.config.http_host}:{self.config.health_port} (health)"
                raise OSError(f"cannot listen on {address} for HTTP: {err.strerror}") from None
        self._tasks.append(self.tasks.spawn(self._housekeep(), name="housekeeping"))
        if self.heap.enabled:
            self._tasks.append(self.tasks.spawn(self.heap.run(), name="heap"))
        if self.nodes is not None:
            self._tasks.append(self.tasks.spawn(self.nodes.run(), name="node-watch"))
        if self.pods is not None:
            self._tasks.append(self.tasks.spawn(self.pods.run(), name="pod-watch"))
            if self.promises is None:  # durable mode waits in _restore
                self.placement.ready.clear()
                # Not a root task: it ends once the first list is in (the supervisor would take
                # a root task that returns for a death).
                self._tasks.append(asyncio.create_task(self._ready_after_pods(), name="pods-in"))
        if self.claims is not None:
            self._tasks.append(self.tasks.spawn(self.claims.run(), name="claim-watch"))
        if self.elector is not None:
            await self._unmark_pod()
            self._tasks.append(self.tasks.spawn(self.elector.run(), name="leader-election"))
        elif self.kube is not None:
            await self._lead()
        log.info(
            "aggregator serving gRPC on %s%s",
            self.grpc_target,
            f", HTTP on {self.config.http_host}:{self.http_port}" if self.http_port else "",
        )

    async def _lead(self) -> None:
        """Restore the promises, then start the writers (this replica leads, or there is no
        election)."""
        await self._restore()
        if self.publisher is not None:
            self._writers.append(self.tasks.spawn(self.publisher.run(), name="labels"))
        if self.scheduler_objects is not None:
            self._writers.append(
                self.tasks.spawn(self.scheduler_objects.run(), name="scheduler-objects")
            )
        await self._mark_pod(leader=True)

    async def _follow(self) -> None:
        """Stop the writers: another replica leads now (or we are shutting down)."""
        self.placement.demote()  # restored afresh should this replica lead again
        await self._drop_writers()
        await self._mark_pod(leader=False)

    async def _restore(self) -> None:
        """Make the book what the stored reservations say, then let reserving calls in.

        Retries until it succeeds: answering before would hand out GPUs already promised.
        """
        if self.promises is None:
            return
        settle = self.pods.synced.wait if self.pods is not None else None
        restored = await self.placement.restore(settle=settle)
        log.info("restored %d reservation(s) from the API server", restored)

    async def _ready_after_pods(self) -> None:
        """Reserve nothing until the pod watcher's first list is in: what bound pods hold is
        not free, even in the first moments after a start."""
        assert self.pods is not None
        await self.pods.synced.wait()
        self.placement.ready.set()

    async def _mark_pod(self, *, leader: bool) -> None:
        opts = self.config.kube
        if self.kube is None or self.elector is None or not opts.pod_name:
            return
        try:
            if leader:
                # A crashed leader's pod may still carry the label: take it off first.
                selector = f"{LEADER_POD_LABEL}=leader"
                for pod in await self.kube.pods_with_label(opts.pod_namespace, selector):
                    if pod != opts.pod_name:
                        await self.kube.set_pod_label(
                            opts.pod_namespace, pod, LEADER_POD_LABEL, None
                        )
            await self.kube.set_pod_label(
                opts.pod_namespace, opts.pod_name, LEADER_POD_LABEL, "leader" if leader else None
            )
        except KubeError as err:
            log.warning("could not label pod %s: %s", opts.pod_name, err)

    async def _unmark_pod(self) -> None:
        await self._mark_pod(leader=False)

    async def _housekeep(self) -> None:
        last_inference = self.clock()
        paced_stale_s = self.config.stale_after_s
        while True:
            await asyncio.sleep(self.config.housekeeping_interval_s)
            expired = self.state.expire()
            # The heartbeat interval follows the live streams, staleness the interval (set only
            # when pacing moves it: a threshold set on the state by hand stays until then).
            paced = self.reporter.pace()
            if paced != paced_stale_s:
                self.state.stale_after_s = paced_stale_s = paced
            flipped = self.state.check_stale()
            if intranode.pending_refinements():  # in-node answers the budget cut short
                await self.placement.off_loop(intranode.refine)
            if self.config.ghost_ttl_s > 0:
                ghosts = self.state.forget_ghosts(
                    ttl_s=self.config.ghost_ttl_s,
                    live=self.reporter.live_nodes,
                    has_object=self._has_node_object,
                )
                if ghosts:
                    self.reporter.stats.ghosts += len(ghosts)
                    log.warning(
                        "forgot %d node(s) silent for over %g s with no stream and no Node"
                        " object: %s",
                        len(ghosts),
                        self.config.ghost_ttl_s,
                        ", ".join(ghosts[:10]) + (" ..." if len(ghosts) > 10 else ""),
                    )
            if expired:
                log.info("expired %d reservation(s)", expired)
            await self.placement.sync()  # expired ones leave the API server too
            for node in flipped:
                log.warning(
                    "node %s is %s",
                    node,
                    "stale" if self.state.is_stale(node) else "reporting again",
                )
            if self.clock() - last_inference >= self.config.probe_inference_interval_s:
                last_inference = self.clock()
                self.refresh_probe_tiers()

    def _has_node_object(self, node: str) -> bool:
        """Whether a Kubernetes Node object of that name exists (False without a cluster)."""
        return self.nodes is not None and self.state.kube_labels(node) is not None

    def refresh_probe_tiers(self) -> list[str]:
        """Infer tiers from the probe results so far; returns the nodes whose topology moved."""
        changed = self.state.sources.set_probe_tiers(self.probes.refresh())
        return self.state.refresh_fabric(changed) if changed else []

    async def stop(self, *, grace_s: float = 2.0, release_lease: bool = True) -> None:
        """Stop serving: release the lease, stop the writers, let in-flight calls finish."""
        if self.elector is not None:
            if release_lease:
                await self.elector.release()
            else:
                self.elector.abandon()
        tasks, self._tasks = self._tasks, []
        await _cancel(tasks)
        if release_lease:
            await self._follow()
        else:
            await self._drop_writers()
        await self.http.stop()
        await self._stop_grpc(grace_s)
        self.placement.close()

    async def _stop_grpc(self, grace_s: float) -> None:
        """Stop every server sharing the port at once: all send GOAWAY together, and the
        grace period is one for all of them, not one after the other."""
        servers, self._grpc = self._grpc, []
        await asyncio.gather(*(server.stop(grace_s) for server in servers))

    async def _drop_writers(self) -> None:
        writers, self._writers = self._writers, []
        await _cancel(writers)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel tasks and wait until they are done (one that died was reported as it died)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not write an Event: %s", task.exception())
