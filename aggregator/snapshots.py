"""The cluster state's snapshot cache: hand out one immutable `ClusterSnapshot` per state.

Placement reads snapshots, never the mutable state (STYLE.md §4). Building one is O(nodes), so
the cache keeps the last one and rebuilds only when something changed since (the state's
`generation` moved, or the set of stale nodes did). When only allocations moved (reservations,
pods, the kubelet, claims), the next snapshot derives from the last one in O(changes)
(`ClusterSnapshot.with_free`). The cache learns what changed through `note(kind, node)`, the
state's one `on_change` sink.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aggregator.changes import ChangeKind
from aggregator.nodebook import NodeRecord
from gputopo.cluster import ClusterSnapshot, NodeState

__all__ = ["SNAPSHOT_CLOCK_REUSE_S", "SnapshotCache"]

# A snapshot derived from the previous one keeps that one's clock, which ages link
# measurements; after this long the next snapshot is built afresh with the current time.
SNAPSHOT_CLOCK_REUSE_S = 60.0

_ONLY_ALLOCATIONS = frozenset({ChangeKind.ALLOCATION})


class SnapshotCache:
    """The last snapshot, and the nodes changed since it with the kinds of change."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._snapshot: ClusterSnapshot | None = None
        self._key: tuple[int, frozenset[str]] | None = None
        self._dirty: dict[str, set[ChangeKind]] = {}

    def note(self, kind: ChangeKind, node: str) -> None:
        """Something of `kind` changed on `node` since the last snapshot."""
        kinds = self._dirty.get(node)
        if kinds is None:
            self._dirty[node] = {kind}
        else:
            kinds.add(kind)

    def snapshot(
        self,
        *,
        generation: int,
        stale: frozenset[str],
        records: Mapping[str, NodeRecord],
        free: Callable[[str], frozenset[int]],
    ) -> ClusterSnapshot:
        """The snapshot of the state at `generation` with `stale` nodes unplaceable: the cached
        one when nothing moved, derived from it when only allocations did, else rebuilt (sharing
        what is unchanged). `free(node)`: the node's free GPUs now."""
        key = (generation, stale)
        if self._snapshot is not None and self._key == key:
            return self._snapshot
        previous = self._snapshot
        if previous is not None and self._only_allocations_moved(previous, stale):
            changes = {name: free(name) for name in self._dirty if name in records}
            self._snapshot = previous.with_free(changes, generation=generation)
        else:
            self._snapshot = self._rebuild(generation, stale, records, free)
        self._dirty.clear()
        self._key = key
        return self._snapshot

    def _only_allocations_moved(self, previous: ClusterSnapshot, stale: frozenset[str]) -> bool:
        """Whether the next snapshot may derive from `previous` by free GPUs alone.

        True when nothing but allocations changed since it, no node went stale or came back,
        and its clock is recent (it ages link measurements by that clock).
        """
        return (
            self._key is not None
            and self._key[1] == stale
            and all(kinds == _ONLY_ALLOCATIONS for kinds in self._dirty.values())
            and (previous.now is None or self._clock() - previous.now < SNAPSHOT_CLOCK_REUSE_S)
        )

    def _rebuild(
        self,
        generation: int,
        stale: frozenset[str],
        records: Mapping[str, NodeRecord],
        free: Callable[[str], frozenset[int]],
    ) -> ClusterSnapshot:
        """Every node's state afresh (sharing what is unchanged with the last snapshot).

        A node not changed since the last snapshot and as stale as it was there keeps its
        `NodeState` (its free GPUs move only with allocations, which are changes): after one
        report, the next snapshot asks for one node's free GPUs, not every node's."""
        states = []
        previous = self._snapshot  # set with `_key`, always
        before = previous.nodes if previous is not None else {}
        was_stale = self._key[1] if self._key is not None else frozenset()
        for name, rec in records.items():
            kept = before.get(name)
            if (
                kept is not None
                and name not in self._dirty
                and (name in stale) == (name in was_stale)
                and kept.topology is rec.topology
            ):
                states.append(kept)
                continue
            states.append(
                NodeState(
                    topology=rec.topology,
                    free=free(name),
                    labels=dict(rec.labels),
                    placeable=name not in stale and rec.topology.gpu_count > 0,
                    reason="stale"
                    if name in stale
                    else ("no GPUs" if not rec.topology.gpu_count else ""),
                )
            )
        return ClusterSnapshot(states, generation=generation, previous=previous, now=self._clock())
