"""Bounded intra-node search: the polynomial ring beyond 8 GPUs, and subsets up to symmetry."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gputopo.machines import describe_profiles, load_machine
from gputopo.placement import intranode, links
from gputopo.placement.intranode import choose, figures_of, twin_classes
from gputopo.placement.ringbound import bounded_ring
from gputopo.shape import node_shape
from gputopo.sim.pcieserver import pcie_server, pcie_tree, switch_groups, uneven_tree
from tests.builders import nvswitch_node, pcie_node
from tests.checked import checked, checks_at_least

Matrix = tuple[tuple[float, ...], ...]


def _exact(matrix: Matrix) -> float:
    """The best ring's bottleneck by trying every ring (n <= 8)."""
    n = len(matrix)
    best = 0.0
    for rest in itertools.permutations(range(1, n)):
        order = (0, *rest)
        best = max(best, min(matrix[order[i]][order[(i + 1) % n]] for i in range(n)))
    return best


def _ring(matrix: Matrix, order: tuple[int, ...]) -> float:
    n = len(order)
    return min(matrix[order[i]][order[(i + 1) % n]] for i in range(n))


def _tree_matrix(n: int, rng: random.Random) -> Matrix:
    """An ultrametric matrix: GPUs as leaves of a random tree, bandwidth by common ancestor."""
    path = [tuple(rng.randrange(2) for _ in range(3)) for _ in range(n)]
    level_gbps = (18.0, 19.5, 22.0, 26.0)
    rows = []
    for a in range(n):
        row = []
        for b in range(n):
            common = next((d for d in range(3) if path[a][d] != path[b][d]), 3)
            row.append(0.0 if a == b else level_gbps[common])
        rows.append(tuple(row))
    return tuple(rows)


@pytest.mark.parametrize(
    ("gpus", "want_gbps"),
    [
        pytest.param(16, 18.587, id="a 16-GPU PCIe server's full ring crosses the sockets once"),
        pytest.param(20, 18.587, id="so does a 20-GPU server's"),
    ],
)
def test_a_whole_pcie_server_gets_a_proven_ring(gpus: int, want_gbps: float) -> None:
    shape = node_shape(pcie_server("p", gpus=gpus))
    found = bounded_ring(shape.bw)
    assert found.proven
    assert found.gbps == pytest.approx(want_gbps)
    assert sorted(found.order) == list(range(gpus))
    # consecutive ranks share a switch wherever they can: one SYS hop out, one back
    kinds = [shape.kind[a][b].name for a, b in itertools.pairwise((*found.order, found.order[0]))]
    assert kinds.count("SYS") == 2


@given(seed=st.integers(0, 10_000), n=st.integers(3, 8))
@settings(max_examples=60, deadline=None)
def test_on_a_pcie_tree_the_polynomial_ring_is_the_exact_one(seed: int, n: int) -> None:
    matrix = _tree_matrix(n, random.Random(seed))
    found = bounded_ring(matrix)
    assert found.proven
    assert found.gbps == _exact(matrix)
    assert _ring(matrix, found.order) == found.gbps


@given(seed=st.integers(0, 10_000), n=st.integers(3, 8))
@settings(max_examples=60, deadline=None)
def test_on_any_matrix_the_polynomial_ring_is_real_and_brackets_the_best(seed: int, n: int) -> None:
    rng = random.Random(seed)
    values = (10.0, 20.0, 40.0, 300.0)
    rows = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            rows[a][b] = rows[b][a] = rng.choice(values)
    matrix = tuple(tuple(r) for r in rows)
    found = bounded_ring(matrix)
    best = _exact(matrix)
    assert _ring(matrix, found.order) == found.gbps  # a ring that exists
    assert found.gbps <= best <= found.high  # never claims more than the best ring
    assert links.best_ring_of_matrix(matrix)[1] == best  # the DP still decides up to 8 GPUs


def test_gpus_under_one_leaf_switch_are_twins_and_dgx_gpus_with_own_nics_are_not() -> None:
    assert twin_classes(node_shape(pcie_server("p", gpus=16))) == tuple(
        (g, g + 1) for g in range(0, 16, 2)
    )
    assert twin_classes(node_shape(nvswitch_node("n", gpus=8, nics=8))) == tuple(
        (g,) for g in range(8)
    )
    # an NVSwitch node without NICs: one class per NUMA node
    assert twin_classes(node_shape(nvswitch_node("n", gpus=8, nics=0))) == (
        (0, 1, 2, 3),
        (4, 5, 6, 7),
    )


def test_switch_groups_are_uneven() -> None:
    assert switch_groups(20) == [
        [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]],
        [[10, 11, 12, 13, 14, 15], [16, 17, 18, 19]],
    ]


def _brute(shape: object, free: frozenset[int], count: int, leaves: bool) -> tuple[int, ...]:
    """The module's order over every subset (no symmetry, no two passes)."""
    assert isinstance(shape, type(node_shape(pcie_node("x"))))
    best: tuple[object, ...] | None = None
    pool = sorted(free)
    for subset in itertools.combinations(pool, count):
        ring = figures_of(shape, subset).ring_gbps
        rest = tuple(g for g in pool if g not in subset)
        rest_ring = figures_of(shape, rest).ring_gbps if len(rest) > 1 else math.inf
        net = -min(intranode._nic_shares(shape, subset)[0], default=0.0) if leaves else 0.0
        numa = len({shape.numa[g] for g in subset})
        k = (intranode._bucket(ring), net, numa, intranode._bucket(rest_ring), subset)
        if best is None or k < best:
            best = k
    assert best is not None
    return tuple(sorted(best[-1]))  # type: ignore[arg-type]


@checks_at_least(10)
@given(
    kind=st.sampled_from(["pcie16", "bridged8", "nvswitch8"]),
    busy=st.sets(st.integers(0, 15), max_size=8),
    count=st.integers(1, 5),
    leaves=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_choosing_up_to_symmetry_picks_what_trying_every_subset_picks(
    kind: str, busy: set[int], count: int, leaves: bool
) -> None:
    if kind == "pcie16":
        topo = pcie_server("p", gpus=16)
    elif kind == "bridged8":
        topo = pcie_node("b", bridged_pairs=[(0, 1), (2, 3), (4, 5), (6, 7)], nics=2)
    else:
        topo = nvswitch_node("n", gpus=8, nics=4)
    shape = node_shape(topo)
    free = frozenset(range(shape.gpu_count)) - busy
    assume(len(free) >= count)
    checked()
    found = choose(shape, intranode.mask_of(free), count, leaves_node=leaves)
    assert found is not None
    assert tuple(sorted(found.gpus)) == _brute(shape, free, count, leaves)


@checks_at_least(5)
@given(
    gpus=st.sampled_from([16, 20]),
    seed=st.integers(0, 10_000),
    count=st.integers(5, 8),
)
@settings(max_examples=25, deadline=None)
def test_past_the_subset_cap_the_grown_sets_still_reach_the_best_ring(
    gpus: int, seed: int, count: int
) -> None:
    rng = random.Random(seed)
    shape = node_shape(pcie_server("p", gpus=gpus))
    free = tuple(g for g in range(gpus) if rng.random() < 0.8)
    assume(len(free) > count)
    checked()
    classes = [c for c in (tuple(g for g in c if g in free) for c in twin_classes(shape)) if c]
    every = intranode._representatives(classes, count)
    if len(every) <= intranode.MAX_SUBSETS:
        return  # enumerated exactly; the brute-force test above covers it
    found = choose(shape, intranode.mask_of(free), count)
    assert found is not None
    best = max(figures_of(shape, tuple(sorted(s))).ring_gbps for s in every)
    assert intranode._bucket(found.ring_gbps) == intranode._bucket(best)


def test_nodes_of_one_shape_share_ring_searches_across_free_masks() -> None:
    """The cold cost of a decision over many nodes of one PCIe model: subsets of a size see a
    few distinct matrices of link buckets, so the ring search runs once per matrix, not once
    per subset weighed (67c2cf9 did this through `best_ring_of_matrix`'s cache; a cache by GPU
    set made the cold PCIe figure 2-4x slower). Counted in searches, not seconds, so it holds
    on any machine; the answers must not depend on what ran before."""
    shape = node_shape(pcie_server("n", gpus=16, tiers=("leaf-0", "spine")))
    rng = random.Random(7)
    masks = [shape.full_mask] + [
        sum(1 << g for g in range(16) if rng.random() >= 0.4) for _ in range(7)
    ]
    cold = []
    for mask in masks:
        intranode.clear_caches()
        cold.append(choose(shape, mask, 4))
    intranode.clear_caches()
    weighed = 0
    warm = []
    for mask in masks:
        weighed += len(intranode.candidate_subsets(shape, intranode._bits(mask), 4))
        warm.append(choose(shape, mask, 4))
    assert warm == cold
    searches = intranode._small_ring_bucket_of.cache_info().misses
    # The 4-GPU subsets of this tree (two sockets, leaf switches of two GPUs)
    # fall into a few dozen bucket matrices (39 of 792 subsets today); a quarter of the
    # subsets weighed leaves a wide margin and still fails a search per subset.
    assert weighed > 500
    assert searches * 4 <= weighed


@pytest.mark.parametrize("gpus", [4, 8, 12, 16, 20, 23, 24, 32])
def test_twin_classes_in_python_and_on_arrays_agree(gpus: int) -> None:
    """Small nodes find their twins in Python, big ones on numpy arrays: the same classes on
    tidy and uneven PCIe trees, with NVLink islands, and on NVSwitch nodes."""
    tree = uneven_tree(gpus, seed=gpus)
    topologies = [
        pcie_tree("u", sockets=tree),
        pcie_tree("v", sockets=uneven_tree(gpus, seed=gpus + 1, sockets=1)),
        pcie_tree("w", sockets=tree, nvlink_rings=[[0, 1], [2, 3, 4]]),
    ]
    if gpus % 2 == 0:
        topologies.append(pcie_server("p", gpus=gpus))
    if gpus in (4, 8):
        topologies += [pcie_node("n", gpus=gpus), nvswitch_node("s", gpus=gpus, nics=gpus // 2)]
    for shape in map(node_shape, topologies):
        rows = intranode._twin_classes_rows(shape)
        assert rows == intranode._twin_classes_array(shape)
        assert sorted(g for c in rows for g in c) == list(range(gpus))


@pytest.mark.parametrize("profile", [p.name for p in describe_profiles()])
def test_every_free_gpu_is_answered_as_the_search_answers(profile: str) -> None:
    """`choose` and `network_front` answer "all the free GPUs" without scoring the one
    candidate; the answer must be the search's, on every recorded machine and free set."""
    shape = node_shape(load_machine(profile, node_name="n"))
    rng = random.Random(profile)
    masks = {(1 << shape.gpu_count) - 1} | {
        rng.getrandbits(shape.gpu_count) or 1 for _ in range(12)
    }
    masks |= {sum(1 << g for g in isl) for isl in shape.islands}  # each island's GPUs free
    islands = 0
    for mask in sorted(masks):
        count = mask.bit_count()
        for leaves, island in itertools.product((False, True), (False, True)):
            intranode.clear_caches()
            want, _ = intranode._choose(shape, mask, count, leaves, island)
            assert choose(shape, mask, count, leaves_node=leaves, island=island) == want
            islands += island and want is not None
        intranode.clear_caches()
        searched, _ = intranode._choose(shape, mask, count, True, False)
        assert searched is not None
        assert intranode.network_front(shape, mask, count) == (
            choose(shape, mask, count, leaves_node=True),
            *intranode._front(shape, mask, count, searched.min_nic_gbps),
        )
    assert islands > 0  # the free sets that are one island's GPUs
