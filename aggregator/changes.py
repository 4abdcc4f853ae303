"""What the cluster state tells its listeners: a typed kind and a frozen event.

Four consumers (label publisher, scheduler-object writer, the server's probe bookkeeping and
WatchTopology) decide what to do by the kind of a change; a typo in a bare string there would
silently never match. With an enum, mypy and the `match` statements see every kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ChangeEvent", "ChangeKind"]


class ChangeKind(enum.StrEnum):
    """Why a node changed."""

    NODE = "node"  # reported topology, merged fabric position, or back from stale
    LABELS = "labels"  # its Kubernetes labels
    REMOVED = "removed"  # forgotten (its Node object was deleted)
    STALE = "stale"  # it stopped reporting
    ALLOCATION = "allocation"  # reservations moved: only its free GPUs changed


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change of one node; `generation` is the state's generation after it."""

    kind: ChangeKind
    node: str
    generation: int
