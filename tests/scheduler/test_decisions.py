"""The binder's decisions, away from the API server: typed statuses from rejection codes, and
each step a group or one of its placements can take, as stories."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gputopo.placement.result import PlacementResult, Rejection, RejectionCode
from scheduler.decisions import (
    GroupView,
    Hold,
    Status,
    Step,
    Unit,
    decide_group,
    decide_unit,
    near_selectors,
    status_of_call,
    status_of_result,
)


def _unplaced(*codes: RejectionCode) -> PlacementResult:
    rejections = tuple(Rejection(f"node/n{i}", c, "x") for i, c in enumerate(codes))
    return PlacementResult(placed=False, policy="gputopo", reason="no", rejections=rejections)


@pytest.mark.parametrize(
    ("result", "want"),
    [
        pytest.param(PlacementResult(placed=True, policy="p"), Status.SUCCESS, id="placed"),
        pytest.param(
            _unplaced(RejectionCode.INSUFFICIENT_GPUS),
            Status.UNSCHEDULABLE,
            id="too few free GPUs: a departure can cure it",
        ),
        pytest.param(
            _unplaced(RejectionCode.SELECTOR),
            Status.UNRESOLVABLE,
            id="a selector that matches no node: no departure helps",
        ),
        pytest.param(
            _unplaced(RejectionCode.SELECTOR, RejectionCode.UNSUPPORTED, RejectionCode.MORE),
            Status.UNRESOLVABLE,
            id="only incurable codes, with a 'more' marker",
        ),
        pytest.param(
            _unplaced(RejectionCode.SELECTOR, RejectionCode.FRAGMENTED),
            Status.UNSCHEDULABLE,
            id="one domain only fragmented: waiting may help",
        ),
        pytest.param(
            _unplaced(RejectionCode.INTERNAL, RejectionCode.INSUFFICIENT_GPUS),
            Status.ERROR,
            id="the engine broke a rule: an error, not a verdict",
        ),
        pytest.param(_unplaced(), Status.UNSCHEDULABLE, id="no reason given: try again"),
    ],
)
def test_a_placement_answer_is_typed_by_its_rejection_codes(
    result: PlacementResult, want: Status
) -> None:
    assert status_of_result(result) == want


@pytest.mark.parametrize(
    ("grpc", "want"),
    [
        ("INVALID_ARGUMENT", Status.UNRESOLVABLE),
        ("UNAVAILABLE", Status.ERROR),
        ("FAILED_PRECONDITION", Status.ERROR),
        ("DEADLINE_EXCEEDED", Status.ERROR),
    ],
)
def test_a_failed_place_call_is_typed_by_its_grpc_status(grpc: str, want: Status) -> None:
    assert status_of_call(grpc) == want


@dataclass(frozen=True)
class UnitCase:
    id: str
    unit: Unit
    want_status: Status
    want_step: Step
    want_in_why: str


UNIT_CASES = [
    UnitCase(
        "a committed gang is kept, even with a member gone",
        Unit(size=3, recorded=2, bound=2, running=2, hold=Hold.COMMITTED),
        Status.SUCCESS,
        Step.KEEP,
        "2 of its 3",
    ),
    UnitCase(
        "every recorded pod bound: commit",
        Unit(size=4, recorded=4, bound=4, running=0, hold=Hold.HELD),
        Status.SUCCESS,
        Step.COMMIT,
        "all 4",
    ),
    UnitCase(
        "bound whole but the reservation expired first: commit (the pods hold the GPUs)",
        Unit(size=2, recorded=2, bound=2, running=0, hold=Hold.GONE),
        Status.SUCCESS,
        Step.COMMIT,
        "all 2",
    ),
    UnitCase(
        "a binder killed between binds: bind the rest",
        Unit(size=4, recorded=4, bound=1, running=0, hold=Hold.HELD),
        Status.SUCCESS,
        Step.BIND,
        "3 of 4",
    ),
    UnitCase(
        "the reservation expired mid-binding, nothing runs: undo",
        Unit(size=4, recorded=4, bound=1, running=0, hold=Hold.GONE),
        Status.UNSCHEDULABLE,
        Step.UNDO,
        "expired before every pod was bound; its 1 bound pod(s) are deleted",
    ),
    UnitCase(
        "a recorded pod went away before the gang fully bound: undo",
        Unit(size=3, recorded=2, bound=1, running=0, hold=Hold.HELD),
        Status.UNSCHEDULABLE,
        Step.UNDO,
        "1 of its 3 pod(s) went away",
    ),
    UnitCase(
        "a node went away before binding: undo",
        Unit(size=2, recorded=2, bound=0, running=0, hold=Hold.HELD, nodes_exist=False),
        Status.UNSCHEDULABLE,
        Step.UNDO,
        "a node it was placed on is gone",
    ),
    UnitCase(
        "cannot finish, but a pod already runs: adopt, never delete it",
        Unit(size=3, recorded=3, bound=2, running=1, hold=Hold.GONE),
        Status.UNSCHEDULABLE,
        Step.ADOPT,
        "its 1 Running pod(s) are kept",
    ),
    UnitCase(
        "the aggregator does not answer: ask again",
        Unit(size=2, recorded=2, bound=0, running=0, hold=Hold.UNKNOWN),
        Status.ERROR,
        Step.ASK,
        "did not say",
    ),
]


@pytest.mark.parametrize("case", UNIT_CASES, ids=[c.id for c in UNIT_CASES])
def test_a_recorded_placement_is_carried_forward(case: UnitCase) -> None:
    got = decide_unit(case.unit)
    assert (got.status, got.step) == (case.want_status, case.want_step)
    assert case.want_in_why in got.why


def test_no_decision_ever_deletes_a_running_pod() -> None:
    """Over every observable unit, a unit with a Running pod is never undone."""
    for size in range(1, 4):
        for recorded in range(1, size + 1):
            for bound in range(recorded + 1):
                for running in range(1, bound + 1):
                    for hold in Hold:
                        for nodes in (True, False):
                            unit = Unit(size, recorded, bound, running, hold, nodes)
                            assert decide_unit(unit).step is not Step.UNDO, unit


@dataclass(frozen=True)
class GroupCase:
    id: str
    view: GroupView
    want_status: Status
    want_step: Step


GROUP_CASES = [
    GroupCase(
        "a pod beyond a bound gang's minimum binds as it comes",
        GroupView(placed=True, waiting=1, lacking=0, waited_s=0.0),
        Status.SUCCESS,
        Step.GROW,
    ),
    GroupCase(
        "a replacement of a bound gang's member is grown, not waited for",
        GroupView(placed=True, waiting=1, lacking=2, waited_s=999.0, timeout_s=5.0),
        Status.SUCCESS,
        Step.GROW,
    ),
    GroupCase(
        "a bound gang with nothing waiting is kept",
        GroupView(placed=True, waiting=0, lacking=0, waited_s=0.0),
        Status.SUCCESS,
        Step.KEEP,
    ),
    GroupCase(
        "too few pods yet: wait",
        GroupView(placed=False, waiting=2, lacking=1, waited_s=3.0, timeout_s=10.0),
        Status.WAIT,
        Step.WAIT,
    ),
    GroupCase(
        "too few pods past scheduleTimeoutSeconds: timed out",
        GroupView(placed=False, waiting=2, lacking=1, waited_s=11.0, timeout_s=10.0),
        Status.UNSCHEDULABLE,
        Step.TIMEOUT,
    ),
    GroupCase(
        "the minimum reached: place",
        GroupView(placed=False, waiting=4, lacking=0, waited_s=0.0),
        Status.SUCCESS,
        Step.PLACE,
    ),
]


@pytest.mark.parametrize("case", GROUP_CASES, ids=[c.id for c in GROUP_CASES])
def test_a_group_without_a_placement_in_progress(case: GroupCase) -> None:
    got = decide_group(case.view)
    assert (got.status, got.step) == (case.want_status, case.want_step)


def test_the_timeout_names_the_field_and_what_is_missing() -> None:
    got = decide_group(GroupView(placed=False, waiting=2, lacking=1, waited_s=11, timeout_s=10))
    assert "scheduleTimeoutSeconds (10 s; 1 pod(s) missing)" in got.why


H = "kubernetes.io/hostname"
LEAF = "fabric.topograph.run/tier-0"
ZONE = "topology.kubernetes.io/zone"


@pytest.mark.parametrize(
    ("gang", "required", "want"),
    [
        pytest.param(
            [{H: "a", LEAF: "l1"}, {H: "b", LEAF: "l1"}, {H: "b", LEAF: "l1"}],
            None,
            [{H: "b"}, {H: "a"}, {LEAF: "l1"}, {}],
            id="the node with most of the gang first, then its leaf, then anywhere",
        ),
        pytest.param(
            [{H: "a", LEAF: "l1", ZONE: "z"}, {H: "c", LEAF: "l2", ZONE: "z"}],
            None,
            [{H: "a"}, {H: "c"}, {LEAF: "l1"}, {LEAF: "l2"}, {ZONE: "z"}, {}],
            id="a gang across two leaves: both leaves before the zone",
        ),
        pytest.param(
            [{H: "a", LEAF: "l1", ZONE: "z"}],
            {ZONE: "z"},
            [{ZONE: "z", H: "a"}, {ZONE: "z", LEAF: "l1"}, {ZONE: "z"}],
            id="a required topology domain bounds every rung, and is the last one",
        ),
        pytest.param([], None, [{}], id="no bound pod: anywhere"),
    ],
)
def test_a_pod_joining_a_gang_is_tried_closest_first(
    gang: list[dict[str, str]], required: dict[str, str] | None, want: list[dict[str, str]]
) -> None:
    assert near_selectors(gang, required=required) == want
