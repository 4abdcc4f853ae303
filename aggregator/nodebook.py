"""The aggregator's book of nodes: what each exporter reported, in order, merged with the fabric.

One part of the cluster state (`aggregator.state` composes it with occupancy, the reservation
book and the snapshot cache). It owns:

1. **Reports in order.** Reports are ordered per node by (incarnation, sequence): a restarted
   exporter picks a larger incarnation, each message a larger sequence; anything not newer than
   the last accepted report is ignored, so replays and late duplicates can never undo newer
   facts. A delta continues the snapshot of its incarnation and is checked against it first
   (`check_delta`: devices numbered 0..n-1, links on real devices, the per-node memory budget).
2. **Staleness.** A node that has not reported for `stale_after_s` is stale: kept for display,
   not placeable. Inventory nodes never go stale. Finding the stale nodes does not scan every
   node (the housekeeping tick asks each second, and every cluster snapshot asks): each node
   not found stale waits in a heap by its report time as of when it was queued, and a sweep
   looks only at the entries older than the cut-off, re-queueing those that reported since
   (at a heartbeat every 10 s and 30 s to go stale, a node is looked at every 30 s, not every
   tick). Reports do not touch the heap (they only note a clock that went back).
   `stale_after_s` moves with the paced heartbeat interval (`gputopo.heartbeats`, set by the
   server each tick): a longer threshold re-checks the nodes found stale, a shorter one only
   lets more entries pass the cut-off, so the sweep needs nothing more.
3. **The merged fabric position.** A node's topology as placement sees it is what its exporter
   reported with the fabric position replaced by the merge of every inter-node source
   (`aggregator.fabric`: inventory, NVML, labels written by others, probes) and no link faster
   than its kind can be (`gputopo.nominal.plausible`); `NodeRecord.reported` keeps the report
   as it came.
4. **Kubernetes labels** of every Node object seen (selectors, and a fabric source), and which
   Node objects were deleted.

A report costs what it changes: a delta that touches links only amends the two topologies it
keeps (sharing every other link, `NodeTopology.amended`), checks only those links against their
ceiling and keeps the fabric merge (its inputs, the GPUs' NVML fabric, the reported position
and the labels, did not move); a heartbeat is an ordering check and two assignments. Every
change that placement could see is reported through one `on_change(kind, node)`.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field, replace

from aggregator.changes import ChangeKind
from aggregator.fabric import FabricSources, Resolution
from gputopo import bounds
from gputopo.delta import DeltaError, NodeDelta, apply_delta, check_delta
from gputopo.nominal import plausible, plausible_link
from gputopo.topology import NodeTopology

__all__ = [
    "NodeBook",
    "NodeRecord",
    "ReportOutcome",
]

# About what a link takes on the wire (two refs, kind, lanes, bandwidth, a measurement): the
# text term of a merged node's estimate, whose own strings the snapshot check already bounded.
_LINK_WIRE_BYTES = 48


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


def _check_delta_memory(base: NodeTopology, delta: NodeDelta, wire_bytes: int) -> None:
    """DeltaError (field `delta`) when the node the delta would leave passes the per-node memory
    budget (`gputopo.bounds.NODE_MEMORY_BUDGET`) that ingest holds snapshots to: links it adds
    on top of the node's, and its own size (`wire_bytes`) on top of the node's links."""
    removed = sum(1 for a, b in delta.removed_links if base.link(a, b) is not None)
    links = len(base.links) - removed
    links += sum(1 for lk in delta.links if base.link(lk.a, lk.b) is None)
    estimate = bounds.node_memory(
        gpus=len({g.index for g in delta.gpus} | set(range(len(base.gpus)))),
        nics=len({n.index for n in delta.nics} | set(range(len(base.nics)))),
        numa_nodes=len(base.numa_nodes),
        links=links,
        wire_bytes=_LINK_WIRE_BYTES * links + wire_bytes,
    )
    try:
        bounds.check_node_memory("delta", estimate)
    except bounds.BoundsError as err:
        raise DeltaError(err.field, err.reason) from None


def _unchanged(kind: ChangeKind, node: str) -> None:
    return None


class NodeBook:
    """Reported nodes, their order, staleness, labels and merged fabric (module docstring).

    `clock` returns unix seconds; `on_change(kind, node)` hears every change placement could
    see (a node's topology, labels, staleness, its removal).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        stale_after_s: float = 30.0,
        sources: FabricSources | None = None,
        on_change: Callable[[ChangeKind, str], None] = _unchanged,
    ) -> None:
        self._clock = clock
        self.stale_after_s = stale_after_s
        self.sources = sources or FabricSources()
        self._on_change = on_change
        self._nodes: dict[str, NodeRecord] = {}
        # Kubernetes labels of every Node object seen, and which of them this aggregator owns.
        self._kube_labels: dict[str, tuple[dict[str, str], frozenset[str]]] = {}
        # Nodes whose Node object was deleted -> the exporter incarnation to ignore.
        self._deleted: dict[str, int] = {}
        self._known_stale: frozenset[str] = frozenset()
        # The staleness index (module docstring, 2): exporter nodes not found stale have one
        # live heap entry, `(last_report when queued, name)`, also in `_queued`; an entry not
        # matching `_queued` is left over from a re-queue or a removal and is dropped when
        # popped. `_stale`: the nodes the last sweep found stale.
        self._silence: list[tuple[float, str]] = []
        self._queued: dict[str, float] = {}
        self._stale: set[str] = set()
        self._requeue = False  # a report went back in time: `_sweep` queues all again

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

    @staticmethod
    def _amended(
        effective: NodeTopology, base: NodeTopology, reported: NodeTopology, delta: NodeDelta
    ) -> NodeTopology:
        """`_effective` of `reported` (`base`, the last report, with `delta` applied), derived
        from the last one's `effective` by the links the delta changed. Only for a delta that
        leaves the fabric merge's inputs alone (no GPUs, no fabric position): the merged
        position and every other link's ceiling are what they were.

        When the last report needed no change (`effective is base`: the common case), neither
        does this one unless a link it changed is above its ceiling, and the record keeps one
        topology, not two (about 5 KiB a node).

        The changed links are taken from `reported`, not from the delta: a delta may name one
        pair twice, and only the last of them is what the node has."""
        changed = [lk for given in delta.links if (lk := reported.link(given.a, given.b))]
        if effective is base:
            cut = [c for lk in changed if (c := plausible_link(reported, lk)) is not lk]
            return reported.amended(links=cut) if cut else reported
        return effective.amended(
            links=[plausible_link(reported, lk) for lk in changed],
            removed_links=delta.removed_links,
            nics=reported.nics if delta.nics else None,
            nvml=delta.nvml,
            problems=delta.problems,
        )

    def refresh_fabric(self, nodes: Iterable[str] | None = None) -> list[str]:
        """Merge the sources again (after an inventory load or new probe inference).

        Returns the nodes whose topology changed.
        """
        changed = []
        for name in sorted(self._nodes if nodes is None else set(nodes) & set(self._nodes)):
            if self._remerge(name, self._nodes[name]):
                changed.append(name)
                self._on_change(ChangeKind.NODE, name)
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
            self._queue(name, now)
        else:
            changed = rec.topology != effective
            was_stale = self._is_stale(rec, now)
            self._requeue |= now < rec.last_report
            rec.topology, rec.incarnation, rec.sequence, rec.last_report = (
                effective,
                incarnation,
                sequence,
                now,
            )
            if rec.source != "exporter":  # an inventory node now has an exporter
                self._queue(name, now)
            rec.reported, rec.resolution, rec.source = topology, resolution, "exporter"
            if not changed and not was_stale:
                return ReportOutcome.ACCEPTED
            rec.generation += 1
        self._on_change(ChangeKind.NODE, name)
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

    def check_delta(
        self, node: str, delta: NodeDelta, *, incarnation: int, wire_bytes: int | None = None
    ) -> None:
        """DeltaError (naming the field) when the node's report of the same incarnation cannot
        take the delta: over the memory budget (when its size on the wire, `wire_bytes`, is
        given), or devices and links that do not continue it (`gputopo.delta.check_delta`).
        Nothing to check without such a report (the delta will get RESYNC)."""
        known = self._nodes.get(node)
        if known is None or known.reported is None or known.incarnation != incarnation:
            return
        if wire_bytes is not None:
            _check_delta_memory(known.reported, delta, wire_bytes)
        check_delta(known.reported, delta)

    def apply_delta(
        self,
        node: str,
        delta: NodeDelta,
        *,
        incarnation: int,
        sequence: int,
        wire_bytes: int | None = None,
    ) -> ReportOutcome:
        """Apply changes on top of the node's snapshot of the same incarnation.

        Raises `DeltaError` (naming the field) for a delta that its base of the same
        incarnation cannot take (`check_delta`), before anything changes; with `wire_bytes`
        (its size on the wire) that includes passing the per-node memory budget."""
        self.check_delta(node, delta, incarnation=incarnation, wire_bytes=wire_bytes)
        rec = self._next_in_stream(node, incarnation, sequence)
        if isinstance(rec, ReportOutcome):
            return rec
        now = self._clock()
        was_stale = self._is_stale(rec, now)
        self._requeue |= now < rec.last_report
        base = rec.reported or rec.topology
        reported = apply_delta(base, delta)
        if rec.reported is None or delta.gpus or delta.fabric is not None:
            topo, rec.resolution = self._effective(node, reported)
        else:
            topo = self._amended(rec.topology, base, reported, delta)
        rec.sequence, rec.last_report, rec.reported = sequence, now, reported
        if topo != rec.topology or was_stale:
            rec.topology = topo
            rec.generation += 1
            self._on_change(ChangeKind.NODE, node)
        return ReportOutcome.ACCEPTED

    def heartbeat(self, node: str, *, incarnation: int, sequence: int) -> ReportOutcome:
        """Note that a node is alive: half of all reports, so an ordering check and two
        assignments (`_next_in_stream` and `_is_stale` written out) and a comparison."""
        rec = self._nodes.get(node)
        if rec is None or incarnation > rec.incarnation:
            return ReportOutcome.RESYNC
        if incarnation < rec.incarnation or sequence <= rec.sequence:
            return ReportOutcome.IGNORED
        now = self._clock()
        last = rec.last_report
        was_stale = rec.source == "exporter" and now - last > self.stale_after_s
        rec.sequence, rec.last_report = sequence, now
        if now < last:
            self._requeue = True
        if was_stale:
            self._on_change(ChangeKind.NODE, node)
        return ReportOutcome.ACCEPTED

    # --- labels and Node objects ------------------------------------------------------------

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
        self._on_change(ChangeKind.LABELS, node)

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
        self._untrack(topology.name)
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
        self._on_change(ChangeKind.NODE, topology.name)

    def remove_node(self, node: str) -> bool:
        """Forget a node (deleted from the cluster)."""
        if self._nodes.pop(node, None) is None:
            return False
        self._untrack(node)
        self._on_change(ChangeKind.REMOVED, node)
        return True

    def forget_ghosts(
        self, *, ttl_s: float, live: Set[str], has_object: Callable[[str], bool]
    ) -> list[str]:
        """Forget exporter-reported nodes silent for longer than `ttl_s` that have no live
        report stream (`live`) and no Kubernetes Node object (`has_object`); returns them.

        A stale node stays visible (and unplaceable) while there is reason to think it exists:
        a Node object, or a stream still open. Without either it is a ghost (a forged name, a
        machine gone for good), and keeping it forever made state grow with what clients
        claimed rather than with what the cluster has. Returned sorted; with `ttl_s` at least
        `stale_after_s` (as configured) only the stale nodes are looked at.
        """
        candidates = self.stale_nodes() if ttl_s >= self.stale_after_s else sorted(self._nodes)
        now = self._clock()
        gone = [
            name
            for name in candidates
            if (rec := self._nodes[name]).source == "exporter"
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

    # --- reading ----------------------------------------------------------------------------

    def record(self, node: str) -> NodeRecord | None:
        """The record of a node, if known."""
        return self._nodes.get(node)

    def records(self) -> Mapping[str, NodeRecord]:
        """Every record by node name, in the order nodes first reported (read, not change)."""
        return self._nodes

    @property
    def node_names(self) -> list[str]:
        """Known nodes, sorted."""
        return sorted(self._nodes)

    @property
    def node_count(self) -> int:
        """How many nodes are known."""
        return len(self._nodes)

    # --- staleness --------------------------------------------------------------------------

    def _is_stale(self, rec: NodeRecord, now: float) -> bool:
        return rec.source == "exporter" and now - rec.last_report > self.stale_after_s

    def _queue(self, name: str, last_report: float) -> None:
        heapq.heappush(self._silence, (last_report, name))
        self._queued[name] = last_report

    def _untrack(self, name: str) -> None:
        self._queued.pop(name, None)  # its heap entry, if any, is dropped when popped
        self._stale.discard(name)

    def _requeue_all(self) -> None:
        self._stale.clear()
        self._queued = {n: r.last_report for n, r in self._nodes.items() if r.source == "exporter"}
        self._silence = [(t, n) for n, t in self._queued.items()]
        heapq.heapify(self._silence)

    def _sweep(self, now: float) -> None:
        """Bring `_stale` up to `now`: it is then exactly the nodes `_is_stale` says are.

        A queued node is fresh while its entry is (its entry is no later than its last
        report), so only the entries past the cut-off are looked at; the nodes found stale
        before are checked again (they may have reported, or `stale_after_s` grown). A report
        earlier than the one before it (the clock went back) may have broken that order:
        everything is queued again."""
        if self._requeue:
            self._requeue = False
            self._requeue_all()
        for name in [n for n in self._stale if not self._is_stale(self._nodes[n], now)]:
            self._stale.discard(name)  # it reported again
            self._queue(name, self._nodes[name].last_report)
        heap, limit = self._silence, self.stale_after_s
        while heap and now - heap[0][0] > limit:
            queued_at, name = heapq.heappop(heap)
            if self._queued.get(name) != queued_at:
                continue  # left over from a re-queue or a removal
            rec = self._nodes[name]
            if self._is_stale(rec, now):
                del self._queued[name]
                self._stale.add(name)
            else:
                self._queue(name, rec.last_report)

    def is_stale(self, node: str) -> bool:
        """Whether a known node stopped reporting."""
        rec = self._nodes.get(node)
        return rec is not None and self._is_stale(rec, self._clock())

    def stale_nodes(self) -> list[str]:
        """Nodes that stopped reporting."""
        self._sweep(self._clock())
        return sorted(self._stale)

    @property
    def known_stale(self) -> frozenset[str]:
        """The stale nodes as of the last `check_stale` (what watchers were told)."""
        return self._known_stale

    def check_stale(self) -> list[str]:
        """Announce nodes that went stale (or came back) since the last check; returns them.

        Staleness is a matter of time passing, not of a message arriving, so the server calls
        this periodically to tell watchers and label publishers.
        """
        stale = frozenset(self.stale_nodes())
        flipped = sorted(stale ^ self._known_stale)
        self._known_stale = stale
        for node in flipped:
            self._on_change(ChangeKind.STALE if node in stale else ChangeKind.NODE, node)
        return flipped
