"""What a placement decision returns: pod assignments, predicted figures and reasons.

A result is a value: it carries either the assignment with its prediction, or `placed=False`
with a summary `reason` and one `Rejection` per domain that was considered and turned down, so a
caller (or a person reading `gputopo place --json`) can see which constraint failed where.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gputopo.request import Scope

__all__ = [
    "EdgePrediction",
    "GroupPrediction",
    "PlacementResult",
    "PodPlacement",
    "Prediction",
    "Rejection",
]


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod of one replica of a group goes. `gpus` are in rank order."""

    group: str
    replica: int
    pod: int
    rank: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GroupPrediction:
    """Predicted collective performance of a group's slowest replica."""

    group: str
    bus_gbps: float
    collective_seconds: float
    bottleneck: str
    span: Scope
    message_bytes: int


@dataclass(frozen=True, slots=True)
class EdgePrediction:
    """Predicted bandwidth of an edge over its worst pair of replicas."""

    source: str
    target: str
    gbps: float
    transfer_seconds: float
    satisfied: bool


@dataclass(frozen=True, slots=True)
class Prediction:
    """Everything predicted about a placement; `communication_seconds` is the objective."""

    groups: tuple[GroupPrediction, ...]
    edges: tuple[EdgePrediction, ...]
    communication_seconds: float
    bottleneck_gbps: float


@dataclass(frozen=True, slots=True)
class Rejection:
    """A domain that was considered and turned down, with a machine-readable code."""

    domain: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """The outcome of one placement decision."""

    placed: bool
    policy: str
    pods: tuple[PodPlacement, ...] = ()
    prediction: Prediction | None = None
    reason: str = ""
    rejections: tuple[Rejection, ...] = ()

    def allocation(self) -> Mapping[str, frozenset[int]]:
        """GPUs taken per node."""
        out: dict[str, set[int]] = {}
        for pod in self.pods:
            out.setdefault(pod.node, set()).update(pod.gpus)
        return {node: frozenset(gpus) for node, gpus in out.items()}

    @property
    def gpu_count(self) -> int:
        """GPUs taken in total."""
        return sum(len(p.gpus) for p in self.pods)
