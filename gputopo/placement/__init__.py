"""Placement: decide where a communication graph runs, on an immutable cluster snapshot.

Policies are one-method protocols (`Policy.place(snapshot, request) -> PlacementResult`) and
live side by side, so every comparison runs them on the same input:

- `gputopo`: the cost-aware policy (`gputopo.placement.costaware`);
- `kueue-bestfit`: Kueue's TAS assignment, faithfully ported (`gputopo.placement.kueue`);
- `first-fit` and `default`: count-only baselines (`gputopo.placement.baselines`).

`place()` is the one entry point: it validates the request, runs the named policy and times it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from gputopo.cluster import ClusterSnapshot
from gputopo.placement import gang, intranode, links
from gputopo.placement.allowed import check, restrict
from gputopo.placement.baselines import DefaultPolicy, FirstFitPolicy
from gputopo.placement.costaware import CostAwarePolicy
from gputopo.placement.kueue import KueueBestFitPolicy
from gputopo.placement.result import (
    EdgePrediction,
    GroupPrediction,
    PlacementResult,
    PodPlacement,
    Prediction,
    Rejection,
)
from gputopo.request import PlacementRequest, validate

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "EdgePrediction",
    "GroupPrediction",
    "PlacementResult",
    "PodPlacement",
    "Policy",
    "Prediction",
    "Rejection",
    "UnknownPolicyError",
    "clear_caches",
    "place",
]


class Policy(Protocol):
    """A placement policy: one decision on one snapshot, whole request or nothing."""

    name: str

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        """Place the request or return why not."""
        ...


class UnknownPolicyError(ValueError):
    """The request names a policy that does not exist."""


DEFAULT_POLICY = "gputopo"
POLICIES: Mapping[str, Policy] = {
    p.name: p for p in (CostAwarePolicy(), KueueBestFitPolicy(), FirstFitPolicy(), DefaultPolicy())
}


def place(
    snapshot: ClusterSnapshot, request: PlacementRequest, *, policy: str | None = None
) -> tuple[PlacementResult, float]:
    """Validate and place a request with a policy; returns the result and the seconds it took.

    The policy is `policy`, else the request's, else `DEFAULT_POLICY`. A group's
    `allowed_nodes` are enforced here, for every policy (`allowed.py`). Raises `RequestError`
    for an invalid request and `UnknownPolicyError` for an unknown policy name.
    """
    validate(request)
    name = policy or request.policy or DEFAULT_POLICY
    try:
        chosen = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}"
        ) from None
    start = time.perf_counter()
    seen, asked, restriction = restrict(snapshot, request)
    result = check(chosen.place(seen, asked), restriction)
    return result, time.perf_counter() - start


def clear_caches() -> None:
    """Forget what the search keeps across decisions (`intranode`, `gang`, the exact rings of
    `links`): benchmarks and tests that time or compare a cold decision start from here, so a
    cache added to one of them is not missed at each of their call sites."""
    intranode.clear_caches()
    gang.clear_caches()
    links.best_ring_of_matrix.cache_clear()
