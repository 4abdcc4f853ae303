"""The occupancy generator behind `gputopo bench placement`: fast, and the same state as before
(the sampler below, and gangs that skip full leaves by per-leaf counts of free GPUs).

The fill's best-fit sampler draws node indexes with `getrandbits` inlined instead of
`rng.randrange` (it is the hot loop of building a 1M-GPU state). Benchmarks compare timings
across commits on the states this generator builds, so the draws must stay those of
`randrange`: the reference below is the sampler as it was, and both must pick the same node
and leave the random generator in the same state.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from gputopo.sim.scenarios import Occupancy, build_nodes, empty_snapshot


def _reference(occupancy: Occupancy, free: dict[str, set[int]], per: int) -> str | None:
    names = sorted(free)
    best: list[str] = []
    best_free = 1 << 30
    for _ in range(256):
        n = names[occupancy.rng.randrange(len(names))]
        room = len(free[n])
        if per <= room < best_free and occupancy.snapshot.node(n).placeable:
            best, best_free = [n], room
        elif room == best_free:
            best.append(n)
        if best_free == per:
            break
    if best:
        return occupancy.rng.choice(best)
    room_nodes = [n for n in names if len(free[n]) >= per]
    return occupancy.rng.choice(room_nodes) if room_nodes else None


@pytest.mark.parametrize("filling", [True, False], ids=["in fill (free counts)", "in churn"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("nodes", [1, 3, 17, 64, 100])
def test_the_best_fit_sampler_draws_what_randrange_draws(
    seed: int, nodes: int, filling: bool
) -> None:
    snapshot = empty_snapshot(build_nodes("dgx-h100", nodes * 8))
    rng = random.Random(seed)
    free = {n: set(range(rng.randrange(9))) for n in sorted(snapshot.nodes)}
    ours = Occupancy(snapshot, seed=seed)
    theirs = Occupancy(snapshot, seed=seed)
    if filling:
        ours._count_rooms(free)
    for per in (1, 2, 4, 8, 1, 3, 8, 2):
        assert ours._random_node(free, per) == _reference(theirs, free, per)
        assert ours.rng.getstate() == theirs.rng.getstate()


def test_a_filled_state_is_the_same_for_the_same_seed() -> None:
    def fill() -> dict[str, frozenset[int]]:
        snap = Occupancy(empty_snapshot(build_nodes("mixed", 2000)), seed=5).fill(0.5)
        return {n: s.free for n, s in snap.nodes.items()}

    first = fill()
    assert first == fill()
    assert 0.4 < 1 - sum(map(len, first.values())) / 2000 < 0.6


@pytest.mark.parametrize(
    ("layout", "gpus", "seed", "want"),
    [
        ("mixed", 2000, 5, "447353ca69c2cce3"),
        ("dgx-h100", 4000, 1, "0a7b997efe118b0c"),
        ("nvl72", 3000, 2, "83f96662cbded763"),
    ],
)
def test_filled_and_churned_states_are_the_ones_the_generator_built_before(
    layout: str, gpus: int, seed: int, want: str
) -> None:
    """Benchmarks compare commits on these states: a fill and three churns hash as they did
    at 95556a8, before the sampler and the gang search were sped up."""
    occupancy = Occupancy(empty_snapshot(build_nodes(layout, gpus)), seed=seed)
    snaps = [occupancy.fill(0.5)] + [occupancy.churn() for _ in range(3)]
    text = repr([sorted((n, sorted(s.free)) for n, s in snap.nodes.items()) for snap in snaps])
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == want


@pytest.mark.parametrize("seed", range(6))
def test_a_gang_skips_full_leaves_by_their_counts_and_lands_where_looking_would(seed: int) -> None:
    snapshot = empty_snapshot(build_nodes("dgx-h100", 2000))
    rng = random.Random(seed)
    free = {n: set(range(rng.choice((0, 0, 0, 1, 2, 8)))) for n in sorted(snapshot.nodes)}
    counted = Occupancy(snapshot, seed=seed)
    looking = Occupancy(snapshot, seed=seed)
    counted._count_rooms(free)
    for pods, per in ((2, 8), (4, 2), (16, 8), (3, 1), (200, 8), (40, 2)):
        assert counted._gang_nodes(free, pods, per) == looking._gang_nodes(free, pods, per)
        assert counted.rng.getstate() == looking.rng.getstate()
