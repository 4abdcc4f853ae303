"""Property tests for the kueue-bestfit port, checked against an independent capacity oracle.

The oracle recomputes free capacity per leaf with exact fractions straight from the nodes, so a
unit or bookkeeping slip in the port (milli-units, usage, the ``pods`` unit) shows up here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from hypothesis import given, reject, settings
from hypothesis import strategies as st

from gputopo.placement.kueue_tas import (
    HOSTNAME_LABEL,
    TasAssignment,
    TasFailure,
    TasNode,
    TasRequest,
    TasTopology,
    find_topology_assignment,
)
from tests.checked import checked, checks_at_least

BLOCK = "cloud.com/topology-block"
RACK = "cloud.com/topology-rack"
HOST = HOSTNAME_LABEL
GPU = "example.com/gpu"
LEVEL_SETS = [(BLOCK, RACK, HOST), (BLOCK, HOST), (BLOCK, RACK), (RACK, HOST), (HOST,)]

Usage = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class Scenario:
    levels: tuple[str, ...]
    nodes: tuple[TasNode, ...]
    request: TasRequest
    usage: Usage
    balanced: bool


quantities = st.sampled_from([0, 0.5, 1, 2, 3, 4, 8])


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    levels = draw(st.sampled_from(LEVEL_SETS))
    nodes: list[TasNode] = []
    for b in range(draw(st.integers(1, 3))):
        for r in range(draw(st.integers(1, 3))):
            for _ in range(draw(st.integers(1, 3))):
                name = f"n{len(nodes)}"
                labels = {BLOCK: f"b{b}", RACK: f"b{b}r{r}", HOST: name}
                if draw(st.integers(0, 9)) == 0:  # now and then a node misses a label
                    labels.pop(draw(st.sampled_from(levels)))
                allocatable = {"cpu": draw(quantities), GPU: draw(quantities)}
                allocatable["pods"] = draw(st.integers(0, 10))
                used = draw(st.dictionaries(st.sampled_from(["cpu", GPU, "pods"]), quantities))
                nodes.append(TasNode(name, labels, allocatable, used))
    names = [n.name for n in nodes] + ["unknown-node"]
    usage = draw(
        st.dictionaries(
            st.sampled_from(names),
            st.dictionaries(st.sampled_from(["cpu", GPU, "pods"]), quantities),
            max_size=3,
        )
    )
    mode = draw(st.sampled_from(["required", "preferred", "unconstrained"]))
    level = None if mode == "unconstrained" else draw(st.sampled_from(levels))
    slice_level = None
    slice_size = None
    if draw(st.booleans()):
        first = 0 if level is None else levels.index(level)
        slice_level = draw(st.sampled_from(levels[first:]))
        slice_size = draw(st.integers(1, 3))
    pods = draw(st.integers(0, 12)) * (slice_size or 1)
    per_pod = {"cpu": draw(st.sampled_from([0, 0.5, 1])), GPU: draw(st.sampled_from([0, 1, 2]))}
    request = TasRequest(pods, per_pod, mode, level, slice_level, slice_size)  # type: ignore[arg-type]
    return Scenario(levels, tuple(nodes), request, usage, draw(st.booleans()))


# -- the oracle -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]
    pods: int  # how many of the request's pods fit, from exact arithmetic


def oracle_leaves(s: Scenario) -> dict[tuple[str, ...], Leaf]:
    """Leaves keyed by their assignment values, with the pods that fit in each."""
    free: dict[tuple[str, ...], dict[str, Fraction]] = defaultdict(dict)
    paths: dict[tuple[str, ...], tuple[str, ...]] = {}
    hostname = s.levels[-1] == HOST
    for node in s.nodes:
        if any(level not in node.labels for level in s.levels):
            continue
        path = tuple(node.labels[level] for level in s.levels)
        key = path[-1:] if hostname else path
        paths.setdefault(key, path)
        extra = s.usage.get(node.name, {})
        for source, sign in ((node.allocatable, 1), (node.usage, -1), (extra, -1)):
            for res, value in source.items():
                free[key][res] = free[key].get(res, Fraction(0)) + sign * Fraction(value)
    wanted = {res: Fraction(v) for res, v in s.request.per_pod.items()}
    wanted["pods"] = wanted.get("pods", Fraction(0)) + 1
    leaves = {}
    for key, have in free.items():
        fits = min(
            (max(int(have[res] // amount), 0) if res in have else 0)
            for res, amount in wanted.items()
            if amount > 0
        )
        leaves[key] = Leaf(paths[key], fits)
    return leaves


def slice_capacity(leaves: list[Leaf], s: Scenario, slice_idx: int) -> int:
    size = s.request.slice_size or 1
    per_domain: dict[tuple[str, ...], int] = defaultdict(int)
    for leaf in leaves:
        per_domain[leaf.path[: slice_idx + 1]] += leaf.pods
    return sum(p // size for p in per_domain.values())


def expected_to_fit(s: Scenario, leaves: dict[tuple[str, ...], Leaf]) -> bool:
    """Kueue places the PodSet iff the capacity the mode allows holds all its slices."""
    req = s.request
    needed = req.pods // (req.slice_size or 1)
    slice_idx = s.levels.index(req.slice_level) if req.slice_level else len(s.levels) - 1
    if req.mode != "required":
        return slice_capacity(list(leaves.values()), s, slice_idx) >= needed
    assert req.level is not None
    level_idx = s.levels.index(req.level)
    groups: dict[tuple[str, ...], list[Leaf]] = defaultdict(list)
    for leaf in leaves.values():
        groups[leaf.path[: level_idx + 1]].append(leaf)
    return any(slice_capacity(group, s, slice_idx) >= needed for group in groups.values())


# -- properties -------------------------------------------------------------------------------


def place(s: Scenario) -> TasAssignment | TasFailure:
    topology = TasTopology(levels=s.levels, nodes=s.nodes)
    return topology.assign(s.request, usage=s.usage, balanced_placement=s.balanced)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_places_exactly_the_pods_asked_for_and_never_overfills_a_leaf(s: Scenario) -> None:
    leaves = oracle_leaves(s)
    got = place(s)
    if not leaves:
        assert isinstance(got, TasFailure)
        assert got.reason.startswith("no topology domains at level")
        return
    assert isinstance(got, TasAssignment) == expected_to_fit(s, leaves), got
    if isinstance(got, TasFailure):
        return
    assert got.pods == s.request.pods
    seen = set()
    for values, pods in got.domains:
        assert values not in seen, f"{values} listed twice"
        seen.add(values)
        assert 0 < pods <= leaves[values].pods, f"{values}: {pods} > {leaves[values].pods}"


@checks_at_least(10)
@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_required_level_and_slices_are_honoured(s: Scenario) -> None:
    got = place(s)
    if not isinstance(got, TasAssignment):
        reject()  # hypothesis draws again (assume(False), typed to end the branch)
    checked()
    leaves = oracle_leaves(s)
    req = s.request
    paths = {values: leaves[values].path for values, _ in got.domains}
    if req.mode == "required":
        assert req.level is not None
        cut = s.levels.index(req.level) + 1
        assert len({path[:cut] for path in paths.values()}) <= 1, "required domain split"
    if req.slice_level is not None:
        assert req.slice_size is not None
        cut = s.levels.index(req.slice_level) + 1
        per_slice_domain: dict[tuple[str, ...], int] = defaultdict(int)
        for values, pods in got.domains:
            per_slice_domain[paths[values][:cut]] += pods
        for domain, pods in per_slice_domain.items():
            assert pods % req.slice_size == 0, f"{domain} holds a partial slice ({pods})"


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_per_call_usage_and_node_usage_are_interchangeable(s: Scenario) -> None:
    """Usage given per call must weigh exactly like usage recorded on the nodes."""
    baked = []
    for node in s.nodes:
        total = dict(node.usage)
        for res, value in s.usage.get(node.name, {}).items():
            total[res] = total.get(res, 0) + value
        baked.append(TasNode(node.name, node.labels, node.allocatable, total))
    once = find_topology_assignment(
        levels=s.levels, nodes=baked, request=s.request, balanced_placement=s.balanced
    )
    assert once == place(s)


@settings(max_examples=100, deadline=None)
@given(scenarios(), scenarios())
def test_a_shared_topology_answers_each_call_as_if_it_were_fresh(s: Scenario, t: Scenario) -> None:
    topology = TasTopology(levels=s.levels, nodes=s.nodes)
    first = topology.assign(s.request, usage=s.usage, balanced_placement=s.balanced)
    other = t.request
    if other.level in s.levels or other.mode == "unconstrained":
        topology.assign(other, usage=t.usage, balanced_placement=t.balanced)
    again = topology.assign(s.request, usage=s.usage, balanced_placement=s.balanced)
    assert again == first


@checks_at_least(5)
@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_usage_of_accounts_for_every_placed_pod(s: Scenario) -> None:
    topology = TasTopology(levels=s.levels, nodes=s.nodes)
    got = topology.assign(s.request, usage=s.usage, balanced_placement=s.balanced)
    if not isinstance(got, TasAssignment):
        reject()  # hypothesis draws again (assume(False), typed to end the branch)
    checked()
    charged = topology.usage_of(got, s.request.per_pod)
    assert sum(u.get("pods", 0) for u in charged.values()) == s.request.pods
    assert set(charged) <= {n.name for n in s.nodes}


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_a_usage_snapshot_weighs_like_per_call_usage_and_leaves_its_origin_alone(
    s: Scenario,
) -> None:
    topology = TasTopology(levels=s.levels, nodes=s.nodes)
    before = topology.assign(s.request, balanced_placement=s.balanced)
    snapshot = topology.with_usage(s.usage)
    assert snapshot.assign(s.request, balanced_placement=s.balanced) == place(s)
    assert topology.assign(s.request, balanced_placement=s.balanced) == before
