"""Tiers inferred from probes recover a simulated fabric without probing every pair."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from aggregator.probes import ProbeBook, infer_levels, infer_tiers


class SimulatedFabric:
    """RTT between two nodes: a base plus a per-hop latency, with noise (queueing only adds)."""

    def __init__(self, layout: Mapping[str, tuple[int, int]], *, jitter: float, seed: int) -> None:
        self.layout = layout  # node -> (spine, leaf)
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.probes = 0

    def rtt(self, a: str, b: str) -> float:
        self.probes += 1
        (sa, la), (sb, lb) = self.layout[a], self.layout[b]
        hops = 2 if (sa, la) == (sb, lb) else (4 if sa == sb else 6)
        return (5.0 + 0.6 * hops) * (1 + self.rng.uniform(0, self.jitter))


def tree(spines: int, leaves: int, nodes: int) -> dict[str, tuple[int, int]]:
    return {
        f"n{s}-{leaf}-{i}": (s, leaf)
        for s in range(spines)
        for leaf in range(leaves)
        for i in range(nodes)
    }


def run_rounds(book: ProbeBook, fabric: SimulatedFabric, rounds: int) -> dict[str, tuple[str, ...]]:
    for node in fabric.layout:
        book.add_node(node)
    tiers: dict[str, tuple[str, ...]] = {}
    for _ in range(rounds):
        for node in fabric.layout:
            for peer in book.targets(node):
                book.observe(node, peer, fabric.rtt(node, peer))
        tiers = book.tiers()
    return tiers


def groups(tiers: Mapping[str, tuple[str, ...]], level: int) -> set[frozenset[str]]:
    out: dict[str, set[str]] = {}
    for node, path in tiers.items():
        out.setdefault(path[level], set()).add(node)
    return {frozenset(g) for g in out.values()}


def truth(layout: Mapping[str, tuple[int, int]], level: int) -> set[frozenset[str]]:
    out: dict[object, set[str]] = {}
    for node, (s, leaf) in layout.items():
        out.setdefault((s, leaf) if level == 0 else s, set()).add(node)
    return {frozenset(g) for g in out.values()}


@pytest.mark.parametrize(
    ("spines", "leaves", "nodes", "rounds"),
    [
        pytest.param(2, 2, 4, 3, id="a small cluster is nearly probed all to all and solved"),
        pytest.param(4, 8, 16, 8, id="512 nodes: leaves and spines found, a few % of pairs"),
    ],
)
def test_inferred_tiers_match_the_fabric(spines: int, leaves: int, nodes: int, rounds: int) -> None:
    layout = tree(spines, leaves, nodes)
    fabric = SimulatedFabric(layout, jitter=0.02, seed=7)
    book = ProbeBook(seed=3)
    tiers = run_rounds(book, fabric, rounds)
    assert set(tiers) == set(layout)
    assert groups(tiers, 0) == truth(layout, 0)
    assert groups(tiers, 1) == truth(layout, 1)
    n = len(layout)
    all_pairs = n * (n - 1) // 2
    if n > 100:
        assert book.pair_count < 0.12 * all_pairs, (book.pair_count, all_pairs)
    per_round = book.per_round + book.random_per_round
    assert fabric.probes <= n * per_round * rounds  # every node stays within its budget


def test_one_flat_network_has_no_tiers_to_publish() -> None:
    layout = {f"n{i}": (0, 0) for i in range(12)}
    tiers = run_rounds(ProbeBook(seed=1), SimulatedFabric(layout, jitter=0.01, seed=1), 3)
    assert tiers == {}


def test_levels_split_at_gaps_not_at_noise() -> None:
    assert infer_levels([6.2, 6.25, 6.3, 7.4, 7.5, 8.6]) == [6.3, 7.5, 8.6]
    assert infer_levels([5.0, 5.1, 5.2]) == [5.2]
    assert infer_levels([]) == []


def test_groups_nest_and_are_named_after_their_first_member() -> None:
    pairs = {("a", "b"): 6.2, ("c", "d"): 6.3, ("a", "c"): 7.4, ("a", "e"): 8.6}
    inf = infer_tiers(pairs, "abcde")
    assert inf.tiers("b") == ("probe-t0-a", "probe-t1-a")
    assert inf.tiers("d") == ("probe-t0-c", "probe-t1-a")
    assert inf.tiers("e") == ("probe-t0-e", "probe-t1-e")


def test_the_book_keeps_the_minimum_rtt_per_pair() -> None:
    book = ProbeBook()
    book.observe("a", "b", 9.0)
    book.observe("b", "a", 6.0)
    book.observe("a", "b", 7.0)
    book.observe("a", "a", 1.0)
    book.observe("a", "c", float("nan"))
    assert book.pair_count == 1
    assert infer_tiers({("a", "b"): 6.0}, "ab").levels == (6.0,)
