"""The status the binder writes on group objects, computed from the group's pods.

- scheduler-plugins' coscheduling `PodGroup` (`apis/scheduling/v1alpha1/types.go`): `phase`
  (Pending, Scheduling, Running, Unknown, Finished, Failed, with upstream's meanings), the
  counts `running`, `succeeded`, `failed`, and `scheduleStartTime`. Current upstream has no
  `scheduled` count (older releases did); its CRD would prune one, so none is written.
- the native `PodGroup` (k8s.io/api `scheduling/v1beta1/types.go`): the condition
  `PodGroupInitiallyScheduled`, True once the gang first fully bound (terminal: it never goes
  back to False), else False with reason `Unschedulable` or `SchedulerError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.decisions import Status

__all__ = [
    "INITIALLY_SCHEDULED",
    "coscheduling_status",
    "native_conditions",
    "pod_counts",
]

INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"


def pod_counts(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Every pod of a group, finished ones included: how many are bound (`scheduled`),
    Running, Succeeded and Failed."""
    out = {"scheduled": 0, "running": 0, "succeeded": 0, "failed": 0}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            out["scheduled"] += 1
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            out["running"] += 1
        elif phase == "Succeeded":
            out["succeeded"] += 1
        elif phase == "Failed":
            out["failed"] += 1
    return out


def coscheduling_status(
    minimum: int, counts: Mapping[str, int], *, start_time: str
) -> dict[str, Any]:
    """`status` of a coscheduling PodGroup: the phase by upstream's definitions, in order:
    Finished (`minMember` succeeded), Failed (a pod failed and too few are left to reach
    `minMember`), Running (`minMember` running), Scheduling (`minMember` bound), Unknown (some
    bound, not `minMember`), else Pending. `start_time` is kept once set."""
    running, succeeded, failed = counts["running"], counts["succeeded"], counts["failed"]
    if succeeded >= minimum:
        phase = "Finished"
    elif failed and running + succeeded < minimum:
        phase = "Failed"
    elif running >= minimum:
        phase = "Running"
    elif counts["scheduled"] >= minimum:
        phase = "Scheduling"
    elif counts["scheduled"]:
        phase = "Unknown"
    else:
        phase = "Pending"
    return {
        "phase": phase,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
        "scheduleStartTime": start_time,
    }


def native_conditions(
    existing: Sequence[Mapping[str, Any]],
    status: Status,
    message: str,
    *,
    now: str,
    generation: int = 0,
) -> list[dict[str, Any]] | None:
    """The `status.conditions` to write on a native PodGroup after a decision, or None when
    nothing changes. Success sets `PodGroupInitiallyScheduled=True`; Unschedulable (and
    UnschedulableAndUnresolvable) set it False with reason `Unschedulable`; Error sets it False
    with `SchedulerError`; Wait leaves it alone. Once True it stays True."""
    if status is Status.WAIT:
        return None
    others = [dict(c) for c in existing if c.get("type") != INITIALLY_SCHEDULED]
    old = next((c for c in existing if c.get("type") == INITIALLY_SCHEDULED), None)
    if old is not None and old.get("status") == "True":
        return None
    if status is Status.SUCCESS:
        value, reason = "True", "Scheduled"
    elif status is Status.ERROR:
        value, reason = "False", "SchedulerError"
    else:
        value, reason = "False", "Unschedulable"
    if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
        value,
        reason,
        message[:32768],
    ):
        return None
    changed = old is None or old.get("status") != value
    condition = {
        "type": INITIALLY_SCHEDULED,
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "observedGeneration": generation,
        "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime"),
    }
    return [*others, condition]
