"""Bandwidth paths between placed GPUs: the best ring through GPUs of one node, and the
narrowest scope that holds a set of nodes (which decides whether nodes talk over a multi-node
NVLink domain or over their NICs).

A ring's bandwidth is the bottleneck link of the best ring through the chosen GPUs (a
bottleneck travelling-salesman problem): exact by a subset DP up to `EXACT_RING_GPUS` GPUs,
beyond that by `ringbound.bounded_ring` (exact on PCIe trees and NVSwitches, polynomial always).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.ringbound import bounded_ring
from gputopo.request import Scope

__all__ = ["EXACT_RING_GPUS", "best_ring_of_matrix", "holds", "span_of"]

# Up to this many GPUs the subset DP is exact and cheap (2^8 * 8^2 steps per threshold); past it
# the DP doubles per GPU (28 s for the rings a 4-GPU request on a 16-GPU server needed).
EXACT_RING_GPUS = 8


@lru_cache(maxsize=65536)
def best_ring_of_matrix(matrix: tuple[tuple[float, ...], ...]) -> tuple[tuple[int, ...], float]:
    """Bottleneck Hamiltonian cycle by threshold search and a subset DP.

    1. Take the distinct bandwidths between the polynomial ring's bottleneck and its bound as
       thresholds.
    2. Binary-search them, asking whether a Hamiltonian cycle exists using only links at or
       above one (Held-Karp reachability over subsets: O(2^n n^2), n <= `EXACT_RING_GPUS`).
    3. The highest threshold that admits a cycle is the answer; rebuild the cycle from the DP.
    Equal bandwidth everywhere (an NVSwitch node) short-circuits to the identity order. Before
    the DP, `ringbound.bounded_ring` is asked (polynomial): its ring is the answer when it is
    proven optimal (always on PCIe trees) or when there are more than `EXACT_RING_GPUS` GPUs.
    """
    n = len(matrix)
    if n == 2:
        return (0, 1), matrix[0][1]
    values = sorted({matrix[i][j] for i in range(n) for j in range(n) if i != j}, reverse=True)
    if len(values) == 1:
        return tuple(range(n)), values[0]
    found = bounded_ring(matrix)
    if found.proven or n > EXACT_RING_GPUS:
        return found.order, found.gbps
    # A cycle on links >= t is one on links >= any lower t: binary search over the thresholds
    # the polynomial ring leaves open (measured links make every bandwidth distinct, and a DP
    # per distinct value was 28 DPs for 8 GPUs), keeping the cycle of the best that admits one.
    candidates = [v for v in values if found.gbps < v <= found.high]
    best: tuple[tuple[int, ...], float] = (found.order, found.gbps)
    lo, hi = 0, len(candidates) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        cycle = _hamiltonian_cycle(matrix, candidates[mid])
        if cycle is None:
            lo = mid + 1
        else:
            best = (cycle, candidates[mid])
            hi = mid - 1
    return best


def _hamiltonian_cycle(
    matrix: tuple[tuple[float, ...], ...], threshold: float
) -> tuple[int, ...] | None:
    n = len(matrix)
    ok = [[matrix[i][j] >= threshold and i != j for j in range(n)] for i in range(n)]
    full = (1 << n) - 1
    # reach[mask] = bitset of end vertices v such that a path from 0 visiting `mask` ends at v
    reach = [0] * (1 << n)
    reach[1] = 1
    for mask in range(1, full + 1):
        ends = reach[mask]
        if not ends or not mask & 1:
            continue
        for v in range(n):
            if not ends >> v & 1:
                continue
            for w in range(n):
                if not mask >> w & 1 and ok[v][w]:
                    reach[mask | 1 << w] |= 1 << w
    last = next((v for v in range(1, n) if reach[full] >> v & 1 and ok[v][0]), None)
    if last is None:
        return None
    # Walk back: find a predecessor of `last` in mask without it, and so on.
    path = [last]
    mask, v = full, last
    while v != 0:
        prev_mask = mask & ~(1 << v)
        v = next(u for u in range(n) if reach[prev_mask] >> u & 1 and ok[u][v])
        mask = prev_mask
        path.append(v)
    path.reverse()
    return tuple(path[:-1]) if path[0] == path[-1] else tuple(path)


def span_of(snapshot: ClusterSnapshot, nodes: Sequence[str]) -> Scope:
    """The narrowest scope that holds all the given nodes."""
    unique = sorted(set(nodes))
    if len(unique) <= 1:
        return Scope.NODE
    for scope in (Scope.NVLINK, Scope.LEAF, Scope.SPINE, Scope.CORE, Scope.ZONE):
        ids = {snapshot.domain_of(n, scope) for n in unique}
        if len(ids) == 1 and None not in ids and "" not in ids:
            return scope
    return Scope.CLUSTER


def holds(snapshot: ClusterSnapshot, nodes: Sequence[str], scope: Scope) -> bool:
    """Whether one domain of `scope` holds all the nodes.

    Scopes do not nest strictly: a multi-node NVLink domain can straddle two leaves, so "the
    narrowest scope holding them" (`span_of`) is not enough to check a required scope.
    """
    unique = set(nodes)
    if scope is Scope.CLUSTER or len(unique) <= 1:
        return True
    if scope is Scope.NODE:
        return False
    ids = {snapshot.domain_of(n, scope) for n in unique}
    return len(ids) == 1 and None not in ids and "" not in ids
