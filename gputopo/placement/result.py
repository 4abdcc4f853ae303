"""What a placement decision returns: pod assignments, predicted figures and reasons.

A result is a value: it carries either the assignment with its prediction, or `placed=False`
with a summary `reason` and one `Rejection` per domain that was considered and turned down, so a
caller (or a person reading `gputopo place --json`) can see which constraint failed where.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from gputopo.request import Scope

__all__ = [
    "EdgePrediction",
    "GroupPrediction",
    "PlacementResult",
    "PodPlacement",
    "Prediction",
    "Rejection",
    "RejectionCode",
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
    # What the answer names beside the indices (`gputopo.core.with_nics`), in the order of
    # `gpus`: the GPUs' UUIDs and each GPU's nearest NIC ("" for none). Not part of the
    # placement's identity: two placements on the same GPUs are the same placement.
    uuids: tuple[str, ...] = field(default=(), compare=False, repr=False)
    nics: tuple[str, ...] = field(default=(), compare=False, repr=False)


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


class RejectionCode(enum.StrEnum):
    """Why a domain was turned down, for machines (enough for a caller to tell "wait for GPUs
    to free up" from "cannot fit as asked"). The values are the wire strings; placement.proto's
    comment on `Rejection.code` lists exactly these (a test holds the two together)."""

    INSUFFICIENT_GPUS = "insufficient_gpus"  # fewer free GPUs than needed
    FRAGMENTED = "fragmented"  # enough free GPUs, not in the shape asked for
    BANDWIDTH = "bandwidth"  # no placement here meets an edge's bandwidth
    SCOPE = "scope"  # the required scope cannot hold it
    SPREAD = "spread"  # replicas would share a failure domain they must not
    SELECTOR = "selector"  # no node matches the node selectors
    UNHEALTHY = "unhealthy"  # every node that could take it is stale or unhealthy
    UNIT = "unit"  # one unit of a multi-unit request failed here
    MORE = "more"  # further rejections left out of the answer
    UNSUPPORTED = "unsupported"  # the policy cannot express the request
    KUEUE = "kueue"  # the Kueue baseline refused (its own reason)
    INTERNAL = "internal"  # a policy broke a rule it must keep (a bug)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A domain that was considered and turned down, with a machine-readable code.

    `domain` is `gputopo.domains.domain_name` (`tier-0/core/spine-1/leaf-2`, `node/h100-3`) or
    a word for the whole placement (`placement`, `kueue`, `...`)."""

    domain: str
    code: RejectionCode
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
