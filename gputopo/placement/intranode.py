"""Which GPUs of one node a replica (or part of one) gets.

Greedy choice is wrong here, as NVIDIA's go-gpuallocator notes: on a PCIe server with bridged
pairs, taking GPU0 then "the best partner of GPU0" can split two pairs where taking two whole
pairs keeps both bridges. So every subset of the free GPUs of the right size is scored (a node has
at most 8-16 GPUs; `C(8,4)` = 70) and the best wins, on, in order:

1. the bottleneck bandwidth of the best ring through the subset (bucketed: near-equal rings tie);
2. when the job leaves the node, the network bandwidth its GPUs get (distinct nearest NICs, so a
   gang's GPUs sit on the PCIe switch of their own NIC rather than share one);
3. the fewest NUMA nodes touched;
4. the least damage to what stays free: the remaining free GPUs should keep the best ring they
   can form (so a TP-2 takes a pair that was already broken before it breaks a whole one);
5. the lowest indices, so the answer is deterministic.

Subsets are enumerated up to symmetry: GPUs that see every other GPU over identical links and
share NUMA node and NICs (two GPUs under one PCIe switch, the GPUs of an NVSwitch without NICs)
are interchangeable, so only how many GPUs come from each such *twin class* matters, and each
count vector is scored once, on its lowest indices (the subset the last tie-break would pick).
Keys are compared in two passes: the rest's ring (4) is computed only for the subsets that tie
on 1-3. On a 16-GPU PCIe server a 4-GPU request scores 266 count vectors instead of 1,820
subsets, and rings of more than 8 GPUs use `ringbound` (polynomial) rather than the subset DP.

Answers depend only on the node's shape (`gputopo.cluster.NodeShape`), the mask of its free GPUs
and the count, and are cached on exactly that, so thousands of identical nodes cost one search.
The GPUs come back in ring order: consecutive ranks sit on the best links.

One node's search can never hold up the others: it may look at `NODE_BUDGET` links in all (a
work unit, counted the same on every machine and whether or not a cache answered), and past
that it answers with the best subset weighed so far, `complete=False` and `ring_bound_gbps`, a
ring no choice of those GPUs can beat; `refine` searches such questions again with more budget
in the background, and later answers are the refined ones. What it spends is bounded on the
worst nodes the report's limits allow (128 GPUs on uneven PCIe trees, with noisy measured
links), because:

- rings are compared by bucket on a matrix of buckets (`_bucketed`), where measurement noise
  inside a bucket vanishes and a PCIe tree stays a tree, so the polynomial ring proves itself;
- the ring of what stays free (term 4) is the free GPUs' ring with the subset skipped (O(n) per
  subset, exact on trees, a real ring elsewhere; for one GPU, every candidate's at once), not a
  new search per subset;
- a whole ring is computed and charged only to a question that skips through one (`_Work`): a
  question whose rings, and those of what it leaves free, have at most `EXACT_RING_GPUS` GPUs
  computes none.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import itemgetter

import numpy as np

from gputopo import cost
from gputopo.links import LinkKind
from gputopo.placement.links import EXACT_RING_GPUS, best_ring_of_matrix
from gputopo.placement.ringbound import bounded_ring
from gputopo.shape import NodeShape, node_shape
from gputopo.topology import NodeTopology

__all__ = [
    "ALTERNATIVE_RINGS",
    "MAX_SUBSETS",
    "NODE_BUDGET",
    "REFINE_FACTOR",
    "NodeChoice",
    "candidate_subsets",
    "ceilings",
    "choose",
    "choose_gpus",
    "clear_caches",
    "figures_of",
    "mask_of",
    "network_front",
    "pending_refinements",
    "refine",
    "ring_alternatives",
    "search_work",
    "twin_classes",
]

# Above this many subsets (count vectors over twin classes: 266 for 4 GPUs of a free 16-GPU PCIe
# server, 1,107 for 8) the search falls back to growing the set greedily from each twin class
# (`_grow`), which finds the best ring on PCIe trees and NVSwitches but weighs NICs, NUMA nodes and
# what stays free only among the grown sets (measured in tests/placement/test_intranode_bounded.py).
MAX_SUBSETS = 512
# How many slower ring buckets `ring_alternatives` offers a subset from.
ALTERNATIVE_RINGS = 2
# Links one node's search may look at per question (`choose`, `ceilings`). The worst shapes the
# limits allow need under half of it (tests/placement/test_intranode_worst.py counts them);
# spent, it costs well under a second of pure Python, so one 128-GPU node cannot hold up a Place.
NODE_BUDGET = 1_000_000
# A question cut short is searched again in the background (`refine`) with this many times the
# budget, and the refined answer replaces it; at most `_MAX_KEPT` questions wait or are kept.
REFINE_FACTOR = 8
_MAX_KEPT = 1024
_Key = tuple[NodeShape, int, int, bool, bool]
_pending: OrderedDict[_Key, None] = OrderedDict()
_refined: dict[_Key, NodeChoice] = {}
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """GPUs of one node for one replica, and what the cost model needs to know about them.

    `gpus` are in ring (rank) order. `nic_gbps[i]` is the network bandwidth `gpus[i]` gets when
    the replica leaves the node (its nearest NIC's rate shared by the replica's GPUs on that
    NIC), `nic_names[i]` that NIC ("" when none). `ring_gbps` is infinite for one GPU.
    `complete` is False when the node's budget ran out before every candidate was weighed;
    `ring_bound_gbps` is then a ring no `len(gpus)` of the free GPUs can beat.
    """

    gpus: tuple[int, ...]
    ring_gbps: float
    kind: LinkKind
    nic_gbps: tuple[float, ...]
    nic_names: tuple[str, ...]
    nvlink_gbps: float
    complete: bool = True
    ring_bound_gbps: float = math.inf

    @property
    def min_nic_gbps(self) -> float:
        """The slowest GPU's network share."""
        return min(self.nic_gbps, default=0.0)


def mask_of(gpus: Sequence[int] | frozenset[int]) -> int:
    """Bit mask of GPU indices."""
    m = 0
    for g in gpus:
        m |= 1 << g
    return m


def _bits(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def clear_caches() -> None:
    """Forget every cached answer (benchmarks time the search cold with this)."""
    with _lock:
        _pending.clear()
        _refined.clear()
    _choose.cache_clear()
    _chosen.cache_clear()
    _front.cache_clear()
    _figures.cache_clear()
    _ring_alternatives.cache_clear()
    _score.cache_clear()
    _small_ring_bucket_of.cache_clear()
    _whole_ring.cache_clear()
    _bucketed.cache_clear()
    _bucketed_array.cache_clear()
    _small_ring_of.cache_clear()
    ceilings.cache_clear()
    twin_classes.cache_clear()


def choose_gpus(
    topology: NodeTopology, free: frozenset[int], count: int, *, leaves_node: bool = False
) -> tuple[int, ...] | None:
    """The best `count` GPUs among `free` on this node, in ring (rank) order; None if too few."""
    found = choose(node_shape(topology), mask_of(free), count, leaves_node=leaves_node)
    return None if found is None else found.gpus


def choose(
    shape: NodeShape,
    free_mask: int,
    count: int,
    *,
    leaves_node: bool = False,
    island: bool = False,
) -> NodeChoice | None:
    """The best `count` GPUs of a node of this shape among `free_mask` (see the module
    docstring); None when too few are free. With `island`, all GPUs come from one NVLink island
    (a required NVLink scope on a node whose NVLink stays inside it)."""
    if count <= 0:
        return NodeChoice((), math.inf, LinkKind.NVLINK, (), (), math.inf)
    if free_mask.bit_count() < count:
        return None
    key = (shape, free_mask, count, leaves_node, island)
    refined = _refined.get(key)
    if refined is not None:
        return refined
    return _chosen(*key)


@lru_cache(maxsize=1 << 16)
def _chosen(
    shape: NodeShape, free_mask: int, count: int, leaves_node: bool, island: bool
) -> NodeChoice | None:
    """`_choose`'s answer, without weighing the one candidate when the question is every free
    GPU: `_search` would score it alone, within budget, and return its figures. A whole free
    node for a TP-8, a gang's free trays: the first decision on a cluster asks this of every
    node class it meets, and scoring it builds the node's bucket matrix."""
    if count == free_mask.bit_count() and count <= EXACT_RING_GPUS:
        gpus = _bits(free_mask)
        if not island or _pools(shape, gpus, count) == [gpus]:
            return figures_of(shape, gpus)
    return _choose(shape, free_mask, count, leaves_node, island)[0]


def refine(*, limit: int = 16) -> int:
    """Search again, with `REFINE_FACTOR` times the budget, up to `limit` questions whose answer
    the budget cut short; later `choose` calls get the refined answer. Returns how many were
    refined. The aggregator calls this off the event loop when it is idle (housekeeping), so a
    cut-short answer is served at once and improved in the background."""
    done = 0
    while done < limit:
        with _lock:
            if not _pending:
                break
            key, _ = _pending.popitem(last=False)
        found, _ = _search(*key, budget=NODE_BUDGET * REFINE_FACTOR)
        if found is not None:
            with _lock:
                if len(_refined) >= _MAX_KEPT:
                    _refined.pop(next(iter(_refined)))
                _refined[key] = found
        done += 1
    return done


def pending_refinements() -> int:
    """Questions whose answer was cut short and awaits `refine`."""
    return len(_pending)


def search_work(
    shape: NodeShape,
    free_mask: int,
    count: int,
    *,
    leaves_node: bool = False,
    island: bool = False,
) -> int:
    """The links `choose` looks at for this question (at most about `NODE_BUDGET`): the
    machine-independent measure of its cost that tests bound."""
    if count <= 0 or free_mask.bit_count() < count:
        return 0
    return _choose(shape, free_mask, count, leaves_node, island)[1]


class _Work:
    """Links one node's search may still look at; `short` once it had to stop early."""

    __slots__ = ("budget", "left", "rings", "short")

    def __init__(self, budget: int | None = None) -> None:
        self.left = NODE_BUDGET if budget is None else budget
        self.budget = self.left
        self.short = False
        self.rings: set[bool] = set()

    def whole_ring(self, shape: NodeShape, *, bucketed: bool) -> tuple[int, ...]:
        """`_whole_ring`, charged to this question the first time it uses it (cached or not,
        so that what a question costs does not depend on what ran before). A question that
        needs no ring of more than `EXACT_RING_GPUS` GPUs (one GPU, or a few on a small free
        set) never computes one."""
        order, units = _whole_ring(shape, bucketed=bucketed)
        if bucketed not in self.rings:
            self.rings.add(bucketed)
            self.spend(units)
        return order

    def spend(self, units: int) -> bool:
        """Charge `units`; False (and `short`) when there was nothing left to spend."""
        if self.left <= 0:
            self.short = True
            return False
        self.left -= units
        return True


@lru_cache(maxsize=1 << 16)
def _choose(
    shape: NodeShape, free_mask: int, count: int, leaves_node: bool, island: bool
) -> tuple[NodeChoice | None, int]:
    found, spent = _search(shape, free_mask, count, leaves_node, island, budget=NODE_BUDGET)
    if found is not None and not found.complete:
        with _lock:  # searches run in a thread pool
            if len(_pending) >= _MAX_KEPT:
                _pending.popitem(last=False)
            _pending[(shape, free_mask, count, leaves_node, island)] = None
    return found, spent


def _search(
    shape: NodeShape,
    free_mask: int,
    count: int,
    leaves_node: bool,
    island: bool,
    *,
    budget: int,
) -> tuple[NodeChoice | None, int]:
    free = _bits(free_mask)
    pools = _pools(shape, free, count) if island else [free]
    if not pools:
        return None, 0
    work = _Work(budget)
    if count > EXACT_RING_GPUS:
        work.whole_ring(shape, bucketed=True)  # `_score` skips through it
    scored: list[tuple[tuple[int, float, int], tuple[int, ...]]] = []
    left = work.left  # `work.spend`, inlined: this loop runs for every subset weighed
    for pool in pools:
        for subset in _candidates(shape, pool, count):
            key, units = _score(shape, subset, leaves_node)
            if left > 0:
                left -= units
            else:
                work.short = True
                if scored:
                    break
            scored.append((key, subset))
    work.left = left
    top = min(k for k, _ in scored)
    ties = [s for k, s in scored if k == top]
    if len(ties) > 1:
        rest = _rest_buckets(shape, free, ties, work)
        best = min(ties, key=lambda subset: (rest.get(subset, 10**9), subset))
    else:
        best = ties[0]
    found = figures_of(shape, best)
    spent = work.budget - work.left
    if not work.short:
        return found, spent
    return replace(found, complete=False, ring_bound_gbps=_ring_cap(shape, free, count)), spent


def _ring_cap(shape: NodeShape, free: tuple[int, ...], count: int) -> float:
    """A ring no `count` of the free GPUs beats: every GPU of a ring has two ring neighbours,
    so the bottleneck is at most the best second-best link any free GPU has (O(n^2))."""
    if count <= 1:
        return math.inf
    cap = 0.0
    for g in free:
        links = sorted((shape.bw[g][h] for h in free if h != g), reverse=True)
        cap = max(cap, links[0] if count == 2 else links[1])
    return cap


def _pools(shape: NodeShape, free: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    """The free GPUs of each NVLink island that can hold `count` of them."""
    pools = []
    for isl in shape.islands:
        avail = tuple(g for g in free if g in isl)
        if len(avail) >= count and (count == 1 or len(isl) > 1):
            pools.append(avail)
    return pools


def network_front(shape: NodeShape, free_mask: int, count: int) -> tuple[NodeChoice, ...]:
    """Choices for GPUs that leave the node, best ring first: `choose`'s answer, then each
    subset with a strictly better network share than every choice before it (by ring bucket).

    When a pod's GPUs talk mostly over the network (a pipeline stage, an all-to-all across
    nodes) a slower ring on two NICs beats a bridged pair sharing one; which wins depends on the
    collective, so the caller prices each (there are rarely more than two or three).
    """
    first = choose(shape, free_mask, count, leaves_node=True)
    if first is None or count <= 0:
        return ()
    if count == free_mask.bit_count():
        return (first,)  # the one candidate is `first`: no subset beats its own share
    return (first, *_front(shape, free_mask, count, first.min_nic_gbps))


@lru_cache(maxsize=1 << 14)
def _front(shape: NodeShape, free_mask: int, count: int, above: float) -> tuple[NodeChoice, ...]:
    scored = sorted(
        (_score(shape, subset, True)[0], subset)
        for subset in _candidates(shape, _bits(free_mask), count)
    )
    out = []
    best = above
    for (_, network, _), subset in scored:
        if -network > best:
            out.append(figures_of(shape, subset))
            best = -network
    return tuple(out)


def ring_alternatives(
    shape: NodeShape, free_mask: int, count: int, *, island: bool = False
) -> tuple[NodeChoice, ...]:
    """Besides `choose`'s answer, the best subset (by the module's order) of each of the next
    `ALTERNATIVE_RINGS` ring buckets that leaves a better ring free than the answer does: for a
    caller that places several replicas on one node and compares the wholes."""
    if count <= 1 or free_mask.bit_count() < count:
        return ()
    return _ring_alternatives(shape, free_mask, count, island)


@lru_cache(maxsize=1 << 14)
def _ring_alternatives(
    shape: NodeShape, free_mask: int, count: int, island: bool
) -> tuple[NodeChoice, ...]:
    first = choose(shape, free_mask, count, island=island)
    if first is None:
        return ()
    free = _bits(free_mask)
    pools = _pools(shape, free, count) if island else [free]
    work = _Work()
    if count > EXACT_RING_GPUS:
        work.whole_ring(shape, bucketed=True)
    by_bucket: dict[int, list[tuple[tuple[int, float, int], tuple[int, ...]]]] = {}
    for pool in pools:
        for subset in _candidates(shape, pool, count):
            k, units = _score(shape, subset, False)
            if not work.spend(units):
                break
            by_bucket.setdefault(k[0], []).append((k, subset))
    floor = _rest_buckets(shape, free, [tuple(sorted(first.gpus))], work).get(
        tuple(sorted(first.gpus)), 10**9
    )
    out: list[NodeChoice] = []
    for bucket in sorted(by_bucket)[1 : 1 + ALTERNATIVE_RINGS]:
        rest = _rest_buckets(shape, free, [s for _, s in by_bucket[bucket]], work)
        ranked = sorted(by_bucket[bucket], key=lambda ks: (ks[0], rest.get(ks[1], 10**9), ks[1]))
        k, subset = ranked[0]
        if rest.get(subset, 10**9) < floor:
            out.append(figures_of(shape, subset))
    return tuple(out)


@lru_cache(maxsize=1 << 14)
def ceilings(shape: NodeShape, free_mask: int, count: int) -> tuple[float, float]:
    """(best ring, best network share of the slowest GPU) that `count` of the free GPUs reach,
    each maximised on its own over the candidate subsets: what no choice of those GPUs can beat
    (exact where the candidates are every subset up to symmetry; see `MAX_SUBSETS`)."""
    if count <= 0 or free_mask.bit_count() < count:
        return 0.0, 0.0
    ring = share = 0.0
    work = _Work()
    for subset in _candidates(shape, _bits(free_mask), count):
        ring = max(ring, _ring_ceiling(shape, subset, work))
        share = max(share, min(_nic_shares(shape, subset)[0], default=0.0))
    return ring, share


def _ring_ceiling(shape: NodeShape, subset: tuple[int, ...], work: _Work) -> float:
    """The ring through `subset` as `_ring_bucket` finds it, on the real matrix; once the budget
    is spent, a small subset's proven bound stands in for its ring (never lower)."""
    k = len(subset)
    if k <= 1:
        return math.inf
    if k > EXACT_RING_GPUS:
        order = work.whole_ring(shape, bucketed=False)
        work.spend(len(shape.bw))
        return _skipped(shape.bw, order, subset)
    if work.left > 0:
        gbps, units = _small_ring(shape, subset)
        work.spend(units)
        return gbps
    return bounded_ring(_submatrix(shape.bw, subset)).high


def _small_ring(shape: NodeShape, subset: tuple[int, ...]) -> tuple[float, int]:
    return _small_ring_of(_submatrix(shape.bw, subset))


@lru_cache(maxsize=1 << 14)
def _small_ring_of(sub: tuple[tuple[float, ...], ...]) -> tuple[float, int]:
    """The ring of a submatrix of at most `EXACT_RING_GPUS` GPUs and the links looked at,
    cached on the matrix's values (see `_small_ring_bucket_of`)."""
    found = bounded_ring(sub)
    if found.proven:
        return found.gbps, found.work
    return best_ring_of_matrix(sub)[1], found.work + _dp_units(len(sub))


def candidate_subsets(shape: NodeShape, pool: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    """The subsets of `pool` (sorted GPU indices) of size `count` this module scores: one per
    count vector over twin classes (lowest indices), or the grown sets past `MAX_SUBSETS`.
    Placing several slots one after another on what each leaves free and taking these for
    each covers every joint assignment up to symmetry, since swapping twins is a symmetry of
    the node."""
    return _candidates(shape, pool, count)


def _candidates(shape: NodeShape, pool: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    if count == len(pool):
        return [pool]
    inside = set(pool)
    classes = [tuple(g for g in c if g in inside) for c in twin_classes(shape)]
    classes = [c for c in classes if c]
    if _compositions(tuple(len(c) for c in classes), count) <= MAX_SUBSETS:
        return [tuple(sorted(s)) for s in _representatives(classes, count)]
    return sorted({_grow(shape, pool, c[0], count) for c in classes})


@lru_cache(maxsize=256)
def twin_classes(shape: NodeShape) -> tuple[tuple[int, ...], ...]:
    """GPUs of a node that are interchangeable for placement, lowest index first.

    GPU a and b are twins when every other GPU reaches them over the same bandwidth and link
    kind and they share NUMA node, nearest NICs and NVLink rate; the relation is transitive, so
    it partitions the GPUs. Below `_ARRAY_TWINS` GPUs the rows are compared in Python (numpy's
    per-call cost made this 3-4x slower on 16-20 GPUs, paid by every cold decision); from it
    up, on the arrays. Both give the same classes.
    """
    if shape.gpu_count < _ARRAY_TWINS:
        return _twin_classes_rows(shape)
    return _twin_classes_array(shape)


# From this many GPUs up `twin_classes` works on numpy arrays (`ringbound.ARRAY_GPUS` likewise).
_ARRAY_TWINS = 24


def _twin_classes_rows(shape: NodeShape) -> tuple[tuple[int, ...], ...]:
    """`twin_classes` by comparing each GPU's row with each class leader's, in Python."""
    n = shape.gpu_count
    bw, kind, numa, nics, nvl = shape.bw, shape.kind, shape.numa, shape.nics, shape.nvlink_gbps
    classes: list[list[int]] = []
    for g in range(n):
        bw_g, kind_g = bw[g], kind[g]
        for c in classes:
            h = c[0]
            bw_h, kind_h = bw[h], kind[h]
            if (
                numa[g] == numa[h]
                and nics[g] == nics[h]
                and nvl[g] == nvl[h]
                and all(
                    bw_g[x] == bw_h[x] and kind_g[x] == kind_h[x]
                    for x in range(n)
                    if x not in (g, h)
                )
            ):
                c.append(g)
                break
        else:
            classes.append([g])
    return tuple(tuple(c) for c in classes)


def _twin_classes_array(shape: NodeShape) -> tuple[tuple[int, ...], ...]:
    """`twin_classes` on the node's arrays, comparing only GPUs whose sorted rows match."""
    classes: list[list[int]] = []
    bw, kind = shape.bw_array, shape.kind_array
    # Twins have equal rows once sorted (their link to each other is in both, their 0 and
    # NVLINK diagonal too): only classes whose leader's sorted rows match can take a GPU.
    sorted_bw, sorted_kind = np.sort(bw, axis=1), np.sort(kind, axis=1)
    by_rows: dict[tuple[bytes, bytes], list[int]] = {}
    for g in range(shape.gpu_count):
        similar = by_rows.setdefault((sorted_bw[g].tobytes(), sorted_kind[g].tobytes()), [])
        for i in similar:
            h = classes[i][0]
            same = (bw[g] == bw[h]) & (kind[g] == kind[h])
            same[[g, h]] = True
            if (
                same.all()
                and shape.numa[g] == shape.numa[h]
                and shape.nics[g] == shape.nics[h]
                and shape.nvlink_gbps[g] == shape.nvlink_gbps[h]
            ):
                classes[i].append(g)
                break
        else:
            similar.append(len(classes))
            classes.append([g])
    return tuple(tuple(c) for c in classes)


def _compositions(sizes: tuple[int, ...], count: int) -> int:
    """How many ways to take `count` GPUs as counts per class (class i holds `sizes[i]`)."""
    ways = [1] + [0] * count
    for size in sizes:
        ways = [sum(ways[t - k] for k in range(min(size, t) + 1)) for t in range(count + 1)]
    return ways[count]


def _representatives(classes: Sequence[tuple[int, ...]], count: int) -> list[list[int]]:
    """One subset per count vector: the lowest GPUs of each class."""
    out: list[list[int]] = []
    room = [0] * (len(classes) + 1)
    for i in range(len(classes) - 1, -1, -1):
        room[i] = room[i + 1] + len(classes[i])
    acc: list[int] = []

    def walk(i: int, left: int) -> None:
        if left == 0:
            out.append(acc.copy())
            return
        members = classes[i]
        for k in range(min(len(members), left), max(0, left - room[i + 1]) - 1, -1):
            acc.extend(members[:k])
            walk(i + 1, left - k)
            del acc[len(acc) - k :]

    if room[0] >= count:
        walk(0, count)
    return out


@lru_cache(maxsize=1 << 16)
def _score(
    shape: NodeShape, subset: tuple[int, ...], leaves_node: bool
) -> tuple[tuple[int, float, int], int]:
    """Terms 1-3 of the module docstring's order (4 and 5 in `_rest_buckets` and the caller),
    and the links looked at to get them (charged on every call, cached or not, so that where a
    budget stops does not depend on what ran before)."""
    ring, units = _ring_bucket(shape, subset)
    network = 0.0
    if leaves_node:
        network = -min(_nic_shares(shape, subset)[0], default=0.0)
    numa_nodes = len({shape.numa[g] for g in subset})
    return (ring, network, numa_nodes), units + len(subset)


def _rest_buckets(
    shape: NodeShape, free: tuple[int, ...], subsets: Sequence[tuple[int, ...]], work: _Work
) -> dict[tuple[int, ...], int]:
    """Term 4 for each subset the budget reaches: the ring bucket of the free GPUs it leaves."""
    out: dict[tuple[int, ...], int] = {}
    if not subsets:
        return out
    if len(free) - len(subsets[0]) > EXACT_RING_GPUS:
        order = work.whole_ring(shape, bucketed=True)
        if all(len(s) == 1 for s in subsets):
            left_by_one = _rest_of_one(shape, free, order)
            for subset in subsets:
                if not work.spend(len(shape.bw)):  # what `_ring_bucket` charges for it
                    break
                out[subset] = left_by_one[subset[0]]
            return out
    for subset in subsets:
        taken = set(subset)
        bucket, units = _ring_bucket(shape, tuple(g for g in free if g not in taken))
        if not work.spend(units):
            break
        out[subset] = bucket
    return out


def _rest_of_one(shape: NodeShape, free: tuple[int, ...], order: tuple[int, ...]) -> dict[int, int]:
    """`_ring_bucket(free without g)` for every free GPU g at once.

    In the whole ring restricted to the free GPUs, leaving g out drops its two ring links and
    adds the link between its neighbours; the bottleneck of the rest is the smallest of the
    other links (prefix and suffix minima) and that new one: O(n) for all g, not O(n) each."""
    inside = set(free)
    ring = np.array([g for g in order if g in inside], dtype=np.intp)
    matrix = _bucketed_array(shape)
    after, before = np.roll(ring, -1), np.roll(ring, 1)
    edge = matrix[ring, after]  # edge[i]: ring[i] -> ring[i + 1]
    bridge = matrix[before, after]  # what joins ring[i - 1] to ring[i + 1] once ring[i] is gone
    inf = np.array([np.inf])
    prefix = np.concatenate([inf, np.minimum.accumulate(edge)])  # prefix[j] = min(edge[:j])
    suffix = np.concatenate([np.minimum.accumulate(edge[::-1])[::-1], inf])  # min(edge[j:])
    m = len(ring)
    # ring[i] drops edge[i - 1] and edge[i]: the others are edge[:i - 1] and edge[i + 1:]
    others = np.minimum(prefix[np.maximum(np.arange(m) - 1, 0)], suffix[np.arange(m) + 1])
    others[0] = edge[1 : m - 1].min()
    worst = np.minimum(others, bridge)
    return {int(g): int(-w) for g, w in zip(ring.tolist(), worst.tolist(), strict=True)}


def _ring_bucket(shape: NodeShape, gpus: tuple[int, ...]) -> tuple[int, int]:
    """The bucket of the best ring through `gpus`, and the links looked at to find it.

    The bottleneck ring on the matrix of buckets is the bucket of the bottleneck ring (a bucket
    only falls as bandwidth rises), so this is exact wherever the ring search is. Up to
    `EXACT_RING_GPUS` GPUs it is exact. Past that, it is the ring through the node's whole ring
    (`_whole_ring`) with the other GPUs skipped, O(n): on a PCIe tree every group of GPUs joined
    at one bandwidth is one run of that ring and stays one when GPUs are left out, so this is
    the best ring; elsewhere it is a real ring, never an overestimate. The caller charges the
    whole ring (`_Work.whole_ring`)."""
    k = len(gpus)
    if k <= 1:
        return _bucket(math.inf), 1
    if k > EXACT_RING_GPUS:
        order = _whole_ring(shape, bucketed=True)[0]
        return int(-_skipped(_bucketed(shape), order, gpus)), len(shape.bw)
    return _small_ring_bucket(shape, gpus)


def _small_ring_bucket(shape: NodeShape, gpus: tuple[int, ...]) -> tuple[int, int]:
    return _small_ring_bucket_of(_submatrix(_bucketed(shape), gpus))


@lru_cache(maxsize=1 << 16)
def _small_ring_bucket_of(sub: tuple[tuple[float, ...], ...]) -> tuple[int, int]:
    """`_small_ring_bucket` cached on the submatrix's values rather than on which GPUs: on a
    PCIe tree most subsets of a size see the same few matrices of buckets (a cold 4-GPU
    request over eight 16-GPU servers weighs about 500 subsets, with about 40 distinct
    matrices), so the ring search runs per matrix, not per subset. The answer and the links
    charged are functions of the matrix, so what a question costs stays the same."""
    found = bounded_ring(sub)
    if found.proven:
        return int(-found.gbps), found.work
    return int(-best_ring_of_matrix(sub)[1]), found.work + _dp_units(len(sub))


def _skipped(
    matrix: tuple[tuple[float, ...], ...], order: tuple[int, ...], gpus: Sequence[int]
) -> float:
    """The bottleneck of the ring through `gpus` in the order they take in `order`."""
    inside = set(gpus)
    ring = [g for g in order if g in inside]
    return min(matrix[a][b] for a, b in zip(ring, ring[1:] + ring[:1], strict=True))


@lru_cache(maxsize=256)
def _whole_ring(shape: NodeShape, *, bucketed: bool) -> tuple[tuple[int, ...], int]:
    """A ring through every GPU of the node (on the bucket matrix or the real one), and the
    links looked at to find it: charged once to each search that skips through it."""
    found = bounded_ring(_bucketed_array(shape) if bucketed else shape.bw_array)
    return found.order, found.work


def _dp_units(k: int) -> int:
    """What the subset DP of `best_ring_of_matrix` looks at for k GPUs (a binary search over at
    most k(k-1)/2 thresholds, 2^k k^2 links each)."""
    return (1 << k) * k * k * max(1, (k * (k - 1) // 2).bit_length())


def _submatrix(
    matrix: tuple[tuple[float, ...], ...], gpus: Sequence[int]
) -> tuple[tuple[float, ...], ...]:
    if len(gpus) == 1:
        return ((matrix[gpus[0]][gpus[0]],),)
    row = itemgetter(*gpus)
    return tuple([row(matrix[a]) for a in gpus])


@lru_cache(maxsize=256)
def _bucketed(shape: NodeShape) -> tuple[tuple[float, ...], ...]:
    """The bandwidth matrix with each link replaced by minus its bucket (higher is better)."""
    if shape.gpu_count <= _ROW_BUCKETS:
        return _bucketed_rows(shape)
    return tuple(map(tuple, _bucketed_array(shape).tolist()))


# Up to this many GPUs `_bucketed` buckets link by link: for 8 GPUs (64 links) that costs what
# numpy does warm (23-25 against 21-29 us) and a third less than its first call in a process
# (48 against 70 us); for 16 and 20 GPUs it costs 3-4x numpy's (90-140 against 25-37 us).
_ROW_BUCKETS = EXACT_RING_GPUS


def _bucketed_rows(shape: NodeShape) -> tuple[tuple[float, ...], ...]:
    """`_bucketed` link by link with `_bucket`, the definition `_buckets` reproduces."""
    return tuple(tuple(-float(_bucket(b)) for b in row) for row in shape.bw)


@lru_cache(maxsize=256)
def _bucketed_array(shape: NodeShape) -> np.ndarray:
    """`_bucketed` as a read-only array (`_buckets`, vectorised, past `_ROW_BUCKETS` GPUs)."""
    if shape.gpu_count <= _ROW_BUCKETS:
        out = np.array(_bucketed(shape), dtype=np.float64)
    else:
        out = -_buckets(shape.bw_array.ravel()).reshape(shape.gpu_count, shape.gpu_count)
    out.flags.writeable = False
    return out


def _buckets(gbps: np.ndarray) -> np.ndarray:
    """`_bucket` of each bandwidth, as floats, bit for bit: numpy's logarithm may differ from
    the math module's in the last place, so values whose bucket lies within 1e-9 of a bucket
    edge (and 0, infinite or subnormal ones) are bucketed by `_bucket` itself."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        exact = np.log(1.0 / gbps) / math.log(cost.TIME_BUCKET_RATIO)
        floor = np.floor(exact)
        unsure = (exact - floor < 1e-9) | (floor + 1 - exact < 1e-9) | ~np.isfinite(exact)
    out = floor.astype(np.float64)
    unsure |= ~(gbps > 0) | ~np.isfinite(gbps)
    for i in np.flatnonzero(unsure).tolist():
        out[i] = float(_bucket(float(gbps[i])))
    return out


def _bucket(gbps: float) -> int:
    """Bucket of a bandwidth: higher bandwidth, lower bucket (time buckets of 1/gbps)."""
    if math.isinf(gbps):
        return cost.time_bucket(0.0)
    return cost.time_bucket(1.0 / gbps) if gbps > 0 else 10**9


def _ring_order(shape: NodeShape, subset: Sequence[int]) -> tuple[tuple[int, ...], float]:
    ordered = tuple(sorted(subset))
    if len(ordered) <= 1:
        return ordered, math.inf
    sub = tuple(tuple(shape.bw[a][b] for b in ordered) for a in ordered)
    order, gbps = best_ring_of_matrix(sub)
    return tuple(ordered[i] for i in order), gbps


def _nic_shares(shape: NodeShape, gpus: Sequence[int]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """Each GPU's share of its nearest NIC, in the order of `gpus`.

    Each GPU uses its nearest up NIC; when several are equally near, GPUs are dealt over them
    round robin (as NCCL spreads channels). GPUs of the set that end up on one NIC share its
    rate equally. A GPU with no NIC gets 0.
    """
    use: dict[int, tuple[int, float]] = {}
    load: dict[int, int] = {}
    for g in sorted(gpus):
        near = shape.nics[g]
        if not near:
            continue
        idx, rate = min(near, key=lambda n: (load.get(n[0], 0), n[0]))
        use[g] = (idx, rate)
        load[idx] = load.get(idx, 0) + 1
    shares = []
    names = []
    for g in gpus:
        if g not in use:
            shares.append(0.0)
            names.append("")
            continue
        idx, rate = use[g]
        shares.append(rate / load[idx])
        names.append(shape.nic_names[idx] if idx < len(shape.nic_names) else f"nic{idx}")
    return tuple(shares), tuple(names)


def figures_of(shape: NodeShape, gpus: Sequence[int]) -> NodeChoice:
    """The figures of a given GPU set (ring order, ring bandwidth, NIC shares, ...)."""
    return _figures(shape, tuple(gpus))


@lru_cache(maxsize=1 << 16)
def _figures(shape: NodeShape, gpus: tuple[int, ...]) -> NodeChoice:
    ring, gbps = _ring_order(shape, gpus)
    kind = max(
        (shape.kind[a][b] for i, a in enumerate(ring) for b in ring[i + 1 :]),
        default=LinkKind.NVLINK,
    )
    shares, names = _nic_shares(shape, ring)
    nvl = min((shape.nvlink_gbps[g] for g in ring), default=math.inf)
    return NodeChoice(ring, gbps, kind, shares, names, nvl)


def _grow(shape: NodeShape, pool: tuple[int, ...], start: int, count: int) -> tuple[int, ...]:
    """From `start`, add the GPU whose weakest link to the chosen ones is strongest (lowest
    index on ties) until `count`: Prim's algorithm on the widest links, which on a PCIe tree
    or NVSwitch ends inside the smallest switch that holds `count` GPUs around `start`."""
    chosen = [start]
    others = np.array([g for g in pool if g != start], dtype=np.intp)  # ascending
    weakest = shape.bw_array[start, others]  # a copy
    while len(chosen) < count:
        i = int(np.argmax(weakest))  # the first of equals: the lowest index
        chosen.append(int(others[i]))
        np.minimum(weakest, shape.bw_array[others[i], others], out=weakest)
        weakest[i] = -np.inf  # taken (bandwidths are never negative)
    return tuple(sorted(chosen))
