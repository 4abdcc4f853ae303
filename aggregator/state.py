"""The aggregator's one mutable cluster state: reported nodes, reservations and allocations.

Everything that changes the cluster goes through `ClusterState` (one asyncio loop owns it, so its
methods need no locks), and placement reads immutable `ClusterSnapshot`s it hands out. A
snapshot is rebuilt only when something changed since the last one (`generation` moved).

Reports are ordered per node by (incarnation, sequence): a restarted exporter picks a larger
incarnation, each message a larger sequence; anything not newer than the last accepted report
is ignored, so replays and late duplicates can never undo newer facts. A node that has not
reported for `stale_after_s` is stale: kept for display, not placeable.

Reservations hold GPUs for a TTL; `commit` keeps them until `release`. Expired reservations are
dropped before every decision, so an abandoned dry run never leaks GPUs.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.delta import NodeDelta, apply_delta
from gputopo.placement.result import PlacementResult
from gputopo.topology import NodeTopology

__all__ = [
    "ClusterState",
    "NodeRecord",
    "ReportOutcome",
    "Reservation",
    "ReservationError",
]


class ReportOutcome(enum.Enum):
    """What became of a report."""

    ACCEPTED = "accepted"
    IGNORED = "ignored"  # not newer than what was accepted
    RESYNC = "resync"  # a delta without a base: the exporter must send a snapshot


@dataclass(slots=True)
class NodeRecord:
    """What the aggregator knows about one node."""

    topology: NodeTopology
    incarnation: int
    sequence: int
    last_report: float
    generation: int
    labels: dict[str, str] = field(default_factory=dict)
    source: str = "exporter"  # or "inventory"


@dataclass(slots=True)
class Reservation:
    """GPUs held for one placement."""

    id: str
    gpus: dict[str, frozenset[int]]
    expires_at: float | None  # None once committed
    owner: str = ""
    job: str = ""
    result: PlacementResult | None = None

    @property
    def committed(self) -> bool:
        """Committed reservations never expire."""
        return self.expires_at is None

    @property
    def gpu_count(self) -> int:
        """GPUs held."""
        return sum(len(g) for g in self.gpus.values())


class ReservationError(KeyError):
    """An unknown or expired reservation id."""


class ClusterState:
    """The mutable cluster (see the module docstring). `clock` returns unix seconds."""

    def __init__(self, *, clock: Callable[[], float], stale_after_s: float = 30.0) -> None:
        self._clock = clock
        self.stale_after_s = stale_after_s
        self._nodes: dict[str, NodeRecord] = {}
        self._reservations: dict[str, Reservation] = {}
        self.generation = 0
        self._snapshot: ClusterSnapshot | None = None
        self._snapshot_key: tuple[int, frozenset[str]] | None = None
        self._listeners: list[Callable[[str, str], None]] = []
        self._known_stale: frozenset[str] = frozenset()

    # --- observers ------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Call `listener(kind, node)` on every change; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _changed(self, kind: str, node: str) -> None:
        self.generation += 1
        for listener in list(self._listeners):
            listener(kind, node)

    # --- reports --------------------------------------------------------------------------

    def apply_snapshot(
        self, topology: NodeTopology, *, incarnation: int, sequence: int
    ) -> ReportOutcome:
        """Replace a node's topology with a full snapshot, unless a newer report was accepted."""
        rec = self._nodes.get(topology.name)
        now = self._clock()
        if rec is not None and (incarnation, sequence) <= (rec.incarnation, rec.sequence):
            return ReportOutcome.IGNORED
        if rec is None:
            self._nodes[topology.name] = NodeRecord(topology, incarnation, sequence, now, 1)
        else:
            changed = rec.topology != topology
            was_stale = self._is_stale(rec, now)
            rec.topology, rec.incarnation, rec.sequence, rec.last_report = (
                topology,
                incarnation,
                sequence,
                now,
            )
            if not changed and not was_stale:
                return ReportOutcome.ACCEPTED
            rec.generation += 1
        self._changed("node", topology.name)
        return ReportOutcome.ACCEPTED

    def apply_delta(
        self, node: str, delta: NodeDelta, *, incarnation: int, sequence: int
    ) -> ReportOutcome:
        """Apply changes on top of the node's snapshot of the same incarnation."""
        rec = self._nodes.get(node)
        if rec is None or incarnation != rec.incarnation:
            if rec is not None and incarnation < rec.incarnation:
                return ReportOutcome.IGNORED
            return ReportOutcome.RESYNC
        if sequence <= rec.sequence:
            return ReportOutcome.IGNORED
        now = self._clock()
        was_stale = self._is_stale(rec, now)
        topo = apply_delta(rec.topology, delta)
        rec.sequence, rec.last_report = sequence, now
        if topo != rec.topology or was_stale:
            rec.topology = topo
            rec.generation += 1
            self._changed("node", node)
        return ReportOutcome.ACCEPTED

    def heartbeat(self, node: str, *, incarnation: int, sequence: int) -> ReportOutcome:
        """Note that a node is alive."""
        rec = self._nodes.get(node)
        if rec is None or incarnation != rec.incarnation:
            if rec is not None and incarnation < rec.incarnation:
                return ReportOutcome.IGNORED
            return ReportOutcome.RESYNC
        if sequence <= rec.sequence:
            return ReportOutcome.IGNORED
        now = self._clock()
        was_stale = self._is_stale(rec, now)
        rec.sequence, rec.last_report = sequence, now
        if was_stale:
            self._changed("node", node)
        return ReportOutcome.ACCEPTED

    def set_labels(self, node: str, labels: Mapping[str, str]) -> None:
        """Record the Kubernetes labels of a node (used by node selectors)."""
        rec = self._nodes.get(node)
        if rec is not None and rec.labels != dict(labels):
            rec.labels = dict(labels)
            self._changed("labels", node)

    def remove_node(self, node: str) -> bool:
        """Forget a node (deleted from the cluster)."""
        if self._nodes.pop(node, None) is None:
            return False
        self._changed("removed", node)
        return True

    def record(self, node: str) -> NodeRecord | None:
        """The record of a node, if known."""
        return self._nodes.get(node)

    @property
    def node_names(self) -> list[str]:
        """Known nodes, sorted."""
        return sorted(self._nodes)

    def _is_stale(self, rec: NodeRecord, now: float) -> bool:
        return rec.source == "exporter" and now - rec.last_report > self.stale_after_s

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
            self._changed("stale" if node in stale else "node", node)
        return flipped

    # --- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """An immutable view of now: free = not held by any live reservation, stale excluded."""
        self.expire()
        stale = frozenset(self.stale_nodes())
        key = (self.generation, stale)
        if self._snapshot is not None and self._snapshot_key == key:
            return self._snapshot
        held = self.held_gpus()
        states = []
        for name, rec in self._nodes.items():
            all_gpus = frozenset(range(rec.topology.gpu_count))
            states.append(
                NodeState(
                    topology=rec.topology,
                    free=all_gpus - held.get(name, frozenset()),
                    labels=dict(rec.labels),
                    placeable=name not in stale and rec.topology.gpu_count > 0,
                    reason="stale"
                    if name in stale
                    else ("no GPUs" if not rec.topology.gpu_count else ""),
                )
            )
        self._snapshot = ClusterSnapshot(
            states, generation=self.generation, previous=self._snapshot, now=self._clock()
        )
        self._snapshot_key = key
        return self._snapshot

    # --- reservations ---------------------------------------------------------------------

    def held_gpus(self) -> dict[str, frozenset[int]]:
        """GPUs held by live reservations and commitments, per node."""
        out: dict[str, set[int]] = {}
        for r in self._reservations.values():
            for node, gpus in r.gpus.items():
                out.setdefault(node, set()).update(gpus)
        return {n: frozenset(g) for n, g in out.items()}

    def reserve(self, result: PlacementResult, *, ttl_s: float, job: str = "") -> Reservation:
        """Hold the GPUs of a placement for `ttl_s` seconds.

        Raises ValueError if any GPU is already held: callers place on a fresh snapshot in the
        same loop turn, so this only fires on a programming error, never silently.
        """
        self.expire()
        held = self.held_gpus()
        allocation = result.allocation()
        for node, gpus in allocation.items():
            clash = gpus & held.get(node, frozenset())
            if clash:
                raise ValueError(f"GPUs {sorted(clash)} of {node} are already held")
        rid = secrets.token_hex(8)
        res = Reservation(rid, dict(allocation), self._clock() + ttl_s, job=job, result=result)
        self._reservations[rid] = res
        for node in allocation:
            self._changed("allocation", node)
        return res

    def commit(self, rid: str, *, owner: str = "") -> Reservation:
        """Keep a reservation until released."""
        self.expire()
        res = self._reservations.get(rid)
        if res is None:
            raise ReservationError(rid)
        res.expires_at = None
        res.owner = owner or res.owner
        return res

    def release(self, rid: str) -> Reservation:
        """Free a reservation's GPUs."""
        res = self._reservations.pop(rid, None)
        if res is None:
            raise ReservationError(rid)
        for node in res.gpus:
            self._changed("allocation", node)
        return res

    def reservation(self, rid: str) -> Reservation | None:
        """A live reservation by id."""
        self.expire()
        return self._reservations.get(rid)

    def reservations(self) -> list[Reservation]:
        """Live reservations."""
        self.expire()
        return list(self._reservations.values())

    def expire(self) -> int:
        """Drop reservations past their expiry; returns how many."""
        now = self._clock()
        gone = [
            r
            for r in self._reservations.values()
            if r.expires_at is not None and r.expires_at <= now
        ]
        for r in gone:
            del self._reservations[r.id]
            for node in r.gpus:
                self._changed("allocation", node)
        return len(gone)

    def restore(self, reservations: Iterable[Reservation]) -> None:
        """Re-install reservations recovered after a restart (committed ones, typically)."""
        for r in reservations:
            self._reservations[r.id] = r
            for node in r.gpus:
                self._changed("allocation", node)
