"""The aggregator's one mutable cluster state: reported nodes, reservations and allocations.

Everything that changes the cluster goes through `ClusterState` (one asyncio loop owns it, so its
methods need no locks), and placement reads immutable `ClusterSnapshot`s it hands out. A
snapshot is rebuilt only when something changed since the last one (`generation` moved).

Reports are ordered per node by (incarnation, sequence): a restarted exporter picks a larger
incarnation, each message a larger sequence; anything not newer than the last accepted report
is ignored, so replays and late duplicates can never undo newer facts. A node that has not
reported for `stale_after_s` is stale: kept for display, not placeable.

What holds GPUs is composed of two parts, each reporting the nodes it moved through its
`on_change`: gputopo's own promises in a `ReservationBook` (`gputopo.reservations`; the
placement core keeps them in a store), and everything else in `Occupancy`
(`aggregator.occupancy`: pods bound by anyone, the kubelet's exact report, DRA claims, and the
precedence between them). A node's free GPUs are the book's, less what occupancy holds.

A node's topology as placement sees it is what its exporter reported with the fabric position
replaced by the merge of every inter-node source (`aggregator.fabric`: inventory, NVML, labels
written by others, probes); `NodeRecord.reported` keeps the report as it came. Per-domain GPU
counts (`index`, `aggregator.indexes`) follow every change incrementally, for the label
publisher, metrics and `/api/v1`; placement keeps reading snapshots.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field, replace
from typing import Any

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.choices import ChoiceChecker
from aggregator.claims import ClaimedDevice
from aggregator.fabric import FabricSources, Resolution
from aggregator.indexes import DomainIndex
from aggregator.occupancy import Occupancy
from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.delta import NodeDelta, apply_delta, check_delta
from gputopo.gpu_use import GpuUse
from gputopo.nominal import plausible
from gputopo.placement.result import PlacementResult
from gputopo.reservations import Reservation, ReservationBook
from gputopo.topology import NodeTopology

__all__ = [
    "ClusterState",
    "NodeRecord",
    "ReportOutcome",
]

# A snapshot derived from the previous one keeps that one's clock, which ages link
# measurements; after this long the next snapshot is built afresh with the current time.
_SNAPSHOT_CLOCK_REUSE_S = 60.0


class ReportOutcome(enum.Enum):
    """What became of a report."""

    ACCEPTED = "accepted"
    IGNORED = "ignored"  # not newer than what was accepted
    RESYNC = "resync"  # a delta without a base: the exporter must send a snapshot


@dataclass(slots=True)
class NodeRecord:
    """What the aggregator knows about one node.

    `topology` is what placement uses (the report with the merged fabric position),
    `reported` the report as it came, `resolution` where each part of the fabric came from.
    """

    topology: NodeTopology
    incarnation: int
    sequence: int
    last_report: float
    generation: int
    labels: dict[str, str] = field(default_factory=dict)
    source: str = "exporter"  # or "inventory": a static node that never goes stale
    reported: NodeTopology | None = None
    resolution: Resolution | None = None
    probe_address: str = ""


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
        self.stale_after_s = stale_after_s
        self.sources = sources or FabricSources()
        self.index = DomainIndex()
        self._nodes: dict[str, NodeRecord] = {}
        # Kubernetes labels of every Node object seen, and which of them this aggregator owns.
        self._kube_labels: dict[str, tuple[dict[str, str], frozenset[str]]] = {}
        # What holds GPUs: gputopo's promises (the book), and everything else (pods bound by
        # anyone, the kubelet's exact report, DRA claims: `aggregator.occupancy`, which owns
        # their precedence). Both report the nodes whose free GPUs moved.
        self.book = ReservationBook(clock=clock, on_change=self._allocations_moved)
        self.occupancy = Occupancy(on_change=self._occupancy_moved)
        # Trust, but verify: the kubelet's exact report against gputopo's records.
        self.choices = ChoiceChecker()
        self.generation = 0
        self._snapshot: ClusterSnapshot | None = None
        self._snapshot_key: tuple[int, frozenset[str]] | None = None
        # Nodes changed since the last snapshot, with the kinds of change: when only
        # allocations moved, the next snapshot derives from the last one in O(changes).
        self._dirty: dict[str, set[ChangeKind]] = {}
        self._listeners: list[Callable[[ChangeEvent], None]] = []
        self._known_stale: frozenset[str] = frozenset()
        # Nodes whose Node object was deleted -> the exporter incarnation to ignore.
        self._deleted: dict[str, int] = {}

    # --- observers ------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[ChangeEvent], None]) -> Callable[[], None]:
        """Call `listener(event)` on every change (`ChangeKind` says which); returns an
        unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _changed(self, kind: ChangeKind, node: str) -> None:
        self.generation += 1
        self._dirty.setdefault(node, set()).add(kind)
        self._reindex(node)
        event = ChangeEvent(kind, node, self.generation)
        for listener in list(self._listeners):
            listener(event)

    def _reindex(self, node: str) -> None:
        rec = self._nodes.get(node)
        if rec is None:
            self.index.remove(node)
            return
        placeable = rec.topology.gpu_count > 0 and node not in self._known_stale
        self.index.update(
            rec.topology, free=len(self.free_gpus(node)), placeable=placeable, labels=rec.labels
        )

    # --- the merged fabric position ---------------------------------------------------------

    def _effective(self, name: str, reported: NodeTopology) -> tuple[NodeTopology, Resolution]:
        """What placement uses: the reported topology with its fabric position merged from
        every source, and no link faster than its kind can be (`gputopo.nominal.plausible`)."""
        labels, owned = self._kube_labels.get(name, ({}, frozenset()))
        foreign = {k: v for k, v in labels.items() if k not in owned}
        resolution = self.sources.resolve_node(name, reported, foreign)
        checked = plausible(reported)
        if resolution.fabric == checked.fabric:
            return checked, resolution
        return replace(checked, fabric=resolution.fabric), resolution

    def refresh_fabric(self, nodes: Iterable[str] | None = None) -> list[str]:
        """Merge the sources again (after an inventory load or new probe inference).

        Returns the nodes whose topology changed.
        """
        changed = []
        for name in sorted(self._nodes if nodes is None else set(nodes) & set(self._nodes)):
            if self._remerge(name, self._nodes[name]):
                changed.append(name)
                self._changed(ChangeKind.NODE, name)
        return changed

    def _remerge(self, name: str, rec: NodeRecord) -> bool:
        """Merge a node's fabric sources again; True (and a new node generation) when the
        topology placement sees changed."""
        if rec.reported is None:
            return False
        topo, rec.resolution = self._effective(name, rec.reported)
        if topo == rec.topology:
            return False
        rec.topology = topo
        rec.generation += 1
        return True

    # --- reports --------------------------------------------------------------------------

    def apply_snapshot(
        self, topology: NodeTopology, *, incarnation: int, sequence: int
    ) -> ReportOutcome:
        """Replace a node's topology with a full snapshot, unless a newer report was accepted."""
        name = topology.name
        rec = self._nodes.get(name)
        now = self._clock()
        if rec is not None and (incarnation, sequence) <= (rec.incarnation, rec.sequence):
            return ReportOutcome.IGNORED
        if incarnation <= self._deleted.get(name, -1):
            return ReportOutcome.IGNORED  # its Node object was deleted (`node_deleted`)
        effective, resolution = self._effective(name, topology)
        if rec is None:
            self._nodes[name] = NodeRecord(
                effective,
                incarnation,
                sequence,
                now,
                1,
                labels=dict(self._kube_labels.get(name, ({}, frozenset()))[0]),
                reported=topology,
                resolution=resolution,
            )
        else:
            changed = rec.topology != effective
            was_stale = self._is_stale(rec, now)
            rec.topology, rec.incarnation, rec.sequence, rec.last_report = (
                effective,
                incarnation,
                sequence,
                now,
            )
            rec.reported, rec.resolution, rec.source = topology, resolution, "exporter"
            if not changed and not was_stale:
                return ReportOutcome.ACCEPTED
            rec.generation += 1
        self._changed(ChangeKind.NODE, name)
        return ReportOutcome.ACCEPTED

    def _next_in_stream(
        self, node: str, incarnation: int, sequence: int
    ) -> NodeRecord | ReportOutcome:
        """The node's record when a delta or heartbeat continues its accepted stream, else the
        outcome: RESYNC without a snapshot of this incarnation to build on, IGNORED for an older
        incarnation or a sequence not newer than the last accepted one."""
        rec = self._nodes.get(node)
        if rec is None or incarnation > rec.incarnation:
            return ReportOutcome.RESYNC
        if incarnation < rec.incarnation or sequence <= rec.sequence:
            return ReportOutcome.IGNORED
        return rec

    def yield_to(self, node: str, incarnation: int) -> None:
        """A new stream now holds the node (ingest's claim), with an incarnation older than the
        record's: the stream that sent the newer one is gone (the claim would have refused this
        one otherwise), so its incarnation no longer orders anything. Without this a forged or
        clock-skewed incarnation would make the node ignore its real exporter until that one
        restarts past it. The record stays as it is until the new stream's snapshot replaces
        it; its deltas and heartbeats get RESYNC until then."""
        rec = self._nodes.get(node)
        if rec is None or rec.source != "exporter" or incarnation >= rec.incarnation:
            return
        rec.incarnation, rec.sequence = incarnation - 1, 0

    def apply_delta(
        self, node: str, delta: NodeDelta, *, incarnation: int, sequence: int
    ) -> ReportOutcome:
        """Apply changes on top of the node's snapshot of the same incarnation.

        Raises `DeltaError` (naming the field) for a delta that its base of the same
        incarnation cannot take, before anything changes."""
        known = self._nodes.get(node)
        if known is not None and known.reported is not None and known.incarnation == incarnation:
            check_delta(known.reported, delta)
        rec = self._next_in_stream(node, incarnation, sequence)
        if isinstance(rec, ReportOutcome):
            return rec
        now = self._clock()
        was_stale = self._is_stale(rec, now)
        reported = apply_delta(rec.reported or rec.topology, delta)
        topo, rec.resolution = self._effective(node, reported)
        rec.sequence, rec.last_report, rec.reported = sequence, now, reported
        if topo != rec.topology or was_stale:
            rec.topology = topo
            rec.generation += 1
            self._changed(ChangeKind.NODE, node)
        return ReportOutcome.ACCEPTED

    def heartbeat(self, node: str, *, incarnation: int, sequence: int) -> ReportOutcome:
        """Note that a node is alive."""
        rec = self._next_in_stream(node, incarnation, sequence)
        if isinstance(rec, ReportOutcome):
            return rec
        now = self._clock()
        was_stale = self._is_stale(rec, now)
        rec.sequence, rec.last_report = sequence, now
        if was_stale:
            self._changed(ChangeKind.NODE, node)
        return ReportOutcome.ACCEPTED

    def set_labels(
        self, node: str, labels: Mapping[str, str], *, owned: frozenset[str] = frozenset()
    ) -> None:
        """Record the Kubernetes labels of a node and which of them this aggregator owns.

        All labels serve node selectors; those not owned are also a fabric source.
        """
        entry = (dict(labels), owned)
        self._deleted.pop(node, None)  # a Node object by that name exists (again)
        if self._kube_labels.get(node) == entry:
            return
        self._kube_labels[node] = entry
        rec = self._nodes.get(node)
        if rec is None:
            return
        rec.labels = dict(labels)
        self._remerge(node, rec)
        self._changed(ChangeKind.LABELS, node)

    def forget_labels(self, node: str) -> None:
        """The Node object is gone: its labels no longer say anything."""
        if self._kube_labels.pop(node, None) is not None:
            self.set_labels(node, {})
            self._kube_labels.pop(node, None)

    def kube_labels(self, node: str) -> tuple[Mapping[str, str], frozenset[str]] | None:
        """A Node object's labels and the keys we own, as last seen; None if never seen."""
        return self._kube_labels.get(node)

    def add_static(
        self, topology: NodeTopology, *, labels: Mapping[str, str] | None = None
    ) -> None:
        """A node known without an exporter (from an inventory): never stale. `labels` serve
        node selectors until the node's Kubernetes labels, if it has a Node object, replace
        them."""
        effective, resolution = self._effective(topology.name, topology)
        self._nodes[topology.name] = NodeRecord(
            effective,
            0,
            0,
            self._clock(),
            1,
            source="inventory",
            reported=topology,
            resolution=resolution,
            labels=dict(labels or {}),
        )
        self._changed(ChangeKind.NODE, topology.name)

    def remove_node(self, node: str) -> bool:
        """Forget a node (deleted from the cluster)."""
        if self._nodes.pop(node, None) is None:
            return False
        self._changed(ChangeKind.REMOVED, node)
        return True

    def forget_ghosts(
        self, *, ttl_s: float, live: Set[str], has_object: Callable[[str], bool]
    ) -> list[str]:
        """Forget exporter-reported nodes silent for longer than `ttl_s` that have no live
        report stream (`live`) and no Kubernetes Node object (`has_object`); returns them.

        A stale node stays visible (and unplaceable) while there is reason to think it exists:
        a Node object, or a stream still open. Without either it is a ghost (a forged name, a
        machine gone for good), and keeping it forever made state grow with what clients
        claimed rather than with what the cluster has.
        """
        now = self._clock()
        gone = [
            name
            for name, rec in self._nodes.items()
            if rec.source == "exporter"
            and now - rec.last_report > ttl_s
            and name not in live
            and not has_object(name)
        ]
        for name in gone:
            self.remove_node(name)
        return gone

    def node_deleted(self, node: str) -> None:
        """The node's Kubernetes Node object was deleted: forget its labels and the node.

        Its exporter may not know yet (or never will, if the machine is gone but the process
        is not): reports of the incarnation it had are ignored from now on, so the node does
        not come back with the next heartbeat. A new incarnation (the exporter restarted) or a
        new Node object with that name lets it in again.
        """
        self.forget_labels(node)
        rec = self._nodes.get(node)
        if rec is not None and rec.source == "exporter":
            self._deleted[node] = rec.incarnation
        self.remove_node(node)

    def set_probe_address(self, node: str, address: str) -> None:
        """Where a node answers network probes (from its reports)."""
        rec = self._nodes.get(node)
        if rec is not None:
            rec.probe_address = address

    def record(self, node: str) -> NodeRecord | None:
        """The record of a node, if known."""
        return self._nodes.get(node)

    @property
    def node_names(self) -> list[str]:
        """Known nodes, sorted."""
        return sorted(self._nodes)

    @property
    def node_count(self) -> int:
        """How many nodes are known."""
        return len(self._nodes)

    def _is_stale(self, rec: NodeRecord, now: float) -> bool:
        return rec.source == "exporter" and now - rec.last_report > self.stale_after_s

    def is_stale(self, node: str) -> bool:
        """Whether a known node stopped reporting."""
        rec = self._nodes.get(node)
        return rec is not None and self._is_stale(rec, self._clock())

    def stale_nodes(self) -> list[str]:
        """Nodes that stopped reporting."""
        now = self._clock()
        return sorted(n for n, r in self._nodes.items() if self._is_stale(r, now))

    def check_stale(self) -> list[str]:
        """Announce nodes that went stale (or came back) since the last check; returns them.

        Staleness is a matter of time passing, not of a message arriving, so the server calls
        this periodically to tell watchers and label publishers.
        """
        stale = frozenset(self.stale_nodes())
        flipped = sorted(stale ^ self._known_stale)
        self._known_stale = stale
        for node in flipped:
            self._changed(ChangeKind.STALE if node in stale else ChangeKind.NODE, node)
        return flipped

    # --- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """An immutable view of now: free = not held by any live reservation, stale excluded."""
        self.expire()
        stale = frozenset(self.stale_nodes())
        key = (self.generation, stale)
        if self._snapshot is not None and self._snapshot_key == key:
            return self._snapshot
        previous = self._snapshot
        if previous is not None and self._only_allocations_moved(previous, stale):
            changes = {name: self.free_gpus(name) for name in self._dirty if name in self._nodes}
            self._snapshot = previous.with_free(changes, generation=self.generation)
        else:
            self._snapshot = self._rebuild(stale, previous)
        self._dirty.clear()
        self._snapshot_key = key
        return self._snapshot

    def _only_allocations_moved(self, previous: ClusterSnapshot, stale: frozenset[str]) -> bool:
        """Whether the next snapshot may derive from `previous` by free GPUs alone.

        True when nothing but reservations changed since it, no node went stale or came back,
        and its clock is recent (it ages link measurements by that clock).
        """
        return (
            self._snapshot_key is not None
            and self._snapshot_key[1] == stale
            and all(kinds == {ChangeKind.ALLOCATION} for kinds in self._dirty.values())
            and (previous.now is None or self._clock() - previous.now < _SNAPSHOT_CLOCK_REUSE_S)
        )

    def _rebuild(self, stale: frozenset[str], previous: ClusterSnapshot | None) -> ClusterSnapshot:
        """Every node's state afresh (sharing what is unchanged with `previous`)."""
        states = []
        for name, rec in self._nodes.items():
            states.append(
                NodeState(
                    topology=rec.topology,
                    free=self.free_gpus(name),
                    labels=dict(rec.labels),
                    placeable=name not in stale and rec.topology.gpu_count > 0,
                    reason="stale"
                    if name in stale
                    else ("no GPUs" if not rec.topology.gpu_count else ""),
                )
            )
        return ClusterSnapshot(
            states, generation=self.generation, previous=previous, now=self._clock()
        )

    # --- reservations (the book's; the state announces what they move) --------------------

    def _allocations_moved(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._changed(ChangeKind.ALLOCATION, node)

    def _occupancy_moved(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            if node in self._nodes:
                self._changed(ChangeKind.ALLOCATION, node)

    def _live(self, rid: str) -> bool:
        return self.book.reservation(rid) is not None

    def free_gpus(self, node: str) -> frozenset[int]:
        """GPUs of a node that no live reservation and nothing else holds (empty for an unknown
        node): the book's free GPUs, less what `Occupancy` says pods, the kubelet and DRA
        claims hold."""
        rec = self._nodes.get(node)
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
