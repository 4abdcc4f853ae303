"""The optimal placement of a small request, by trying every placement there is.

A yardstick, not a policy: every pod tries every node and every subset of its free GPUs of the
pod's size, every complete assignment that breaks no hard rule (`constraints.violations`, edges
included) is predicted (`predict.predict`), and the least predicted communication time wins.
Exponential by nature: `optimum` refuses instances with more than `max_trials` assignments.
Benchmarks compare each policy's predicted time against this optimum
(`quality_vs_optimal`), and tests use it to check the engine on tiny clusters.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.constraints import violations
from gputopo.placement.predict import predict
from gputopo.placement.result import PodPlacement
from gputopo.request import PlacementRequest

__all__ = ["Optimum", "TooLargeError", "optimum"]


class TooLargeError(ValueError):
    """The instance has more assignments than the caller allowed."""


@dataclass(frozen=True, slots=True)
class Optimum:
    """The best predicted communication time, a placement that reaches it, and how many valid
    placements there were (0: the request cannot be placed; `seconds` is then inf)."""

    seconds: float
    pods: tuple[PodPlacement, ...]
    valid: int


def _options(snapshot: ClusterSnapshot, size: int) -> list[tuple[str, tuple[int, ...]]]:
    out: list[tuple[str, tuple[int, ...]]] = []
    for name, state in snapshot.nodes.items():
        if not state.placeable:
            continue
        out.extend((name, subset) for subset in itertools.combinations(sorted(state.free), size))
    return out


def optimum(
    snapshot: ClusterSnapshot, request: PlacementRequest, *, max_trials: int = 200_000
) -> Optimum:
    """The optimal placement (see the module docstring); `TooLargeError` past `max_trials`."""
    pods: list[tuple[str, int, int]] = [
        (g.name, r, p) for g in request.groups for r in range(g.replicas) for p in range(g.pods)
    ]
    sizes = {g.name: g.gpus_per_pod for g in request.groups}
    options = {size: _options(snapshot, size) for size in set(sizes.values())}
    trials = math.prod(len(options[sizes[g]]) for g, _, _ in pods)
    if trials > max_trials:
        raise TooLargeError(f"{trials} assignments, more than {max_trials}")
    best: tuple[float, tuple[PodPlacement, ...]] | None = None
    valid = 0
    for assignment in _assignments(pods, sizes, options):
        placed = tuple(
            PodPlacement(g, r, p, p * sizes[g], node, gpus)
            for (g, r, p), (node, gpus) in zip(pods, assignment, strict=True)
        )
        prediction = predict(snapshot, request, placed)
        if violations(snapshot, request, placed, prediction=prediction):
            continue
        valid += 1
        seconds = prediction.communication_seconds
        if best is None or seconds < best[0]:
            best = (seconds, placed)
    if best is None:
        return Optimum(math.inf, (), 0)
    return Optimum(best[0], best[1], valid)


def _assignments(
    pods: list[tuple[str, int, int]],
    sizes: dict[str, int],
    options: dict[int, list[tuple[str, tuple[int, ...]]]],
) -> Iterator[tuple[tuple[str, tuple[int, ...]], ...]]:
    """Every assignment of pods to (node, GPUs), GPUs never shared, skipping overlaps early."""

    def walk(
        i: int, used: frozenset[tuple[str, int]], acc: tuple[tuple[str, tuple[int, ...]], ...]
    ) -> Iterator[tuple[tuple[str, tuple[int, ...]], ...]]:
        if i == len(pods):
            yield acc
            return
        for node, gpus in options[sizes[pods[i][0]]]:
            taken = {(node, g) for g in gpus}
            if taken & used:
                continue
            yield from walk(i + 1, used | taken, (*acc, (node, gpus)))

    yield from walk(0, frozenset(), ())
