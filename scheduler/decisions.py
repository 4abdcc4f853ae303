"""What the binder decides for a group, as typed statuses over what it observed.

Pure functions, so every decision is table-tested away from the API server. The statuses are
kube-scheduler framework's (`pkg/scheduler/framework/interface.go`: Success, Unschedulable,
UnschedulableAndUnresolvable, Wait, Error), so an operator reads gputopo's Events with the
vocabulary kube-scheduler taught them:

- `Unschedulable`: may fit once something changes (GPUs free up, a node recovers); retried soon;
- `UnschedulableAndUnresolvable`: no departure can make it fit (a node selector that matches no
  node, a request the policy cannot express, a malformed group): retried rarely, after a fix;
- `Wait`: the gang has not reached its minimum;
- `Error`: the binder or the aggregator failed; retried.

A placement's verdict comes from its `RejectionCode`s (`gputopo/placement/result.py`), never
from matching message text. A group's life is then one of these steps:

1. **wait** for the minimum (or **timeout** after `scheduleTimeoutSeconds`);
2. **place** the whole gang, record it on every pod, **bind**, **commit**;
3. once committed the gang is bound for good: **keep** it; pods beyond the minimum and
   replacements of members that left are **grown** next to it (the departed member's slot of
   the committed reservation first, else the closest domain that holds the pod);
4. a placement that never fully bound and cannot finish is **undone** (bound pods deleted so
   their controller recreates them) unless one of its pods is Running: a Running pod is never
   deleted; such a gang is **adopted** (kept, the rest placed next to it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gputopo.placement.result import PlacementResult, RejectionCode

__all__ = [
    "NEAR_KEYS",
    "Decision",
    "GroupView",
    "Hold",
    "Status",
    "Step",
    "Unit",
    "decide_group",
    "decide_unit",
    "near_selectors",
    "status_of_call",
    "status_of_result",
]


class Status(enum.StrEnum):
    """kube-scheduler framework's status codes, spelt as it spells them."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    WAIT = "Wait"
    ERROR = "Error"


class Step(enum.StrEnum):
    """What the binder does next for a group or one of its placements."""

    WAIT = "wait"
    TIMEOUT = "timeout"
    PLACE = "place"
    BIND = "bind"
    COMMIT = "commit"
    KEEP = "keep"
    GROW = "grow"
    UNDO = "undo"
    ADOPT = "adopt"
    ASK = "ask"


class Hold(enum.StrEnum):
    """What the aggregator says of a recorded reservation."""

    HELD = "held"  # alive, not yet committed (expires at its TTL)
    COMMITTED = "committed"  # kept until released: the gang fully bound once
    GONE = "gone"  # expired or released
    UNKNOWN = "unknown"  # the aggregator did not answer


@dataclass(frozen=True, slots=True)
class Decision:
    """A status, the step it leads to, and one line saying why (the Event's text)."""

    status: Status
    step: Step
    why: str


# Rejections no departure can cure: a selector that matches no node, a request the policy
# cannot express. Everything else (capacity, fragmentation, scope, bandwidth over links in use,
# health) may change. `internal` is a broken rule in the engine: an error, not a verdict.
_UNRESOLVABLE = frozenset({RejectionCode.SELECTOR, RejectionCode.UNSUPPORTED})


def status_of_result(result: PlacementResult) -> Status:
    """The status of a placement answer: Success when placed; Error when the engine broke a
    rule; UnschedulableAndUnresolvable when every rejection is of a kind no departure cures;
    else Unschedulable."""
    if result.placed:
        return Status.SUCCESS
    codes = {r.code for r in result.rejections} - {RejectionCode.MORE}
    if RejectionCode.INTERNAL in codes:
        return Status.ERROR
    if codes and codes <= _UNRESOLVABLE:
        return Status.UNRESOLVABLE
    return Status.UNSCHEDULABLE


def status_of_call(grpc_status: str) -> Status:
    """The status of a failed Place call: a request the server refuses as invalid is
    unresolvable until the user fixes it; anything else (unavailable, not the leader, a
    deadline) is an error to retry."""
    return Status.UNRESOLVABLE if grpc_status == "INVALID_ARGUMENT" else Status.ERROR


@dataclass(frozen=True, slots=True)
class Unit:
    """One recorded placement of a group (one reservation) as observed in a pass."""

    size: int  # pods it was recorded on (`gputopo.io/gang-size`)
    recorded: int  # live pods recording it
    bound: int  # of those, bound to a node
    running: int  # of those, in phase Running
    hold: Hold
    nodes_exist: bool = True


def decide_unit(unit: Unit) -> Decision:
    """Carry a recorded placement forward: keep, commit, bind, adopt or undo it."""
    if unit.hold is Hold.UNKNOWN:
        return Decision(Status.ERROR, Step.ASK, "the aggregator did not say whether it holds it")
    if unit.hold is Hold.COMMITTED:
        return Decision(
            Status.SUCCESS, Step.KEEP, f"bound; {unit.recorded} of its {unit.size} pod(s) live"
        )
    whole = unit.recorded >= unit.size
    if whole and unit.bound == unit.recorded:
        return Decision(Status.SUCCESS, Step.COMMIT, f"all {unit.size} pod(s) bound")
    if unit.hold is Hold.HELD and whole and unit.nodes_exist:
        left = unit.recorded - unit.bound
        return Decision(Status.SUCCESS, Step.BIND, f"{left} of {unit.size} pod(s) left to bind")
    if unit.hold is Hold.GONE:
        why = "its reservation expired before every pod was bound"
    elif not whole:
        gone = unit.size - unit.recorded
        why = f"{gone} of its {unit.size} pod(s) went away before every pod was bound"
    else:
        why = "a node it was placed on is gone"
    if unit.running:
        return Decision(
            Status.UNSCHEDULABLE,
            Step.ADOPT,
            f"{why}; its {unit.running} Running pod(s) are kept and the others are placed"
            " next to them",
        )
    deleted = f"; its {unit.bound} bound pod(s) are deleted" if unit.bound else ""
    return Decision(Status.UNSCHEDULABLE, Step.UNDO, f"{why}{deleted}; the gang is placed again")


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group with no placement in progress, as observed in a pass."""

    placed: bool  # a committed placement exists (the gang is bound)
    waiting: int  # live pods with no record and no node
    lacking: int  # pods still missing for the minimum (0 when reached)
    waited_s: float  # since its oldest live pod was created
    timeout_s: float | None = None  # scheduleTimeoutSeconds


def decide_group(view: GroupView) -> Decision:
    """Grow a bound gang, place one that reached its minimum, or wait (or time out)."""
    if view.placed:
        if view.waiting:
            return Decision(
                Status.SUCCESS,
                Step.GROW,
                f"{view.waiting} pod(s) beyond the bound gang are placed next to it",
            )
        return Decision(Status.SUCCESS, Step.KEEP, "bound")
    if not view.waiting:
        return Decision(Status.SUCCESS, Step.KEEP, "nothing to place")
    if view.lacking:
        if view.timeout_s is not None and view.waited_s > view.timeout_s:
            return Decision(
                Status.UNSCHEDULABLE,
                Step.TIMEOUT,
                f"the gang did not reach its minimum within scheduleTimeoutSeconds"
                f" ({view.timeout_s:g} s; {view.lacking} pod(s) missing)",
            )
        return Decision(Status.WAIT, Step.WAIT, f"waiting for {view.lacking} more pod(s)")
    return Decision(Status.SUCCESS, Step.PLACE, "the gang reached its minimum")


# Node labels from the closest domain to the widest: the node, the NVLink domain, the switch
# tiers (topograph v1, which gputopo publishes by default, and v0), the zone.
NEAR_KEYS = (
    "kubernetes.io/hostname",
    "accelerator.topograph.run/sub-domain",
    "accelerator.topograph.run/domain",
    "network.topology.nvidia.com/accelerator",
    "fabric.topograph.run/tier-0",
    "network.topology.nvidia.com/leaf",
    "fabric.topograph.run/tier-1",
    "network.topology.nvidia.com/spine",
    "fabric.topograph.run/tier-2",
    "network.topology.nvidia.com/core",
    "topology.kubernetes.io/zone",
)


def near_selectors(
    gang_nodes: Sequence[Mapping[str, str]], *, required: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """Node selectors to try, closest to the gang first, for a pod joining it.

    `gang_nodes` are the labels of the nodes its bound pods are on, one entry per pod (so a
    node with more of the gang comes first). Each rung selects one value of one `NEAR_KEYS`
    key the gang's nodes carry; the last rung is `required` alone (the gang's topology domain,
    which every rung also keeps) or the whole cluster."""
    must = dict(required or {})
    out: list[dict[str, str]] = []
    for key in NEAR_KEYS:
        counts: dict[str, int] = {}
        for labels in gang_nodes:
            value = labels.get(key)
            if value is not None:
                counts[value] = counts.get(value, 0) + 1
        for value in sorted(counts, key=lambda v: (-counts[v], v)):
            if key in must and must[key] != value:
                continue
            rung = {**must, key: value}
            if rung not in out:
                out.append(rung)
    if must not in out:
        out.append(must)
    return out
