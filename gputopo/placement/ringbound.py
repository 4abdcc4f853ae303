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
   search for a Hamiltonian cycle (at most `MAX_THRESHOLDS` thresholds) that stops once it has
   looked at `WORK_BUDGET` links in all, whatever the number of GPUs; the first cycle found
   wins, else the order of step 1. The answer is then a lower bound on the best ring (never an
   overestimate of the bandwidth), at most `high / low` away from it.

From `ARRAY_GPUS` GPUs up, steps 1-3 and each threshold's neighbour lists run on a numpy array
(a 128-GPU ring of tests/placement/test_intranode_worst.py: 0.5-2.7 ms of CPU against 1.9-6.4 ms
in Python); the answer, ties included, is the same (tested there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["ARRAY_GPUS", "MAX_THRESHOLDS", "WORK_BUDGET", "RingBound", "bounded_ring"]

# Links the depth-first search of step 4 may look at per ring, over all thresholds tried: a
# step used to cost O(n^2) and its budget counted steps, so a 128-GPU ring that was not a tree
# took seconds. Counting links caps step 4 near 10 ms however many GPUs the ring has.
WORK_BUDGET = 20_000
MAX_THRESHOLDS = 4
# From this many GPUs up the matrix is worked on as a numpy array (below, converting costs more
# than it saves).
ARRAY_GPUS = 24

Matrix = Sequence[Sequence[float]] | np.ndarray


class RingBound(NamedTuple):
    """A ring through the GPUs and how good it is known to be."""

    order: tuple[int, ...]  # GPU positions in ring order
    gbps: float  # bottleneck of the ring through `order`
    high: float  # no ring through these GPUs has a bottleneck above this
    work: int = 0  # links looked at to find it (what callers charge to their budgets)

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


def _linkage_order_array(matrix: np.ndarray) -> tuple[tuple[int, ...], float]:
    """`_linkage_order` on an array: the same order (argmax takes the lowest index of a tie, as
    `max` over the sorted indices does) with each step one vector operation."""
    n = len(matrix)
    order = [0]
    key = np.array(matrix[0], dtype=np.float64)
    key[0] = -np.inf  # visited GPUs never win again
    joined_at = float("inf")
    for _ in range(n - 1):
        nxt = int(np.argmax(key))
        joined_at = min(joined_at, float(key[nxt]))
        order.append(nxt)
        np.maximum(key, matrix[nxt], out=key, where=key != -np.inf)
        key[nxt] = -np.inf
    return tuple(order), joined_at


class _Budget:
    """Links the search may still look at (shared by the thresholds of one ring)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


def _hamiltonian(matrix: Matrix, threshold: float, budget: _Budget) -> tuple[int, ...] | None:
    """A Hamiltonian cycle on links >= threshold, by depth-first search (fewest onward links
    first); None when none was found before the budget ran out. Each GPU's count of unvisited
    neighbours is kept up to date, so a step costs the links of the GPU it enters."""
    if isinstance(matrix, np.ndarray):
        return _hamiltonian_array(matrix, threshold, budget)
    n = len(matrix)
    near = [[w for w in range(n) if w != v and matrix[v][w] >= threshold] for v in range(n)]
    budget.left -= n * n
    if budget.left < 0 or any(len(ws) < 2 for ws in near):
        return None
    onward_count = [len(ws) for ws in near]
    seen = [False] * n

    def enter(v: int) -> None:
        seen[v] = True
        for x in near[v]:
            onward_count[x] -= 1
        budget.left -= len(near[v])

    def leave(v: int) -> None:
        seen[v] = False
        for x in near[v]:
            onward_count[x] += 1

    def onward(v: int) -> list[int]:
        return [w for _, w in sorted((onward_count[w], w) for w in near[v] if not seen[w])]

    return _walk(matrix, threshold, budget, enter=enter, leave=leave, onward=onward)


def _hamiltonian_array(
    matrix: np.ndarray, threshold: float, budget: _Budget
) -> tuple[int, ...] | None:
    """`_hamiltonian` with each step's bookkeeping as vector operations: the same search in
    the same order (fewest onward links, then lowest index) charging the same links."""
    n = len(matrix)
    above = matrix >= threshold
    np.fill_diagonal(above, False)
    near = [np.flatnonzero(row) for row in above]
    budget.left -= n * n
    if budget.left < 0 or any(len(ws) < 2 for ws in near):
        return None
    onward_count = above.sum(axis=1)
    seen = np.zeros(n, dtype=bool)

    def enter(v: int) -> None:
        seen[v] = True
        onward_count[near[v]] -= 1
        budget.left -= len(near[v])

    def leave(v: int) -> None:
        seen[v] = False
        onward_count[near[v]] += 1

    def onward(v: int) -> list[int]:
        ws = near[v][~seen[near[v]]]
        out: list[int] = ws[np.lexsort((ws, onward_count[ws]))].tolist()
        return out

    return _walk(matrix, threshold, budget, enter=enter, leave=leave, onward=onward)


def _walk(
    matrix: Matrix,
    threshold: float,
    budget: _Budget,
    *,
    enter: Callable[[int], None],
    leave: Callable[[int], None],
    onward: Callable[[int], list[int]],
) -> tuple[int, ...] | None:
    """The depth-first search of `_hamiltonian` from GPU 0, given its bookkeeping: `enter` and
    `leave` a GPU (charging `budget`), and the unvisited neighbours of a GPU in the order to
    try them."""
    n = len(matrix)
    path = [0]

    def walk() -> bool:
        if budget.left < 0:
            return False
        v = path[-1]
        if len(path) == n:
            return bool(matrix[v][0] >= threshold)
        for w in onward(v):
            if budget.left < 0:  # spent: stop here rather than enter each sibling to find out
                return False
            path.append(w)
            enter(w)
            if walk():
                return True
            path.pop()
            leave(w)
        return False

    enter(0)
    return tuple(path) if walk() else None


def bounded_ring(matrix: Matrix, *, budget: int = WORK_BUDGET) -> RingBound:
    """The best ring found through all GPUs of `matrix` (see the module docstring), step 4
    looking at no more than `budget` links."""
    n = len(matrix)
    if n <= 1:
        return RingBound(tuple(range(n)), float("inf"), float("inf"), 1)
    if n == 2:
        return RingBound((0, 1), float(matrix[0][1]), float(matrix[0][1]), 1)
    array = None
    if n >= ARRAY_GPUS:
        array = np.asarray(matrix, dtype=np.float64)
        order, joined_at = _linkage_order_array(array)
        off = array.copy()
        np.fill_diagonal(off, -np.inf)
        second = float(np.sort(off, axis=1)[:, -2].min())
    else:
        order, joined_at = _linkage_order(matrix)
        second = min(_second_best(matrix[v], v) for v in range(n))
    low = float(_ring_gbps(matrix, order))
    high = min(joined_at, second)
    base = 3 * n * n  # the linkage order, the second-best links, the thresholds
    if low >= high:
        return RingBound(order, low, high, base)
    if array is not None:
        inside = array[(array > low) & (array <= high) & ~np.eye(n, dtype=bool)]
        ranked = np.sort(inside)[::-1]  # (np.unique would import numpy.ma on first use)
        values = [float(v) for v in ranked[np.r_[True, ranked[1:] != ranked[:-1]]]]
    else:
        values = sorted(
            {
                matrix[i][j]
                for i in range(n)
                for j in range(n)
                if i != j and low < matrix[i][j] <= high
            },
            reverse=True,
        )
    left = _Budget(budget)
    for threshold in values[:MAX_THRESHOLDS]:
        cycle = _hamiltonian(matrix if array is None else array, threshold, left)
        if cycle is not None:
            gbps = float(_ring_gbps(matrix, cycle))
            return RingBound(cycle, gbps, high, base + budget - left.left)
    return RingBound(order, low, high, base + budget - max(left.left, 0))


def _second_best(row: Sequence[float], skip: int) -> float:
    """The second-highest entry of a row, leaving out position `skip` (O(n), no sort)."""
    first = second = float("-inf")
    for i, x in enumerate(row):
        if i == skip:
            continue
        if x > first:
            first, second = x, first
        elif x > second:
            second = x
    return second
