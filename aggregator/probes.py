"""Fabric tiers inferred from exporter-to-exporter network probes: the last-resort source.

Where no inventory, cloud label or fabric manager says which nodes share a leaf, round-trip
times do: a pair under one leaf crosses two switch hops, a pair under one spine four, and so on
(`reference/internode.md` §5). Inferred tiers are published with low confidence and never
override any other source (`aggregator.fabric`).

Probing every pair is O(n²): 2,000 nodes would be 2 million probes. Instead the planner
descends the tree inferred so far, as an insertion into a hierarchical clustering would:

1. Levels: every pair's minimum RTT is collected; sorted, the values split into levels wherever
   one is more than `gap_ratio` above the previous one (same leaf < same spine < ...).
2. Groups: at each level, nodes joined by pairs at or below that level are one group
   (single linkage, with union-find), so groups nest and a tier path is a group per level.
3. Targets: a node starts at the top and, level by level, looks at the groups inside its
   current group. If it already shares the next lower level with someone, it descends into
   that group; otherwise it probes one representative of each group it has not measured yet
   (at most `per_round` per round), and descends once it has measured them all.

A node settles after about (branching factor x depth) probes, and a few random probes per round
keep the levels honest. All of it is pure and deterministic for a given seed.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["ProbeBook", "ProbeInference", "infer_levels", "infer_tiers"]


def infer_levels(rtts: Iterable[float], *, gap_ratio: float = 1.08) -> list[float]:
    """Upper bounds of the latency levels present in `rtts`, lowest first."""
    values = sorted(rtts)
    if not values:
        return []
    bounds = []
    for prev, cur in itertools.pairwise(values):
        if cur > prev * gap_ratio:
            bounds.append(prev)
    bounds.append(values[-1])
    return bounds


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        parent = self.parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # The smaller name becomes the root: group names are their smallest member.
            if rb < ra:
                ra, rb = rb, ra
            self.parent[rb] = ra


@dataclass(frozen=True, slots=True)
class ProbeInference:
    """Groups per level (level 0 = closest), as node -> group representative."""

    levels: tuple[float, ...]
    groups: tuple[Mapping[str, str], ...]

    def tiers(self, node: str) -> tuple[str, ...]:
        """A node's inferred tier path, closest first, named after each group's first member.

        The top level (everyone who was ever measured together) is not a tier. A node alone at
        a level still gets its own group, so every measured node has a complete path.
        """
        return tuple(f"probe-t{i}-{g.get(node, node)}" for i, g in enumerate(self.groups[:-1]))


def infer_tiers(
    pairs: Mapping[tuple[str, str], float], nodes: Iterable[str], *, gap_ratio: float = 1.08
) -> ProbeInference:
    """Levels and nested groups from pairwise minimum RTTs (see the module docstring)."""
    levels = infer_levels(pairs.values(), gap_ratio=gap_ratio)
    ordered = sorted(pairs.items(), key=lambda kv: kv[1])
    groups: list[Mapping[str, str]] = []
    uf = _UnionFind()
    names = sorted(set(nodes))
    i = 0
    for bound in levels:
        while i < len(ordered) and ordered[i][1] <= bound:
            (a, b), _ = ordered[i]
            uf.union(a, b)
            i += 1
        groups.append({n: uf.find(n) for n in names})
    return ProbeInference(tuple(levels), tuple(groups))


class ProbeBook:
    """Probe results and the planner that chooses each node's next targets.

    `observe` records one measurement (the minimum RTT per pair is kept: queueing only ever adds
    delay); `targets` names the peers a node should probe next; `inference` is recomputed
    lazily after new results.
    """

    def __init__(
        self,
        *,
        per_round: int = 8,
        random_per_round: int = 1,
        gap_ratio: float = 1.08,
        seed: int = 0,
    ) -> None:
        self.per_round = per_round
        self.random_per_round = random_per_round
        self.gap_ratio = gap_ratio
        self._rng = random.Random(seed)
        self._pairs: dict[tuple[str, str], float] = {}
        self._measured: dict[str, set[str]] = {}
        self._nodes: set[str] = set()
        self._inference: ProbeInference | None = None
        self._compared: dict[tuple[int, str], set[str]] = {}

    def add_node(self, node: str) -> None:
        """A node that can probe and be probed."""
        self._nodes.add(node)

    def remove_node(self, node: str) -> None:
        """A node that went away; its results stay (the fabric did not change)."""
        self._nodes.discard(node)

    def observe(self, a: str, b: str, rtt_us: float) -> None:
        """One RTT measurement between two nodes."""
        if a == b or not rtt_us > 0:
            return
        key = (a, b) if a < b else (b, a)
        old = self._pairs.get(key)
        if old is None or rtt_us < old:
            self._pairs[key] = rtt_us
        self._measured.setdefault(a, set()).add(b)
        self._measured.setdefault(b, set()).add(a)

    @property
    def pair_count(self) -> int:
        """Distinct pairs measured."""
        return len(self._pairs)

    def inference(self) -> ProbeInference:
        """The levels and groups as of the last `refresh` (computed once if never)."""
        if self._inference is None:
            self.refresh()
        assert self._inference is not None
        return self._inference

    def refresh(self) -> ProbeInference:
        """Infer levels and groups from every result so far."""
        measured = {n for pair in self._pairs for n in pair}
        self._inference = infer_tiers(self._pairs, measured, gap_ratio=self.gap_ratio)
        self._compared.clear()
        return self._inference

    def tiers(self) -> dict[str, tuple[str, ...]]:
        """Inferred tier paths of every measured node (empty until two levels are seen)."""
        inf = self.refresh()
        if len(inf.levels) < 2:
            return {}
        measured = {n for pair in self._pairs for n in pair}
        return {n: inf.tiers(n) for n in sorted(measured)}

    def targets(self, node: str) -> list[str]:
        """The peers `node` should probe next (bounded by `per_round` + `random_per_round`)."""
        peers = sorted(self._nodes - {node})
        if not peers:
            return []
        done = self._measured.get(node, set())
        inf = self.inference()
        if len(inf.levels) >= 2:
            chosen = self._descend(node, peers, inf)
        else:
            fresh = [p for p in peers if p not in done]
            chosen = self._rng.sample(fresh, min(self.per_round, len(fresh)))
        spare = [p for p in peers if p not in done and p not in chosen]
        chosen += self._rng.sample(spare, min(self.random_per_round, len(spare)))
        return chosen

    def _descend(self, node: str, peers: list[str], inf: ProbeInference) -> list[str]:
        """Targets from the walk down the inferred tree (see the module docstring).

        At each level, inside the node's group of the level above, the node's own group must be
        compared with every other group (one measured pair between them says how far apart
        they are). The members of a group share that work: member i of n takes every n-th
        uncompared group. Then the walk goes down into the node's own group.
        """
        members = [*peers, node]
        for level in range(len(inf.levels) - 2, -1, -1):
            groups = inf.groups[level]
            mine = groups.get(node, node)
            mates = sorted(m for m in members if groups.get(m, m) == mine)
            reps: dict[str, str] = {}
            sizes: Counter[str] = Counter()
            for m in members:
                g = groups.get(m, m)
                sizes[g] += 1
                if g != mine and (g not in reps or m < reps[g]):
                    reps[g] = m
            compared = self._compared_with(level, mine, mates, groups)
            # Largest groups first: a big group is likely a whole switch already, so a node
            # still alone finds its own switch within a round or two.
            todo = [
                rep
                for g, rep in sorted(reps.items(), key=lambda gr: (-sizes[gr[0]], gr[0]))
                if g not in compared
            ]
            share = todo[mates.index(node) :: len(mates)][: self.per_round]
            if share:
                return share
            members = mates
        return []

    def _compared_with(
        self, level: int, group: str, mates: list[str], groups: Mapping[str, str]
    ) -> set[str]:
        """Groups (at `level`) that some member of `group` has measured a member of."""
        key = (level, group)
        found = self._compared.get(key)
        if found is None:
            found = {groups.get(p, p) for m in mates for p in self._measured.get(m, ())}
            self._compared[key] = found
        return found


class ProbeCoordinator:
    """Who probes whom and when, for the Reporter service.

    A node with a probe address gets targets in its acknowledgements at most every
    `interval_s` seconds; results arrive in its deltas (`Delta.peer_probes`). Inference runs
    on demand (`refresh`, from housekeeping) and returns the nodes whose tiers changed.
    """

    def __init__(self, book: ProbeBook | None = None, *, interval_s: float = 60.0) -> None:
        self.book = book or ProbeBook()
        self.interval_s = interval_s
        self._addresses: dict[str, str] = {}
        self._next_round: dict[str, float] = {}
        self.results = 0

    def address(self, node: str, address: str) -> None:
        """A node's probe endpoint (empty: it does not answer probes)."""
        if not address:
            self._addresses.pop(node, None)
            self.book.remove_node(node)
            return
        self._addresses[node] = address
        self.book.add_node(node)

    def forget(self, node: str) -> None:
        """A node that went away."""
        self._addresses.pop(node, None)
        self._next_round.pop(node, None)
        self.book.remove_node(node)

    def due(self, node: str, now: float) -> list[tuple[str, str]]:
        """(peer, address) pairs to send a node now; empty when it is not its turn."""
        if node not in self._addresses or now < self._next_round.get(node, 0.0):
            return []
        targets = [(p, self._addresses[p]) for p in self.book.targets(node) if p in self._addresses]
        if targets:  # a node alone so far keeps its turn for when peers arrive
            self._next_round[node] = now + self.interval_s
        return targets

    def result(self, node: str, peer: str, rtt_us: float) -> None:
        """One probe result reported by `node`."""
        self.results += 1
        self.book.observe(node, peer, rtt_us)

    def refresh(self) -> dict[str, tuple[str, ...]]:
        """Inferred tiers of every measured node."""
        return self.book.tiers()
