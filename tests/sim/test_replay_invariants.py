"""No policy may break a gang or double-book a GPU in the replay: the engine refuses it, and an
independent check over the whole replay's allocations finds no overlap."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.placement import PlacementResult
from gputopo.request import Group, PlacementRequest
from gputopo.sim.clusters import Cluster, lingjun_cluster, nvl72_cluster
from gputopo.sim.engine import SIM_POLICIES, Engine, InvariantError
from gputopo.sim.jobtime import JobTimeModel
from gputopo.sim.replay import ReplayOptions, replay
from gputopo.sim.traces import JobClass, SimJob, llm_mix
from tests.builders import nvswitch_node, pcie_node


def _snapshot(cluster: Cluster) -> ClusterSnapshot:
    return ClusterSnapshot(NodeState(n, frozenset(range(n.gpu_count))) for n in cluster.nodes)


def _small_lingjun() -> Cluster:
    rows = ["ip,DSW,PSW,ASW"] + [f"h{i},G1,P{i // 6},S{i // 3}" for i in range(12)]
    return lingjun_cluster("\n".join(rows))


class RecordingEngine(Engine):
    """The engine, keeping every allocation with the time the replay gave it."""

    def __init__(self, snapshot: ClusterSnapshot, policy: str) -> None:
        super().__init__(snapshot, policy)
        self.allocations: list[tuple[str, Mapping[str, frozenset[int]]]] = []

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = super().place(request)
        if result.placed:
            self.allocations.append((request.job, result.allocation()))
        return result


def _assert_no_gpu_held_twice(engine: RecordingEngine, jobs: list[SimJob], records: list) -> None:
    """Independent of the engine: intervals of every (node, GPU) never overlap."""
    by_name = {r.name: r for r in records}
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for job, alloc in engine.allocations:
        rec = by_name[job]
        for node, gpus in alloc.items():
            for g in gpus:
                held.setdefault((node, g), []).append((rec.start, rec.finish, job))
    for key, spans in held.items():
        spans.sort()
        for (_s0, f0, j0), (s1, _, j1) in itertools.pairwise(spans):
            assert s1 >= f0, f"GPU {key} held by {j0} until {f0} and by {j1} from {s1}"
    for job in jobs:
        rec = by_name[job.name]
        if rec.started:
            got = sum(len(g) for j, a in engine.allocations if j == job.name for g in a.values())
            assert got == job.gpus, f"{job.name}: gang of {job.gpus} GPUs got {got}"


@pytest.mark.parametrize("policy", SIM_POLICIES)
def test_every_policy_keeps_gangs_whole_and_gpus_single_booked(policy: str) -> None:
    cluster = nvl72_cluster(2)
    jobs = llm_mix(60, seed=3, cluster_gpus=cluster.gpus, node_gpus=4, load=1.5)
    engine = RecordingEngine(_snapshot(cluster), policy)
    model = JobTimeModel({n.name: n for n in cluster.nodes})
    result = replay(jobs, engine, model, options=ReplayOptions(backfill=True))
    _assert_no_gpu_held_twice(engine, jobs, result.records)
    assert engine.decisions > 20  # the check had something to check
    assert len({r.order for r in result.records if r.started}) == engine.decisions


@st.composite
def _jobs(draw: st.DrawFn) -> list[SimJob]:
    out = []
    t = 0.0
    for i in range(draw(st.integers(5, 25))):
        t += draw(st.floats(0, 50))
        pods = draw(st.integers(1, 6))
        per = draw(st.sampled_from([1, 2, 4, 8]))
        request = PlacementRequest(groups=(Group("g", pods=pods, gpus_per_pod=per),), job=f"j{i}")
        duration = draw(st.floats(1, 200))
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        out.append(SimJob(f"j{i}", t, duration, JobClass.TRAIN, request, tp=tp))
    return out


@given(jobs=_jobs(), policy=st.sampled_from(SIM_POLICIES), backfill=st.booleans())
def test_random_traces_never_break_the_invariants(
    jobs: list[SimJob], policy: str, backfill: bool
) -> None:
    nodes = [
        nvswitch_node("a", tiers=("l1", "s")),
        nvswitch_node("b", tiers=("l1", "s")),
        pcie_node("c", gpus=8, bridged_pairs=[(0, 1), (2, 3)], tiers=("l2", "s")),
        nvswitch_node("d", gpus=4, nics=4, tiers=("l2", "s")),
    ]
    cluster = Cluster("mixed", tuple(nodes))
    engine = RecordingEngine(_snapshot(cluster), policy)
    model = JobTimeModel({n.name: n for n in nodes})
    result = replay(jobs, engine, model, options=ReplayOptions(backfill=backfill))
    _assert_no_gpu_held_twice(engine, jobs, result.records)
    for rec in result.records:
        assert rec.started or rec.dropped, f"{rec.name} neither ran nor was dropped"
    assert engine.snapshot.free_gpus == cluster.gpus  # everything released at the end


class _StalePolicy:
    """Places every request on the empty cluster it was born with: double-books."""

    name = "stale"

    def __init__(self, empty: ClusterSnapshot, inner: str) -> None:
        self.empty = empty
        self.inner = Engine(empty, inner)

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        return self.inner._policy.place(self.empty, request)


class _GangBreaker:
    """Places all but the last pod of the gang."""

    name = "breaker"

    def __init__(self, empty: ClusterSnapshot) -> None:
        self.inner = Engine(empty, "first-fit")

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        result = self.inner._policy.place(snapshot, request)
        return dataclasses.replace(result, pods=result.pods[:-1])


def _with_policy(engine: Engine, policy: object) -> Engine:
    engine._policy = policy  # type: ignore[assignment]
    return engine


def test_a_double_booking_policy_fails_the_replay() -> None:
    snap = _snapshot(_small_lingjun())
    engine = _with_policy(Engine(snap, "first-fit"), _StalePolicy(snap, "first-fit"))
    request = PlacementRequest(groups=(Group("g", pods=2, gpus_per_pod=4),), job="x")
    engine.place(request)
    with pytest.raises(InvariantError, match="already taken"):
        engine.place(request)


def test_a_gang_breaking_policy_fails_the_replay() -> None:
    snap = _snapshot(_small_lingjun())
    engine = _with_policy(Engine(snap, "first-fit"), _GangBreaker(snap))
    with pytest.raises(InvariantError, match="gang of job x broken"):
        engine.place(PlacementRequest(groups=(Group("g", pods=3, gpus_per_pod=8),), job="x"))


def test_releasing_gpus_that_are_free_is_refused() -> None:
    engine = Engine(_snapshot(_small_lingjun()), "gputopo")
    node = next(iter(engine.snapshot.nodes))
    with pytest.raises(InvariantError, match="not taken"):
        engine.release({node: frozenset({0})})


def test_a_job_no_placement_can_hold_is_dropped_not_queued_forever() -> None:
    cluster = _small_lingjun()  # 12 nodes, 96 GPUs
    big = PlacementRequest(groups=(Group("g", pods=13, gpus_per_pod=8),), job="big")
    small = PlacementRequest(groups=(Group("g", pods=1, gpus_per_pod=8),), job="small")
    jobs = [
        SimJob("big", 0.0, 10.0, JobClass.TRAIN, big),
        SimJob("small", 1.0, 10.0, JobClass.TRAIN, small),
    ]
    engine = Engine(_snapshot(cluster), "gputopo")
    result = replay(jobs, engine, JobTimeModel({n.name: n for n in cluster.nodes}))
    assert result.records[0].dropped == "never fits this cluster"
    assert result.records[1].started
