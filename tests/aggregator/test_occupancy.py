"""Pods bound by anyone hold GPUs: counted from Pod objects, never handed out twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from aggregator.occupancy import Occupancy, PodUse, pod_gpus, pod_use
from aggregator.state import ClusterState
from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.placement.result import PlacementResult, PodPlacement
from tests.builders import pcie_node


def pod(
    name: str = "p",
    *,
    node: str = "n1",
    gpus: int | str = 4,
    init_gpus: int = 0,
    phase: str = "Running",
    reservation: str = "",
    requests_only: bool = False,
) -> dict[str, Any]:
    res_key = "requests" if requests_only else "limits"
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if reservation:
        meta["annotations"] = {"gputopo.io/reservation": reservation}
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "c", "resources": {res_key: {"nvidia.com/gpu": str(gpus)}}}],
    }
    if init_gpus:
        spec["initContainers"] = [
            {"name": "i", "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}
        ]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@dataclass(frozen=True)
class UseCase:
    pod: dict[str, Any]
    want: PodUse | None


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            UseCase(pod(), PodUse("team-a/p", "n1", 4)), id="a running pod holds its limit"
        ),
        pytest.param(
            UseCase(pod(requests_only=True), PodUse("team-a/p", "n1", 4)),
            id="requests count when there is no limit",
        ),
        pytest.param(
            UseCase(pod(gpus=2, init_gpus=6), PodUse("team-a/p", "n1", 6)),
            id="an init container asking more sets the pod's count",
        ),
        pytest.param(UseCase(pod(node=""), None), id="unbound: holds nothing yet"),
        pytest.param(UseCase(pod(phase="Succeeded"), None), id="finished: holds nothing"),
        pytest.param(UseCase(pod(phase="Failed"), None), id="failed: holds nothing"),
        pytest.param(
            UseCase(pod(phase="Pending"), PodUse("team-a/p", "n1", 4)),
            id="bound but not started: already holds",
        ),
        pytest.param(UseCase(pod(gpus=0), None), id="no GPUs asked"),
        pytest.param(UseCase(pod(gpus="lots"), None), id="a value that is no count asks for none"),
        pytest.param(
            UseCase(pod(reservation="r1"), PodUse("team-a/p", "n1", 4, "r1")),
            id="a pod of a reservation says which",
        ),
    ],
)
def test_what_a_pod_holds(case: UseCase) -> None:
    assert pod_use(case.pod) == case.want


def test_pod_gpus_sums_containers() -> None:
    two = pod(gpus=3)
    two["spec"]["containers"].append(
        {"name": "d", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    )
    assert pod_gpus(two) == 5


def test_the_book_follows_pods_across_nodes_and_deletion() -> None:
    book = Occupancy()
    assert book.upsert(pod(gpus=4)) == {"n1"}
    assert book.held("n1", live=lambda rid: False) == 4
    assert book.upsert(pod(node="n2", gpus=4)) == {"n1", "n2"}  # rebound elsewhere: both move
    assert book.held("n1", live=lambda rid: False) == 0
    assert book.remove(pod(node="n2")) == {"n2"}
    assert book.held("n2", live=lambda rid: False) == 0
    assert book.remove(pod()) == set()


def _state_with_node(gpus: int = 8) -> ClusterState:
    state = ClusterState(clock=lambda: 1000.0)
    state.add_static(pcie_node("n1", gpus=gpus))
    return state


def test_pods_bound_by_someone_else_leave_the_free_gpus() -> None:
    state = _state_with_node()
    assert len(state.snapshot().node("n1").free) == 8
    state.pod_seen(pod("a", gpus=4))
    state.pod_seen(pod("b", gpus=2))
    assert state.snapshot().node("n1").free == frozenset({0, 1})
    state.pod_seen(pod("c", gpus=8))  # more than the node has: nothing is free, never negative
    assert state.snapshot().node("n1").free == frozenset()
    state.pod_deleted(pod("c"))
    state.pod_deleted(pod("b"))
    assert len(state.snapshot().node("n1").free) == 4


def test_a_pod_of_a_live_reservation_is_not_counted_twice() -> None:
    state = _state_with_node()
    result = PlacementResult(
        placed=True,
        policy="gputopo",
        pods=(PodPlacement(group="g", replica=0, pod=0, rank=0, node="n1", gpus=(0, 1, 2, 3)),),
    )
    held = state.reserve(result, ttl_s=60)
    state.pod_seen(pod("a", gpus=4, reservation=held.id))
    assert state.snapshot().node("n1").free == frozenset({4, 5, 6, 7})
    state.release(held.id)  # the reservation is gone, the pod still runs: it counts now
    assert len(state.snapshot().node("n1").free) == 4


def test_the_kubelets_exact_gpus_win_and_a_pod_it_has_not_reported_yet_still_counts() -> None:
    state = _state_with_node()
    state.pod_seen(pod("a", gpus=2))
    state.pod_seen(pod("b", gpus=2))  # bound, but the kubelet has not reported it yet
    state.set_kubelet_use(
        "n1",
        GpuUse(
            held={
                0: GpuHolder("team-a", "a", "c", "nvidia.com/gpu"),
                3: GpuHolder("team-a", "a", "c", "nvidia.com/gpu"),
            }
        ),
    )
    # a holds 0 and 3 exactly; b's 2 GPUs are counted: the two highest free ones are left out
    assert state.snapshot().node("n1").free == frozenset({1, 2, 4, 5})
    state.set_kubelet_use("n1", GpuUse(reason="kubelet List: UNAVAILABLE"))
    assert len(state.snapshot().node("n1").free) == 4  # unknown: back to counting both pods
    state.set_kubelet_use("n1", None)
    assert len(state.snapshot().node("n1").free) == 4


@pytest.mark.parametrize(
    ("recorded", "want_free"),
    [
        pytest.param("0,1,2,3", {4, 5, 6, 7}, id="the recorded GPUs, exactly"),
        pytest.param("4,5,6,7", {0, 1, 2, 3}, id="not the highest: the recorded ones"),
        pytest.param("0,1", {0, 1, 2, 3}, id="a record of another count locates nothing"),
        pytest.param("a,b,c,d", {0, 1, 2, 3}, id="a malformed record locates nothing"),
    ],
)
def test_a_pod_past_its_reservation_holds_the_gpus_gputopo_recorded_for_it(
    recorded: str, want_free: set[int]
) -> None:
    """Seen under load in the kill -9 test: the binder stalled past its reservation's TTL after
    binding; the reservation expired and, counted rather than located, the pod's GPUs 0-3 read
    as free while 4-7 were left out, so the next placement was given 0-3 again."""
    state = _state_with_node()
    bound = pod("a", gpus=4, reservation="expired-one")
    bound["metadata"]["annotations"]["gputopo.io/gpus"] = recorded
    state.pod_seen(bound)
    assert state.snapshot().node("n1").free == frozenset(want_free)
