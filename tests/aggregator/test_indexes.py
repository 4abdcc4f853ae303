"""Per-domain GPU counts kept incrementally equal the ones computed from scratch."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from aggregator.indexes import DomainIndex
from aggregator.ingest import IngestStats
from aggregator.metrics import AggregatorCollector, Sources
from aggregator.state import ClusterState
from gputopo.placement import place
from gputopo.request import Scope, request_from_mapping
from tests.builders import nvswitch_node

SCOPES = {"nvlink": Scope.NVLINK, "tier-0": Scope.LEAF, "tier-1": Scope.SPINE, "zone": Scope.ZONE}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def from_scratch(state: ClusterState) -> dict[tuple[str, str], tuple[int, int]]:
    """(level, domain) -> (total, free), from a snapshot, as placement sees the cluster."""
    snap = state.snapshot()
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for level, scope in SCOPES.items():
        for domain, members in snap.domains(scope).items():
            for name in members:
                node = snap.node(name)
                out[(level, domain)][0] += node.topology.gpu_count
                out[(level, domain)][1] += node.free_count
    return {k: (v[0], v[1]) for k, v in out.items()}


def incremental(index: DomainIndex) -> dict[tuple[str, str], tuple[int, int]]:
    return {
        (level, domain): (s.total_gpus, s.free_gpus)
        for level in SCOPES
        for domain, s in index.domains(level).items()
    }


NAMES = [f"n{i}" for i in range(6)]
T = ("leaf-a", "spine-1")
operation = st.one_of(
    st.tuples(
        st.just("report"),
        st.sampled_from(NAMES),
        st.sampled_from([2, 4, 8]),
        st.sampled_from(["leaf-a", "leaf-b", ""]),
        st.sampled_from(["spine-1", "spine-2"]),
        st.sampled_from(["", "nvl-1"]),
    ),
    st.tuples(st.just("reserve"), st.sampled_from([1, 2, 4])),
    st.tuples(st.just("release"), st.integers(0, 10)),
    st.tuples(st.just("time"), st.sampled_from([1.0, 20.0, 40.0])),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.just("zone"), st.sampled_from(NAMES), st.sampled_from(["z1", "z2"])),
)


@given(st.lists(operation, max_size=25))
def test_the_index_follows_every_change(ops: list[tuple[object, ...]]) -> None:
    clock = Clock()
    state = ClusterState(clock=clock, stale_after_s=30)
    seq: dict[str, int] = defaultdict(int)
    reservations: list[str] = []
    for op in ops:
        kind = op[0]
        if kind == "report":
            _, name, gpus, leaf, spine, domain = op
            tiers = (str(leaf), str(spine)) if leaf else ()
            seq[str(name)] += 1
            topo = nvswitch_node(
                str(name), gpus=int(str(gpus)), nics=1, tiers=tiers, domain=str(domain)
            )
            state.apply_snapshot(topo, incarnation=1, sequence=seq[str(name)])
        elif kind == "reserve":
            req = request_from_mapping({"groups": [{"name": "g", "gpus_per_pod": op[1]}]})
            result, _ = place(state.snapshot(), req)
            if result.placed:
                reservations.append(state.reserve(result, ttl_s=25).id)
        elif kind == "release":
            live = [r for r in reservations if state.reservation(r) is not None]
            if live:
                state.release(live[int(str(op[1])) % len(live)])
        elif kind == "time":
            clock.now += float(str(op[1]))
            state.expire()
        elif kind == "remove":
            state.remove_node(str(op[1]))
        elif kind == "zone":
            state.set_labels(str(op[1]), {"topology.kubernetes.io/zone": str(op[2])})
        state.check_stale()
        assert incremental(state.index) == from_scratch(state)
    assert len(state.index) == len(state.node_names)


def test_a_tier_name_reused_under_two_parents_is_ambiguous() -> None:
    index = DomainIndex()
    a = nvswitch_node("a", gpus=2, nics=0, tiers=("rack-1", "spine-1"))
    b = nvswitch_node("b", gpus=2, nics=0, tiers=("rack-1", "spine-2"))
    index.update(a, free=2, placeable=True, labels={})
    assert not index.tier_value_is_ambiguous(0, "rack-1")
    index.update(b, free=2, placeable=True, labels={})
    assert index.tier_value_is_ambiguous(0, "rack-1")
    assert set(index.domains("tier-0")) == {"spine-1/rack-1", "spine-2/rack-1"}
    index.remove("b")
    assert not index.tier_value_is_ambiguous(0, "rack-1")


def test_gpus_held_beyond_a_shrunken_node_are_not_counted_against_its_free_ones() -> None:
    """A node reports again with fewer GPUs while reservations still hold some of the ones it
    lost: it has no free GPUs, never a negative number (in the index and in the metrics)."""
    state = ClusterState(clock=Clock(), stale_after_s=30)
    state.apply_snapshot(nvswitch_node("n0", gpus=4, nics=1, tiers=T), incarnation=1, sequence=1)
    one = request_from_mapping({"groups": [{"name": "g", "gpus_per_pod": 1}]})
    for _ in range(3):
        result, _ = place(state.snapshot(), one)
        state.reserve(result, ttl_s=25)
    state.apply_snapshot(nvswitch_node("n0", gpus=2, nics=1, tiers=T), incarnation=1, sequence=2)
    assert state.held_gpus() == {"n0": frozenset({0, 1, 2})}
    assert (
        incremental(state.index)
        == from_scratch(state)
        == {
            ("tier-0", "spine-1/leaf-a"): (2, 0),
            ("tier-1", "spine-1"): (2, 0),
        }
    )
    samples = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in AggregatorCollector(Sources(state=state, ingest=IngestStats())).collect()
        for s in m.samples
    }
    assert samples[("gputopo_aggregator_gpus", (("state", "free"),))] == 0
