"""Group status as upstream defines it: the coscheduling phase and counts, the native
PodGroupInitiallyScheduled condition (terminal once True)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.decisions import Status
from scheduler.status import INITIALLY_SCHEDULED, coscheduling_status, native_conditions, pod_counts


def _pod(node: str = "", phase: str = "Pending") -> dict[str, Any]:
    return {"spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("pods", "minimum", "want"),
    [
        pytest.param([_pod(), _pod()], 2, "Pending", id="nothing bound: Pending"),
        pytest.param([_pod("n"), _pod()], 2, "Unknown", id="part of the minimum bound"),
        pytest.param([_pod("n"), _pod("n"), _pod()], 2, "Scheduling", id="minimum bound"),
        pytest.param(
            [_pod("n", "Running"), _pod("n", "Running"), _pod("n")],
            2,
            "Running",
            id="minimum running",
        ),
        pytest.param([_pod("n", "Succeeded"), _pod("n", "Succeeded")], 2, "Finished", id="done"),
        pytest.param(
            [_pod("n", "Failed"), _pod("n", "Running")], 2, "Failed", id="a failure short of it"
        ),
        pytest.param(
            [_pod("n", "Failed"), _pod("n", "Running"), _pod("n", "Running")],
            2,
            "Running",
            id="an elastic extra failed, the minimum still runs",
        ),
    ],
)
def test_the_coscheduling_phase_follows_upstream(
    pods: list[dict[str, Any]], minimum: int, want: str
) -> None:
    status = coscheduling_status(minimum, pod_counts(pods), start_time="t0")
    assert status["phase"] == want
    assert status["scheduleStartTime"] == "t0"


def test_the_counts_are_upstreams() -> None:
    pods = [_pod("n", "Running"), _pod("n", "Succeeded"), _pod("n", "Failed"), _pod()]
    status = coscheduling_status(1, pod_counts(pods), start_time="t")
    assert (status["running"], status["succeeded"], status["failed"]) == (1, 1, 1)
    assert "scheduled" not in status  # current upstream has no such field; its CRD prunes it


def test_initially_scheduled_goes_true_once_and_stays() -> None:
    first = native_conditions([], Status.UNSCHEDULABLE, "no room", now="t1")
    assert first is not None
    assert first[0] | {} == {
        "type": INITIALLY_SCHEDULED,
        "status": "False",
        "reason": "Unschedulable",
        "message": "no room",
        "observedGeneration": 0,
        "lastTransitionTime": "t1",
    }
    assert native_conditions(first, Status.UNSCHEDULABLE, "no room", now="t2") is None
    same = native_conditions(first, Status.UNRESOLVABLE, "no node", now="t2")
    assert same is not None
    assert same[0]["lastTransitionTime"] == "t1"
    done = native_conditions(first, Status.SUCCESS, "bound", now="t3")
    assert done is not None
    assert (done[0]["status"], done[0]["reason"], done[0]["lastTransitionTime"]) == (
        "True",
        "Scheduled",
        "t3",
    )
    # Terminal: a later eviction or error never turns it back.
    assert native_conditions(done, Status.ERROR, "boom", now="t4") is None
    assert native_conditions(done, Status.UNSCHEDULABLE, "evicted", now="t4") is None


def test_an_error_says_scheduler_error_and_waiting_says_nothing() -> None:
    error = native_conditions([], Status.ERROR, "aggregator down", now="t")
    assert error is not None
    assert error[0]["reason"] == "SchedulerError"
    assert native_conditions([], Status.WAIT, "3 more pods", now="t") is None


def test_other_conditions_are_kept() -> None:
    other = {"type": "DisruptionTarget", "status": "False", "reason": "x"}
    out = native_conditions([other], Status.SUCCESS, "bound", now="t")
    assert out is not None
    assert out[0] == other
