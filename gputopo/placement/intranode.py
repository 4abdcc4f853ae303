"""Which GPUs of one node a replica (or part of one) gets.

Greedy choice is wrong here, as NVIDIA's go-gpuallocator notes: on a PCIe server with bridged
pairs, taking GPU0 then "the best partner of GPU0" can split two pairs where taking two whole
pairs keeps both bridges. So every subset of the free GPUs of the right size is scored (a node has
at most 8-16 GPUs; `C(8,4)` = 70) and the best wins, on, in order:

1. the bottleneck bandwidth of the best ring through the subset (bucketed: near-equal rings tie);
2. when the job leaves the node, the network bandwidth its GPUs get (distinct nearest NICs);
3. the fewest NUMA nodes touched;
4. the least damage to what stays free: the remaining free GPUs should keep the best ring they
   can form (so a TP-2 takes a pair that was already broken before it breaks a whole one);
5. the lowest indices, so the answer is deterministic.

Results are cached by the node's link matrix restricted to the free GPUs, so thousands of
identical nodes cost one search.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from gputopo import cost
from gputopo.placement.links import best_ring, best_ring_of_matrix, nic_share_gbps
from gputopo.topology import NodeTopology

__all__ = ["MAX_SUBSETS", "choose_gpus"]

# Above this many subsets (a 16-GPU node asked for 8 of 16 free is 12,870) the search falls back
# to growing the set greedily from each start GPU, which is exact on switch-based nodes.
MAX_SUBSETS = 4096


def choose_gpus(
    topology: NodeTopology, free: frozenset[int], count: int, *, leaves_node: bool = False
) -> tuple[int, ...] | None:
    """The best `count` GPUs among `free` on this node, in ring (rank) order; None if too few."""
    if count <= 0:
        return ()
    if count > len(free):
        return None
    key = _signature(topology, free, leaves_node=leaves_node)
    best = _choose(key, count)
    ordered_free = sorted(free)
    chosen = [ordered_free[i] for i in best]
    ring, _ = best_ring(topology, chosen)
    return ring


class _Signature(NamedTuple):
    """What the choice depends on, as a hashable value (positions are indices into `free`)."""

    matrix: tuple[tuple[float, ...], ...]
    numa: tuple[int | None, ...]
    nics: tuple[tuple[int, ...], ...]
    nic_rates: tuple[float, ...]


def _signature(topology: NodeTopology, free: frozenset[int], *, leaves_node: bool) -> _Signature:
    ordered = sorted(free)
    matrix = tuple(
        tuple(round(_pair(topology, a, b), 3) if a != b else 0.0 for b in ordered) for a in ordered
    )
    numa = tuple(topology.gpus[g].numa_node for g in ordered)
    nics = tuple(topology.nearest_nics(g) for g in ordered) if leaves_node else ()
    nic_rates = tuple(nic_share_gbps(topology, [g])[g][0] for g in ordered) if leaves_node else ()
    return _Signature(matrix, numa, nics, nic_rates)


def _pair(topology: NodeTopology, a: int, b: int) -> float:
    link = topology.gpu_link(a, b)
    return link.bandwidth_gbps() if link is not None else 0.0


@lru_cache(maxsize=65536)
def _choose(signature: _Signature, count: int) -> tuple[int, ...]:
    matrix, numa, nics, nic_rates = signature
    n = len(matrix)
    everyone = tuple(range(n))
    if count == n:
        return everyone
    if math.comb(n, count) <= MAX_SUBSETS:
        candidates: Sequence[tuple[int, ...]] = list(itertools.combinations(everyone, count))
    else:
        candidates = [_grow(matrix, start, count) for start in everyone]

    def score(subset: tuple[int, ...]) -> tuple[object, ...]:
        ring = _ring_of(matrix, subset)
        rest = tuple(i for i in everyone if i not in subset)
        rest_ring = _ring_of(matrix, rest) if len(rest) > 1 else math.inf
        network = 0.0
        if nics:
            used: dict[int, int] = {}
            for i in subset:
                for nic in nics[i][:1]:
                    used[nic] = used.get(nic, 0) + 1
            network = -min(
                (nic_rates[i] / max(used.get(nics[i][0], 1), 1) if nics[i] else 0.0) for i in subset
            )
        numa_nodes = len({numa[i] for i in subset})
        return (
            cost.time_bucket(1.0 / ring) if ring > 0 else 10**9,
            network,
            numa_nodes,
            cost.time_bucket(1.0 / rest_ring) if rest_ring > 0 else 10**9,
            subset,
        )

    return min(candidates, key=score)


def _ring_of(matrix: tuple[tuple[float, ...], ...], subset: Sequence[int]) -> float:
    if len(subset) <= 1:
        return math.inf
    sub = tuple(tuple(matrix[a][b] for b in subset) for a in subset)
    return best_ring_of_matrix(sub)[1]


def _grow(matrix: tuple[tuple[float, ...], ...], start: int, count: int) -> tuple[int, ...]:
    chosen = [start]
    rest = set(range(len(matrix))) - {start}
    while len(chosen) < count:
        nxt = max(sorted(rest), key=lambda c: min(matrix[c][x] for x in chosen))
        chosen.append(nxt)
        rest.discard(nxt)
    return tuple(sorted(chosen))
