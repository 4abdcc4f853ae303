"""The best ring through many GPUs of one node, in time that grows polynomially with them.

The exact bottleneck ring (`links.best_ring_of_matrix`, Held-Karp over subsets) costs
O(2^n n^2) per threshold: fine for the 8 GPUs of most nodes, seconds for the 16-20 GPUs of a
DGX-2-class or L40S PCIe server, and it runs again for every candidate subset. Past
`links.EXACT_RING_GPUS` GPUs this module answers instead, exactly where the node's links form a
tree and near-optimally elsewhere:

1. *Lower end*: order the GPUs the way single-linkage clustering groups them (Prim's algorithm
   on the widest links). Every group of GPUs joined at a given bandwidth is then one contiguous
   run of the order, so consecutive ranks sit on the best links. The ring through that order is
   a real ring; its bottleneck `low` is achievable.
2. *Upper end*: no ring beats `high` = min(the bandwidth at which the GPUs first form one
   connected group, the second-best link of every GPU): a ring is connected, and every GPU has
   two ring neighbours.
3. If `low == high` the order is optimal. It always is when the bandwidth matrix is an
   ultrametric (bw(a, c) >= min(bw(a, b), bw(b, c))), which is what a PCIe tree gives (PIX <
   PXB < NODE < SYS by the common ancestor), an NVSwitch (all equal), and NVLink-bridged pairs
   under a PCIe tree: each group joined at bandwidth t is then a clique of links >= t.
4. Otherwise, thresholds between `low` and `high` are tried from the top with a depth-first
   search for a Hamiltonian cycle that stops after `STEP_BUDGET` steps (at most
   `MAX_THRESHOLDS` thresholds); the first cycle found
   wins, else the order of step 1. The answer is then a lower bound on the best ring (never an
   overestimate of the bandwidth), at most `high / low` away from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["MAX_THRESHOLDS", "STEP_BUDGET", "RingBound", "bounded_ring"]

# Depth-first steps allowed per threshold, and thresholds tried, when the matrix is not a tree
# (step 4): each step costs O(n^2), so this caps step 4 near a few milliseconds at 32 GPUs.
STEP_BUDGET = 400
MAX_THRESHOLDS = 4

Matrix = Sequence[Sequence[float]]


class RingBound(NamedTuple):
    """A ring through the GPUs and how good it is known to be."""

    order: tuple[int, ...]  # GPU positions in ring order
    gbps: float  # bottleneck of the ring through `order`
    high: float  # no ring through these GPUs has a bottleneck above this

    @property
    def proven(self) -> bool:
        """Whether the ring is known to be optimal."""
        return self.gbps >= self.high


def _ring_gbps(matrix: Matrix, order: Sequence[int]) -> float:
    n = len(order)
    return min(matrix[order[i]][order[(i + 1) % n]] for i in range(n))


def _linkage_order(matrix: Matrix) -> tuple[tuple[int, ...], float]:
    """Single-linkage order (step 1) and the bandwidth at which all GPUs are first connected.

    Prim's algorithm on the widest links from GPU 0 (lowest index on ties): it takes no link
    below t while a GPU joined to the visited ones at t or more is left, so every group joined
    at t or more is visited as one run; the narrowest link it takes is where all are connected.
    O(n^2), no sort.
    """
    n = len(matrix)
    order = [0]
    key = list(matrix[0])
    left = set(range(1, n))
    joined_at = float("inf")
    while left:
        nxt = max(sorted(left), key=key.__getitem__)
        joined_at = min(joined_at, key[nxt])
        order.append(nxt)
        left.discard(nxt)
        row = matrix[nxt]
        for g in left:
            key[g] = max(key[g], row[g])
    return tuple(order), joined_at


def _hamiltonian(matrix: Matrix, threshold: float, budget: int) -> tuple[int, ...] | None:
    """A Hamiltonian cycle on links >= threshold, by depth-first search with a step budget
    (fewest onward links first); None when none was found within the budget."""
    n = len(matrix)
    near = [[w for w in range(n) if w != v and matrix[v][w] >= threshold] for v in range(n)]
    if any(len(ws) < 2 for ws in near):
        return None
    path = [0]
    seen = {0}
    steps = 0

    def walk() -> bool:
        nonlocal steps
        steps += 1
        if steps > budget:
            return False
        v = path[-1]
        if len(path) == n:
            return matrix[v][0] >= threshold
        onward = sorted(
            (w for w in near[v] if w not in seen),
            key=lambda w: (sum(1 for x in near[w] if x not in seen), w),
        )
        for w in onward:
            path.append(w)
            seen.add(w)
            if walk():
                return True
            path.pop()
            seen.discard(w)
        return False

    return tuple(path) if walk() else None


def bounded_ring(matrix: Matrix) -> RingBound:
    """The best ring found through all GPUs of `matrix` (see the module docstring)."""
    n = len(matrix)
    if n <= 1:
        return RingBound(tuple(range(n)), float("inf"), float("inf"))
    if n == 2:
        return RingBound((0, 1), matrix[0][1], matrix[0][1])
    order, joined_at = _linkage_order(matrix)
    low = _ring_gbps(matrix, order)
    second = min(
        sorted((matrix[v][w] for w in range(n) if w != v), reverse=True)[1] for v in range(n)
    )
    high = min(joined_at, second)
    if low >= high:
        return RingBound(order, low, high)
    values = sorted(
        {matrix[i][j] for i in range(n) for j in range(n) if i != j and low < matrix[i][j] <= high},
        reverse=True,
    )
    for threshold in values[:MAX_THRESHOLDS]:
        cycle = _hamiltonian(matrix, threshold, STEP_BUDGET)
        if cycle is not None:
            return RingBound(cycle, _ring_gbps(matrix, cycle), high)
    return RingBound(order, low, high)
