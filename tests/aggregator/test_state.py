"""The cluster state: report ordering, replay, staleness, reservations."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.service import _EVENT_TYPES
from aggregator.state import ClusterState, ReportOutcome
from gputopo.delta import NodeDelta
from gputopo.links import LinkHealth
from gputopo.placement import place
from gputopo.request import Scope, request_from_mapping
from gputopo.reservations import ReservationError
from tests.builders import nvswitch_node


class Clock:
    """A clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(clock: Clock) -> ClusterState:
    return ClusterState(clock=clock, stale_after_s=30)


NODE = nvswitch_node("n1", gpus=4, nics=2)


def test_first_snapshot_is_accepted(state: ClusterState) -> None:
    assert state.apply_snapshot(NODE, incarnation=5, sequence=1) is ReportOutcome.ACCEPTED
    assert state.snapshot().node("n1").topology == NODE


def test_a_replayed_snapshot_is_ignored(state: ClusterState) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=2)
    older = replace(NODE, problems=("old news",))
    assert state.apply_snapshot(older, incarnation=5, sequence=2) is ReportOutcome.IGNORED
    assert state.apply_snapshot(older, incarnation=5, sequence=1) is ReportOutcome.IGNORED
    assert state.apply_snapshot(older, incarnation=4, sequence=99) is ReportOutcome.IGNORED
    assert state.snapshot().node("n1").topology == NODE


def test_a_restarted_exporter_wins_with_a_larger_incarnation(state: ClusterState) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=40)
    newer = replace(NODE, problems=("rebooted",))
    assert state.apply_snapshot(newer, incarnation=6, sequence=1) is ReportOutcome.ACCEPTED
    assert state.snapshot().node("n1").topology.problems == ("rebooted",)


def test_delta_applies_on_the_same_incarnation_only(state: ClusterState) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    link = replace(NODE.links[0], health=LinkHealth.DEGRADED)
    delta = NodeDelta(links=(link,))
    assert state.apply_delta("n1", delta, incarnation=6, sequence=2) is ReportOutcome.RESYNC
    assert state.apply_delta("n1", delta, incarnation=4, sequence=2) is ReportOutcome.IGNORED
    assert state.apply_delta("n1", delta, incarnation=5, sequence=1) is ReportOutcome.IGNORED
    assert state.apply_delta("n1", delta, incarnation=5, sequence=2) is ReportOutcome.ACCEPTED
    assert state.snapshot().node("n1").topology.links[0].health is LinkHealth.DEGRADED


def test_delta_for_an_unknown_node_asks_for_a_snapshot(state: ClusterState) -> None:
    assert state.apply_delta("ghost", NodeDelta(), incarnation=1, sequence=1) is (
        ReportOutcome.RESYNC
    )


def test_silent_nodes_go_stale_and_come_back(state: ClusterState, clock: Clock) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    clock.now += 31
    assert state.stale_nodes() == ["n1"]
    assert not state.snapshot().node("n1").placeable
    assert state.check_stale() == ["n1"]
    assert state.heartbeat("n1", incarnation=5, sequence=2) is ReportOutcome.ACCEPTED
    assert state.snapshot().node("n1").placeable


def test_snapshot_is_cached_until_something_changes(state: ClusterState) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    first = state.snapshot()
    assert state.snapshot() is first
    state.heartbeat("n1", incarnation=5, sequence=2)
    assert state.snapshot() is first  # a heartbeat changes nothing
    state.apply_snapshot(replace(NODE, problems=("x",)), incarnation=5, sequence=3)
    assert state.snapshot() is not first


def _reserve(state: ClusterState, gpus: int, ttl: float = 60) -> str:
    result, _ = place(
        state.snapshot(), request_from_mapping({"groups": [{"name": "g", "gpus_per_pod": gpus}]})
    )
    assert result.placed
    return state.reserve(result, ttl_s=ttl).id


def test_reserved_gpus_are_not_free(state: ClusterState) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    _reserve(state, 3)
    assert len(state.snapshot().node("n1").free) == 1


def test_reservations_expire_and_commitments_do_not(state: ClusterState, clock: Clock) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    kept = _reserve(state, 2, ttl=10)
    dropped = _reserve(state, 2, ttl=10)
    state.commit(kept, owner="ns/job")
    clock.now += 11
    state.heartbeat("n1", incarnation=5, sequence=2)
    assert len(state.snapshot().node("n1").free) == 2
    assert state.reservation(kept) is not None
    with pytest.raises(ReservationError):
        state.commit(dropped)
    assert state.release(kept).gpu_count == 2
    assert len(state.snapshot().node("n1").free) == 4


def test_reserving_a_held_gpu_is_a_loud_error(state: ClusterState) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    snap = state.snapshot()
    result, _ = place(snap, request_from_mapping({"groups": [{"name": "g", "gpus_per_pod": 2}]}))
    state.reserve(result, ttl_s=60)
    with pytest.raises(ValueError, match="already held"):
        state.reserve(result, ttl_s=60)


def test_listeners_hear_changes(state: ClusterState) -> None:
    heard: list[tuple[str, str]] = []
    unsubscribe = state.subscribe(lambda event: heard.append((event.kind, event.node)))
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    unsubscribe()
    state.remove_node("n1")
    assert heard == [("node", "n1")]


@given(
    st.lists(
        st.sampled_from(["reserve1", "reserve4", "release", "commit", "expire", "degrade"]),
        max_size=25,
    )
)
def test_derived_snapshots_equal_a_fresh_rebuild(steps: list[str]) -> None:
    """After reservations move (and the odd topology change), the snapshot handed out equals
    one built from scratch: same free GPUs per node and the same free GPUs per domain."""
    clock = Clock()
    state = ClusterState(clock=clock, stale_after_s=1e9)
    for i in range(4):
        state.apply_snapshot(
            nvswitch_node(f"n{i}", tiers=(f"leaf-{i // 2}", "spine")), incarnation=1, sequence=1
        )
    live: list[str] = []
    sequence = 1
    for step in steps:
        state.snapshot()  # every step sees a snapshot, so the next one can derive from it
        if step.startswith("reserve"):
            result, _ = place(
                state.snapshot(),
                request_from_mapping({"groups": [{"name": "g", "gpus_per_pod": int(step[-1])}]}),
            )
            if result.placed:
                live.append(state.reserve(result, ttl_s=10).id)
        elif step == "release" and live:
            with contextlib.suppress(ReservationError):  # it may have expired
                state.release(live.pop(0))
        elif step == "commit" and live:
            with contextlib.suppress(ReservationError):
                state.commit(live[-1])
        elif step == "expire":
            clock.now += 11
        elif step == "degrade":
            sequence += 1
            old = state.record("n0")
            assert old is not None
            topo = replace(old.topology, problems=(f"step {sequence}",))
            state.apply_snapshot(topo, incarnation=1, sequence=sequence)
    handed_out = state.snapshot()
    fresh = state.rebuilt_snapshot()
    assert {n: s.free for n, s in handed_out.nodes.items()} == {
        n: s.free for n, s in fresh.nodes.items()
    }
    for scope in (Scope.NODE, Scope.LEAF, Scope.SPINE, Scope.CLUSTER):
        for domain, members in fresh.domains(scope).items():
            assert handed_out.free_in(handed_out.domains(scope)[domain]) == fresh.free_in(members)


def test_a_fabric_position_from_labels_moves_the_node_generation(state: ClusterState) -> None:
    """Labels written by others are a fabric source: when they move a node's merged topology,
    its generation moves as for any other change of that topology; when they do not, it stays."""
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    rec = state.record("n1")
    assert rec is not None
    before = rec.generation
    state.set_labels("n1", {"fabric.topograph.run/tier-0": "leaf-7"})
    assert rec.topology.fabric.tiers == ("leaf-7",)
    assert rec.generation == before + 1
    state.set_labels("n1", {"fabric.topograph.run/tier-0": "leaf-7", "team": "a"})
    assert rec.generation == before + 1


def test_change_events_are_typed_frozen_and_numbered(state: ClusterState, clock: Clock) -> None:
    heard: list[ChangeEvent] = []
    state.subscribe(heard.append)
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    state.set_labels("n1", {"zone": "a"})
    clock.now += state.stale_after_s + 1
    state.check_stale()
    state.remove_node("n1")
    assert [(e.kind, e.node) for e in heard] == [
        (ChangeKind.NODE, "n1"),
        (ChangeKind.LABELS, "n1"),
        (ChangeKind.STALE, "n1"),
        (ChangeKind.REMOVED, "n1"),
    ]
    assert [e.generation for e in heard] == [1, 2, 3, 4]
    with pytest.raises(dataclasses.FrozenInstanceError):
        heard[0].kind = ChangeKind.STALE  # type: ignore[misc]
    # WatchTopology has an event type for every kind (a new kind cannot be dropped silently).
    assert set(_EVENT_TYPES) == set(ChangeKind)


def test_a_deleted_node_stays_out_until_a_new_life_or_a_new_node_object(
    state: ClusterState,
) -> None:
    state.apply_snapshot(NODE, incarnation=5, sequence=1)
    state.set_labels("n1", {"team": "infra"})
    state.node_deleted("n1")
    assert (state.node_names, state.kube_labels("n1")) == ([], None)
    # The same exporter life keeps talking: ignored, and a heartbeat asks for a snapshot.
    assert state.apply_snapshot(NODE, incarnation=5, sequence=2) is ReportOutcome.IGNORED
    assert state.heartbeat("n1", incarnation=5, sequence=3) is ReportOutcome.RESYNC
    assert state.node_names == []
    # A restarted exporter is a new life: let in.
    assert state.apply_snapshot(NODE, incarnation=6, sequence=1) is ReportOutcome.ACCEPTED
    state.node_deleted("n1")
    # The Node object is created again: the old life may report again.
    state.set_labels("n1", {})
    assert state.apply_snapshot(NODE, incarnation=6, sequence=2) is ReportOutcome.ACCEPTED
    assert state.node_names == ["n1"]


# --- the staleness index: what a scan of every node would say, without the scan -------------

_SMALL = {name: nvswitch_node(name, gpus=1) for name in ("a", "b", "c", "d")}
_STALENESS_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("snapshot"), st.sampled_from(sorted(_SMALL))),
        st.tuples(st.just("heartbeat"), st.sampled_from(sorted(_SMALL))),
        st.tuples(st.just("static"), st.sampled_from(sorted(_SMALL))),
        st.tuples(st.just("remove"), st.sampled_from(sorted(_SMALL))),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 10.0, 29.0, 30.0, 31.0, 100.0])),
        st.tuples(st.just("clock back"), st.sampled_from([1.0, 50.0])),
        st.tuples(st.just("limit"), st.sampled_from([10.0, 30.0, 60.0])),
        st.tuples(st.just("ghosts"), st.sampled_from([5.0, 40.0, 200.0])),
    ),
    max_size=40,
)


@settings(max_examples=300)
@given(_STALENESS_STEPS)
@example([("snapshot", "a"), ("wait", 29.0), ("heartbeat", "a"), ("wait", 29.0), ("wait", 31.0)])
@example([("snapshot", "a"), ("clock back", 50.0), ("heartbeat", "a"), ("wait", 31.0)])
@example([("snapshot", "a"), ("clock back", 50.0), ("snapshot", "a"), ("wait", 31.0)])
@example([("snapshot", "a"), ("remove", "a"), ("wait", 31.0)])
@example([("static", "a"), ("snapshot", "a"), ("wait", 31.0)])
@example([("snapshot", "a"), ("wait", 31.0), ("limit", 60.0), ("limit", 10.0)])
def test_stale_nodes_are_what_a_scan_of_every_node_says(steps: list[tuple[str, object]]) -> None:
    """The node book finds stale nodes from a heap of report times (`NodeBook._sweep`); at
    every step it must name exactly the nodes whose own record says they are stale, through
    reports, removals, inventory nodes, a changed limit and a clock that steps back."""
    clock = Clock()
    state = ClusterState(clock=clock, stale_after_s=30)
    for sequence, (kind, arg) in enumerate(steps, start=1):
        if kind == "snapshot":
            state.apply_snapshot(_SMALL[str(arg)], incarnation=1, sequence=sequence)
        elif kind == "heartbeat":
            state.heartbeat(str(arg), incarnation=1, sequence=sequence)
        elif kind == "static":
            state.add_static(_SMALL[str(arg)])
        elif kind == "remove":
            state.remove_node(str(arg))
        elif kind == "wait":
            clock.now += float(str(arg))
        elif kind == "clock back":
            clock.now -= float(str(arg))
        elif kind == "limit":
            state.stale_after_s = float(str(arg))
        else:
            ttl = float(str(arg))
            want = sorted(
                n
                for n in state.node_names
                if (rec := state.record(n)) is not None
                and rec.source == "exporter"
                and clock.now - rec.last_report > ttl
            )
            assert state.forget_ghosts(ttl_s=ttl, live=set(), has_object=lambda n: False) == want
        scanned = [n for n in state.node_names if state.is_stale(n)]
        assert state.stale_nodes() == scanned


def test_finding_stale_nodes_looks_at_each_node_about_once_per_limit_not_per_tick() -> None:
    """What the index saves, as a count (not a time, so machine speed does not matter): 200
    nodes beating every 10 s, a tick every second for 300 s, going stale after 30 s. A scan
    looks at every node each tick (60,000 looks); the heap looks at a node when its entry
    passes the cut-off, about once per 30 s (2,000). The bound leaves twice that."""
    clock = Clock()
    state = ClusterState(clock=clock, stale_after_s=30)
    names = [f"n{i}" for i in range(200)]
    for name in names:
        state.apply_snapshot(nvswitch_node(name, gpus=1), incarnation=1, sequence=1)
    looks = [0]
    is_stale = state.nodes._is_stale

    def counted(rec: object, now: float) -> bool:
        looks[0] += 1
        return is_stale(rec, now)  # type: ignore[arg-type]

    state.nodes._is_stale = counted  # type: ignore[method-assign]
    for second in range(1, 301):
        clock.now += 1
        for i, name in enumerate(names):
            if (second + i) % 10 == 0:
                state.heartbeat(name, incarnation=1, sequence=1 + second)
        assert state.check_stale() == []
    assert 0 < looks[0] <= 2 * len(names) * 300 // 30
