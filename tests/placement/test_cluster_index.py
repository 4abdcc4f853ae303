"""The snapshot's indexes: what they say, that derived snapshots say the same as rebuilt ones,
and that deriving shares what did not change."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputopo.cluster import ClusterSnapshot, NodeState, node_shape
from gputopo.links import LinkHealth, LinkKind
from gputopo.request import Scope
from gputopo.topology import Measurement, NodeTopology
from tests.builders import nvswitch_node, pcie_node, snapshot
from tests.placement.test_properties import clusters

BRIDGED = [(0, 1), (2, 3), (4, 5), (6, 7)]


def index_view(snap: ClusterSnapshot) -> dict[str, object]:
    """Everything the index answers, as plain comparable data."""
    idx = snap.index
    return {
        "mask": {n: idx.mask[n] for n in idx.mask},
        "free": {s: dict(d) for s, d in idx.domain_free.items()},
        "classes": {
            s: {d: dict(c) for d, c in by.items() if c} for s, by in idx.domain_classes.items()
        },
        "cells": {c: {k: v for k, v in by.items() if v} for c, by in idx.cell_nodes.items()},
        "class_cells": dict(idx.class_cells),
        "by_free": {s: {f: d for f, d in b.items() if d} for s, b in idx.by_free.items()},
    }


@st.composite
def change_sequences(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[dict[str, frozenset[int]]]]:
    snap = draw(clusters())
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        names = draw(st.lists(st.sampled_from(sorted(snap.nodes)), min_size=1, max_size=3))
        steps.append(
            {
                n: frozenset(
                    draw(
                        st.sets(
                            st.integers(0, snap.node(n).topology.gpu_count - 1),
                            max_size=snap.node(n).topology.gpu_count,
                        )
                    )
                )
                for n in names
            }
        )
    return snap, steps


@given(case=change_sequences())
def test_derived_snapshots_answer_exactly_as_rebuilt_ones(
    case: tuple[ClusterSnapshot, list[dict[str, frozenset[int]]]],
) -> None:
    snap, steps = case
    snap = snap.indexed()  # built once; every step below derives from it
    for changes in steps:
        derived = snap.with_free(changes)
        rebuilt = ClusterSnapshot(derived.nodes.values())
        assert index_view(derived) == index_view(rebuilt)
        assert derived.free_gpus == rebuilt.free_gpus
        # The aggregator's path: a new node list with the previous snapshot to derive from.
        again = ClusterSnapshot(rebuilt.nodes.values(), previous=snap)
        assert index_view(again) == index_view(rebuilt)
        snap = derived
    assert {n: s.free for n, s in snap.nodes.items()} == {
        n: s.free for n, s in ClusterSnapshot(snap.nodes.values()).nodes.items()
    }


@given(case=change_sequences())
def test_a_derived_snapshots_nodes_read_alike_every_way(
    case: tuple[ClusterSnapshot, list[dict[str, frozenset[int]]]],
) -> None:
    """`nodes.items()` and `.values()` walk the base once with the changes laid over it: they
    must give what a lookup of every key gives, in the same order, and stay views."""
    snap, steps = case
    for changes in steps:
        snap = snap.with_free(changes)
        nodes = snap.nodes
        looked_up = [(n, nodes[n]) for n in nodes]
        assert list(nodes.items()) == looked_up
        assert list(nodes.values()) == [s for _, s in looked_up]
        assert len(nodes.items()) == len(nodes.values()) == len(looked_up)
        first = looked_up[0]
        assert first in nodes.items()
        assert first[1] in nodes.values()
        assert {n: s.free for n, s in nodes.items()} == {n: s.free for n, s in looked_up}
        assert all(s.free == changes[n] for n, s in nodes.items() if n in changes)


def test_a_long_chain_of_derives_read_in_any_order_answers_as_rebuilt() -> None:
    # Derived indexes keep the free-count buckets lazily (the domains moved since an ancestor),
    # folding them past `_MOVED_FOLD` domains: 48 leaves and 120 steps cross it more than once,
    # and reading the buckets only at the end, newest first, checks every lazy link of the chain.
    nodes = [nvswitch_node(f"n{i:02}", tiers=(f"l{i:02}", "s")) for i in range(48)]
    snap = snapshot(nodes).indexed()
    chain = [snap]
    for step in range(120):
        name = f"n{step * 7 % 48:02}"
        chain.append(chain[-1].with_free({name: frozenset(range(step % 9))}))
    for derived in reversed(chain):
        rebuilt = ClusterSnapshot(derived.nodes.values())
        assert index_view(derived) == index_view(rebuilt)
        assert derived.domains_by_free(Scope.LEAF) == {
            f: d for f, d in rebuilt.domains_by_free(Scope.LEAF).items() if d
        }


def test_deriving_shares_the_structure_and_every_untouched_domain() -> None:
    nodes = [nvswitch_node(f"a{i}", tiers=("la", "s1")) for i in range(4)]
    nodes += [nvswitch_node(f"b{i}", tiers=("lb", "s2")) for i in range(4)]
    snap = snapshot(nodes).indexed()
    after = snap.with_free({"a0": frozenset({4, 5, 6, 7})})
    assert after.structure is snap.structure
    assert (
        after.index.domain_classes[Scope.LEAF]["s2/lb"]
        is (snap.index.domain_classes[Scope.LEAF]["s2/lb"])
    )
    assert after.index.cell_nodes[("", "s2/lb", "")] is snap.index.cell_nodes[("", "s2/lb", "")]
    assert after.domain_free(Scope.LEAF, "s1/la") == 28
    assert snap.domain_free(Scope.LEAF, "s1/la") == 32  # the parent is unchanged
    assert after.node("a0").free == frozenset({4, 5, 6, 7})
    assert snap.node("a0").free == frozenset(range(8))


def test_identical_machines_share_one_shape_and_classes_count_them() -> None:
    nodes = [nvswitch_node(f"n{i}", tiers=("l", "s")) for i in range(3)]
    snap = snapshot(nodes, used={"n2": [0]})
    assert snap.shape("n0") is snap.shape("n1") is snap.shape("n2")
    shape = snap.shape("n0")
    assert snap.classes() == {(shape, 0xFF): 2, (shape, 0xFE): 1}


@dataclass(frozen=True)
class DomainCase:
    id: str
    nodes: tuple[NodeTopology, ...]
    scope: Scope
    want: dict[str, tuple[str, ...]]


DOMAIN_CASES = [
    DomainCase(
        "a leaf name reused under two spines is two leaves (topograph #411)",
        (nvswitch_node("x", tiers=("leaf", "s1")), nvswitch_node("y", tiers=("leaf", "s2"))),
        Scope.LEAF,
        {"s1/leaf": ("x",), "s2/leaf": ("y",)},
    ),
    DomainCase(
        "a node without fabric facts belongs to no leaf",
        (nvswitch_node("x", tiers=("l", "s")), nvswitch_node("bare")),
        Scope.LEAF,
        {"s/l": ("x",)},
    ),
    DomainCase(
        "trays of one NVL72 rack form one NVLink domain; NVSwitch nodes stay their own",
        (
            nvswitch_node("t1", gpus=4, nics=4, generation=5, domain="rack-1"),
            nvswitch_node("t2", gpus=4, nics=4, generation=5, domain="rack-1"),
            nvswitch_node("h"),
        ),
        Scope.NVLINK,
        {"rack-1": ("t1", "t2")},
    ),
]


@pytest.mark.parametrize("case", DOMAIN_CASES, ids=lambda c: c.id)
def test_domains(case: DomainCase) -> None:
    assert dict(snapshot(case.nodes).domains(case.scope)) == case.want


def _measured(topo: NodeTopology, gbps: float, at: float) -> NodeTopology:
    link = topo.gpu_link(0, 1)
    assert link is not None
    fresh = replace(link, measured=Measurement(gbps=gbps, method="p2p", measured_at=at))
    return replace(topo, links=(fresh, *(lk for lk in topo.links if lk.key != link.key)))


def test_a_fresh_measurement_counts_and_a_stale_one_does_not() -> None:
    topo = _measured(nvswitch_node("n"), 371.0, at=1000.0)
    assert node_shape(topo).bw[0][1] == 371.0  # no clock: recordings trust measurements
    assert node_shape(topo, now=1000.0 + 60).bw[0][1] == 371.0
    assert node_shape(topo, now=1000.0 + 7 * 3600).bw[0][1] == 450.0  # older than 6 h
    fresh = ClusterSnapshot([NodeState(topo, frozenset(range(8)))], now=1060.0)
    assert fresh.shape("n").bw[0][1] == 371.0
    later = ClusterSnapshot(fresh.nodes.values(), previous=fresh, now=1000.0 + 7 * 3600)
    assert later.shape("n").bw[0][1] == 450.0  # the structure is rebuilt once it ages out


def test_a_degraded_link_counts_at_what_it_carries_and_a_down_one_splits_an_island() -> None:
    topo = pcie_node("p", bridged_pairs=BRIDGED)
    link = topo.gpu_link(0, 1)
    assert link is not None
    assert link.kind is LinkKind.NVLINK
    degraded = replace(link, health=LinkHealth.DEGRADED, nominal_gbps=link.nominal_gbps / 2)
    down = replace(link, health=LinkHealth.DOWN)
    others = tuple(lk for lk in topo.links if lk.key != link.key)
    assert node_shape(replace(topo, links=(degraded, *others))).bw[0][1] == link.nominal_gbps / 2
    split = node_shape(replace(topo, links=(down, *others)))
    assert split.bw[0][1] == 0.0
    assert frozenset({0}) in split.islands
    assert frozenset({1}) in split.islands


def test_a_class_leaves_a_cell_when_its_last_node_there_changes() -> None:
    nodes = [nvswitch_node("a", tiers=("la", "s")), nvswitch_node("b", tiers=("lb", "s"))]
    snap = snapshot(nodes)
    whole = snap.node_class("a")
    assert snap.class_cells(whole) == {("", "s/la", ""), ("", "s/lb", "")}
    after = snap.with_free({"a": frozenset({1, 2})})
    assert after.class_cells(whole) == {("", "s/lb", "")}
    assert after.class_cells(after.node_class("a")) == {("", "s/la", "")}
    assert index_view(after) == index_view(ClusterSnapshot(after.nodes.values()))
