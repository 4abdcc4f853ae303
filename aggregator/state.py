"""The aggregator's one mutable cluster state, composed of four parts with one job each.

Everything that changes the cluster goes through `ClusterState` (one asyncio loop owns it, so its
methods need no locks), and placement reads immutable `ClusterSnapshot`s it hands out. The
parts, each reporting what it moved through its `on_change`:

1. `NodeBook` (`aggregator.nodebook`): the reported nodes, their (incarnation, sequence) order,
   staleness, Kubernetes labels, the merged fabric position, and the check of a delta against
   its base. A node that has not reported for `stale_after_s` is stale: kept for display, not
   placeable.
2. `ReservationBook` (`gputopo.reservations`): gputopo's own promises (the placement core keeps
   them in a store).
3. `Occupancy` (`aggregator.occupancy`): everything else that holds GPUs (pods bound by anyone,
   the kubelet's exact report, DRA claims) and the precedence between them. A node's free GPUs
   are the book's, less what occupancy holds.
4. `SnapshotCache` (`aggregator.snapshots`): a snapshot is rebuilt only when something changed
   since the last one (`generation` moved), and derived in O(changes) when only allocations did.

Every change lands in one place (`_changed`): it moves `generation`, tells the snapshot cache,
updates the per-domain GPU counts (`index`, `aggregator.indexes`, for the label publisher,
metrics and `/api/v1`; placement keeps reading snapshots) and calls the subscribers. The index
is touched only when what it counts moved: a delta that changes a link measurement leaves a
node's domains, GPU count and free GPUs alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from typing import Any

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.choices import ChoiceChecker
from aggregator.claims import ClaimedDevice
from aggregator.fabric import FabricSources
from aggregator.indexes import DomainIndex
from aggregator.nodebook import NodeBook, NodeRecord, ReportOutcome
from aggregator.occupancy import Occupancy
from aggregator.snapshots import SnapshotCache
from gputopo.cluster import ClusterSnapshot
from gputopo.delta import NodeDelta
from gputopo.gpu_use import GpuUse
from gputopo.placement.result import PlacementResult
from gputopo.reservations import Reservation, ReservationBook
from gputopo.topology import FabricPosition, Gpu, NodeTopology

__all__ = [
    "ClusterState",
    "NodeRecord",
    "ReportOutcome",
]

# What the domain index counts of a node besides its free GPUs, which only allocations move:
# the GPUs (their count, and the uuids claims are located by), the merged fabric position, the
# labels, and whether it is placeable. The same inputs give the same entry.
_IndexKey = tuple[tuple[Gpu, ...], FabricPosition, dict[str, str], bool]


class ClusterState:
    """The mutable cluster (see the module docstring). `clock` returns unix seconds."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        stale_after_s: float = 30.0,
        sources: FabricSources | None = None,
    ) -> None:
        self._clock = clock
        self.index = DomainIndex()
        self._indexed: dict[str, _IndexKey] = {}
        self.nodes = NodeBook(
            clock=clock, stale_after_s=stale_after_s, sources=sources, on_change=self._changed
        )
        # What holds GPUs: gputopo's promises (the book), and everything else (pods bound by
        # anyone, the kubelet's exact report, DRA claims: `aggregator.occupancy`, which owns
        # their precedence). Both report the nodes whose free GPUs moved.
        self.book = ReservationBook(clock=clock, on_change=self._allocations_moved)
        self.occupancy = Occupancy(on_change=self._occupancy_moved)
        self.snapshots = SnapshotCache(clock=clock)
        # Trust, but verify: the kubelet's exact report against gputopo's records.
        self.choices = ChoiceChecker()
        self.generation = 0
        self._listeners: list[Callable[[ChangeEvent], None]] = []

    @property
    def stale_after_s(self) -> float:
        """Seconds of silence after which an exporter's node is stale (the node book's)."""
        return self.nodes.stale_after_s

    @stale_after_s.setter
    def stale_after_s(self, seconds: float) -> None:
        self.nodes.stale_after_s = seconds

    @property
    def sources(self) -> FabricSources:
        """The fabric sources besides the nodes' own reports (the node book's)."""
        return self.nodes.sources

    # --- observers ------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[ChangeEvent], None]) -> Callable[[], None]:
        """Call `listener(event)` on every change (`ChangeKind` says which); returns an
        unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _changed(self, kind: ChangeKind, node: str) -> None:
        """The one sink of every part's `on_change`."""
        self.generation += 1
        self.snapshots.note(kind, node)
        self._reindex(kind, node)
        event = ChangeEvent(kind, node, self.generation)
        for listener in list(self._listeners):
            listener(event)

    def _reindex(self, kind: ChangeKind, node: str) -> None:
        rec = self.nodes.record(node)
        if rec is None:
            self.index.remove(node)
            self._indexed.pop(node, None)
            return
        topo = rec.topology
        placeable = topo.gpu_count > 0 and node not in self.nodes.known_stale
        key = (topo.gpus, topo.fabric, rec.labels, placeable)
        if kind is not ChangeKind.ALLOCATION and self._indexed.get(node) == key:
            return  # free GPUs move only with allocations, or with the GPUs themselves
        self._indexed[node] = key
        self.index.update(
            topo, free=len(self.free_gpus(node)), placeable=placeable, labels=rec.labels
        )

    # --- the node book's (reports, labels, staleness, fabric) -------------------------------

    def refresh_fabric(self, nodes: Iterable[str] | None = None) -> list[str]:
        """Merge the fabric sources again (after an inventory load or new probe inference);
        returns the nodes whose topology changed (`NodeBook.refresh_fabric`)."""
        return self.nodes.refresh_fabric(nodes)

    def apply_snapshot(
        self, topology: NodeTopology, *, incarnation: int, sequence: int
    ) -> ReportOutcome:
        """Replace a node's topology with a full snapshot, unless a newer report was accepted."""
        return self.nodes.apply_snapshot(topology, incarnation=incarnation, sequence=sequence)

    def yield_to(self, node: str, incarnation: int) -> None:
        """A new stream with an older incarnation now holds the node (`NodeBook.yield_to`)."""
        self.nodes.yield_to(node, incarnation)

    def apply_delta(
        self,
        node: str,
        delta: NodeDelta,
        *,
        incarnation: int,
        sequence: int,
        wire_bytes: int | None = None,
    ) -> ReportOutcome:
        """Apply a delta on top of the node's snapshot of the same incarnation, or raise
        `DeltaError` before anything changes (the contract: `NodeBook.apply_delta`)."""
        return self.nodes.apply_delta(
            node, delta, incarnation=incarnation, sequence=sequence, wire_bytes=wire_bytes
        )

    def heartbeat(self, node: str, *, incarnation: int, sequence: int) -> ReportOutcome:
        """Note that a node is alive."""
        return self.nodes.heartbeat(node, incarnation=incarnation, sequence=sequence)

    def set_labels(
        self, node: str, labels: Mapping[str, str], *, owned: frozenset[str] = frozenset()
    ) -> None:
        """Record the Kubernetes labels of a node and which of them this aggregator owns.

        All labels serve node selectors; those not owned are also a fabric source.
        """
        self.nodes.set_labels(node, labels, owned=owned)

    def forget_labels(self, node: str) -> None:
        """The Node object is gone: its labels no longer say anything."""
        self.nodes.forget_labels(node)

    def kube_labels(self, node: str) -> tuple[Mapping[str, str], frozenset[str]] | None:
        """A Node object's labels and the keys we own, as last seen; None if never seen."""
        return self.nodes.kube_labels(node)

    def add_static(
        self, topology: NodeTopology, *, labels: Mapping[str, str] | None = None
    ) -> None:
        """A node known without an exporter (from an inventory): never stale."""
        self.nodes.add_static(topology, labels=labels)

    def remove_node(self, node: str) -> bool:
        """Forget a node (deleted from the cluster)."""
        return self.nodes.remove_node(node)

    def forget_ghosts(
        self, *, ttl_s: float, live: Set[str], has_object: Callable[[str], bool]
    ) -> list[str]:
        """Forget silent exporter nodes with no live stream and no Node object; returns them
        (`NodeBook.forget_ghosts`)."""
        return self.nodes.forget_ghosts(ttl_s=ttl_s, live=live, has_object=has_object)

    def node_deleted(self, node: str) -> None:
        """The node's Node object was deleted: forget its labels and the node, and ignore its
        exporter's current incarnation (`NodeBook.node_deleted`)."""
        self.nodes.node_deleted(node)

    def set_probe_address(self, node: str, address: str) -> None:
        """Where a node answers network probes (from its reports)."""
        self.nodes.set_probe_address(node, address)

    def record(self, node: str) -> NodeRecord | None:
        """The record of a node, if known."""
        return self.nodes.record(node)

    @property
    def node_names(self) -> list[str]:
        """Known nodes, sorted."""
        return self.nodes.node_names

    @property
    def node_count(self) -> int:
        """How many nodes are known."""
        return self.nodes.node_count

    def is_stale(self, node: str) -> bool:
        """Whether a known node stopped reporting."""
        return self.nodes.is_stale(node)

    def stale_nodes(self) -> list[str]:
        """Nodes that stopped reporting."""
        return self.nodes.stale_nodes()

    def check_stale(self) -> list[str]:
        """Announce nodes that went stale (or came back) since the last check; returns them."""
        return self.nodes.check_stale()

    # --- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """An immutable view of now: free = not held by any live reservation, stale excluded."""
        self.expire()
        return self._snapshot_from(self.snapshots)

    def rebuilt_snapshot(self) -> ClusterSnapshot:
        """A snapshot of now built from scratch, past the cache: what `snapshot` must equal."""
        return self._snapshot_from(SnapshotCache(clock=self._clock))

    def _snapshot_from(self, cache: SnapshotCache) -> ClusterSnapshot:
        return cache.snapshot(
            generation=self.generation,
            stale=frozenset(self.nodes.stale_nodes()),
            records=self.nodes.records(),
            free=self.free_gpus,
        )

    # --- reservations (the book's; the state announces what they move) --------------------

    def _allocations_moved(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._changed(ChangeKind.ALLOCATION, node)

    def _occupancy_moved(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            if self.nodes.record(node) is not None:
                self._changed(ChangeKind.ALLOCATION, node)

    def _live(self, rid: str) -> bool:
        return self.book.reservation(rid) is not None

    def free_gpus(self, node: str) -> frozenset[int]:
        """GPUs of a node that no live reservation and nothing else holds (empty for an unknown
        node): the book's free GPUs, less what `Occupancy` says pods, the kubelet and DRA
        claims hold."""
        rec = self.nodes.record(node)
        if rec is None:
            return frozenset()
        unreserved = self.book.free(node, rec.topology.gpu_count)
        return self.occupancy.free(node, unreserved, live=self._live, topology=rec.topology)

    def pod_held(self, node: str) -> int:
        """GPUs of a node that bound pods hold, by count or by record, beyond what live
        reservations and the kubelet's exact report account for."""
        counted, pinned = self.occupancy.pods_holding(node, live=self._live)
        return counted + len(pinned)

    # The sources of "held" other than reservations, as the watchers and ingest feed them.

    def set_kubelet_use(self, node: str, use: GpuUse | None) -> None:
        """What a node's kubelet says is held (None: its exporter does not ask the kubelet)."""
        if use is not None and use.known and self.occupancy.kubelet_use(node) != use:
            self.choices.check(node, use, self.occupancy.pods(node))  # trust, but verify
        self.occupancy.set_kubelet_use(node, use)

    def set_claim(self, claim: str, devices: Iterable[ClaimedDevice]) -> None:
        """The GPU devices a DRA ResourceClaim holds now (none: deallocated or deleted)."""
        self.occupancy.set_claim(claim, devices)

    def claimed(self, node: str) -> list[ClaimedDevice]:
        """Devices of GPU drivers that claims hold on a node."""
        return self.occupancy.claimed(node)

    def kubelet_use(self, node: str) -> GpuUse | None:
        """What a node's kubelet last said is held."""
        return self.occupancy.kubelet_use(node)

    def pod_seen(self, pod: Mapping[str, Any]) -> None:
        """A bound pod as it is now (the pod watcher's); moves its node's free GPUs."""
        self.occupancy.upsert(pod)

    def pod_deleted(self, pod: Mapping[str, Any]) -> None:
        """A pod deleted, or no longer bound: its GPUs are free again."""
        self.occupancy.remove(pod)

    def held_gpus(self) -> dict[str, frozenset[int]]:
        """GPUs held by live reservations and commitments, per node."""
        return self.book.held_gpus()

    def reserve(
        self, result: PlacementResult, *, ttl_s: float, job: str = "", holder: str = ""
    ) -> Reservation:
        """Hold the GPUs of a placement (`ReservationBook.reserve`)."""
        return self.book.reserve(result, ttl_s=ttl_s, job=job, holder=holder)

    def commit(self, rid: str, *, owner: str = "") -> Reservation:
        """Keep a reservation until released."""
        return self.book.commit(rid, owner=owner)

    def release(self, rid: str) -> Reservation:
        """Free a reservation's GPUs."""
        return self.book.release(rid)

    def reservation(self, rid: str) -> Reservation | None:
        """A live reservation by id."""
        return self.book.reservation(rid)

    def reservations(self) -> list[Reservation]:
        """Live reservations."""
        return self.book.reservations()

    def expire(self) -> int:
        """Drop reservations past their expiry; returns how many."""
        return self.book.expire()

    def restore(self, reservations: Iterable[Reservation]) -> None:
        """Re-install reservations recovered after a restart (committed ones, typically)."""
        self.book.restore(reservations)
