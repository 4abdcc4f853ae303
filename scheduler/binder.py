"""The gang binder: bind every pod of a group where gputopo placed it, or none, and never kill
running work to repair a gang.

Pod by pod binding (kube-scheduler, with or without gputopo's extender) was seen leaving 3 of 4
pods of a job bound while the 4th waited forever, holding 24 GPUs no one could use. Here a group
goes through these steps (`scheduler/decisions.py` decides each, typed, from what a pass
observed), and each step leaves a record in the cluster, so a binder killed at any point
finishes or undoes the group when it (or its successor) starts:

1. **Wait** until the pods the group's request needs exist and are unbound (its minimum; a
   coscheduling `scheduleTimeoutSeconds` bounds the wait and the reservation's life).
2. **Place** the whole communication graph with a reservation (the GPUs are held for a TTL).
3. **Bind** each pod through the Binding subresource, with its record: the reservation, node,
   GPU indices and the gang's size (`gputopo.io/*` annotations) arrive on the pod in the same
   write (the API server copies a Binding's annotations onto the pod), so no pod is ever bound
   without saying what was decided, and a gang whose binding stopped half way shows fewer
   recorded pods than its recorded size. (One write a pod, where a patch then a bind took two:
   the binder binds as many pods a second as kube-scheduler.)
4. (A failed bind is retried; one that keeps failing undoes the placement.)
5. **Commit** the reservation: the GPUs stay held for the gang as long as any pod that records
   it lives; when the last one ends (finished or deleted) it is released.

After that the gang is bound for good. Pods beyond the minimum (elastic groups) bind as they
come, and a member that was deleted or evicted is replaced, not punished: its replacement takes
the departed member's slot of the committed reservation (same node, same GPUs), or else the
closest domain around the gang's nodes that holds it (`decisions.near_selectors`).

On every pass, a group with a placement that is recorded but not committed is carried forward:
while its reservation lives, every pod of it is recorded and its nodes exist, the remaining
pods are bound and it is committed; otherwise it is undone: its bound pods are deleted (their
controller recreates them), the records are removed from the unbound ones, the reservation is
released, and the group is placed again from step 1. A Running pod is never deleted: a
placement that cannot finish but has one is adopted instead (its bound pods kept, the rest
placed next to them). A reservation lives at most its TTL without a commit, so no partial
group outlives TTL + one pass.

Every decision is an Event on the pods; a group that cannot be placed gets `PodScheduled=False`
with gputopo's reason and rejected domains; a malformed group input (request, minimum, gang
size, topology key, GPU count) is refused naming the field, and one group's failure never stops
the others (a catch-all per group). Group objects get their status (`scheduler/status.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.request import Constraint, Group, Pattern, PlacementRequest, RequestError
from gputopo.runtime.informer import Informer
from gputopo.runtime.kube import MERGE_PATCH, ConflictError, KubeClient, KubeError, NotFoundError
from gputopo.runtime.placement_client import PlaceAnswer, PlacementCallError, PlacementClient
from scheduler.decisions import (
    Decision,
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
from scheduler.dra import DraError, allocate_recorded
from scheduler.fitness import NodeFitness
from scheduler.groups import (
    GPUS_ANNOTATION,
    GROUP_LABEL,
    NODE_ANNOTATION,
    RECORD_KEYS,
    RESERVATION_ANNOTATION,
    GroupKey,
    GroupSpec,
    assign,
    build_request,
    explain_rejections,
    gang_size,
    group_key,
    missing,
    pod_gpus,
    pod_key,
    record_annotations,
    spec_from_coscheduling,
    spec_from_native,
    spec_from_workload_v1alpha1,
    spec_of_lone_pod,
    stray_label,
    topology_scope,
)
from scheduler.metrics import SchedulerStats
from scheduler.native import (
    COSCHEDULING_PATH,
    GROUP,
    KNOWN_VERSIONS,
    NativeApi,
    native_api,
    resources_of,
)
from scheduler.status import coscheduling_status, native_conditions, pod_counts

__all__ = ["Binder", "BinderConfig", "node_informer", "pod_informer"]

log = logging.getLogger(__name__)

_DONE = frozenset({"Succeeded", "Failed"})
# How often an unresolvable group (a selector matching no node, a malformed input) is tried
# again, as a multiple of `retry_unplaced_s`: a fix is an edit, not a departure.
_UNRESOLVABLE_BACKOFF = 6.0
# How often API discovery is asked again for the native group API (it changes on upgrades).
_DISCOVERY_S = 60.0
# Events closer together than this share one pass.
_COALESCE_S = 0.01
# A group object read this long ago is used again (a gang below its minimum is looked at on
# every pass; minMember edits are seen this much later).
_SPEC_S = 2.0
# Domains of a topology key tried per placement at most (one dry-run Place each).
_MAX_DOMAINS = 64


@dataclass(frozen=True, slots=True)
class BinderConfig:
    """How the binder behaves."""

    scheduler_name: str = "gputopo"
    reservation_ttl_s: float = 30.0
    bind_retries: int = 5
    retry_unplaced_s: float = 5.0  # a group that did not fit is tried again after this
    resync_s: float = 2.0  # a pass runs at least this often (repairs do not wait for events)
    # Grace period for pods deleted by an undo (None: the pod's own). Tests without kubelets
    # use 0: no kubelet would ever confirm the pod stopped.
    undo_grace_s: int | None = None
    # A pause after each step of a gang (tests only: it widens the windows a kill -9 must hit).
    # With a pause the steps run one pod at a time; without, each step's calls run together.
    step_pause_s: float = 0.0
    write_group_status: bool = True
    # Groups worked on at once (their Place calls, binds and Events overlap). A group's work
    # runs beside the passes: a pass starts the groups that need work and does not wait.
    parallel_groups: int = 16


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(pod).get("annotations") or {}


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _uid(pod: Mapping[str, Any]) -> str:
    return str(_meta(pod).get("uid") or pod_key(pod))


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _version(pod: Mapping[str, Any]) -> int:
    try:
        return int(_meta(pod).get("resourceVersion") or 0)
    except ValueError:  # opaque to clients in principle; etcd's revisions in practice
        return 0


def _as_bound(pod: Mapping[str, Any], record: Mapping[str, str]) -> dict[str, Any]:
    """A pod as it is once bound with `record` (the cache catches up later)."""
    meta = {**_meta(pod), "annotations": {**_annotations(pod), **record}}
    return {
        **pod,
        "metadata": meta,
        "spec": {**(pod.get("spec") or {}), "nodeName": record[NODE_ANNOTATION]},
    }


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age_s(pods: Iterable[Mapping[str, Any]]) -> float:
    """Seconds since the oldest pod was created (0 when no pod says)."""
    oldest = None
    for pod in pods:
        text = _meta(pod).get("creationTimestamp")
        if isinstance(text, str):
            with contextlib.suppress(ValueError):
                at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
                oldest = at if oldest is None else min(oldest, at)
    if oldest is None:
        return 0.0
    return max(0.0, (dt.datetime.now(tz=dt.UTC) - oldest).total_seconds())


def pod_informer(
    kube: KubeClient,
    scheduler_name: str,
    on_change: Callable[[dict[str, Any]], None] = lambda pod: None,
) -> Informer[dict[str, Any]]:
    """Every pod that names this scheduler, bound or not (restart-safety reads bound ones too)."""
    query = {"fieldSelector": f"spec.schedulerName={scheduler_name}"}

    def key(pod: dict[str, Any]) -> str:
        return pod_key(pod)

    return Informer(
        name="scheduler-pods",
        list_objects=lambda: kube.list_all("/api/v1/pods", query=query),
        watch=lambda version: kube.watch_json("/api/v1/pods", version, query=query),
        key=key,
        version=lambda pod: str(_meta(pod).get("resourceVersion", "")),
        on_upsert=lambda obj, relisted: on_change(obj),
        on_delete=on_change,
    )


def node_informer(kube: KubeClient) -> Informer[dict[str, Any]]:
    """Every Node, for its name and labels: a node gone between a placement and a bind stops
    the bind, and the labels around a gang say what is near it (no API call per question)."""
    return Informer(
        name="scheduler-nodes",
        list_objects=lambda: kube.list_all("/api/v1/nodes"),
        watch=lambda version: kube.watch_json("/api/v1/nodes", version),
        key=lambda node: str(_meta(node).get("name", "")),
        version=lambda node: str(_meta(node).get("resourceVersion", "")),
    )


_SETTLED = Decision(Status.SUCCESS, Step.KEEP, "bound")
_BACKING_OFF = Decision(Status.UNSCHEDULABLE, Step.WAIT, "backing off")


@dataclass(frozen=True, slots=True)
class _Pass:
    """One group as a pass sees it: its live pods and every pod (finished and deleting too)."""

    key: GroupKey
    live: list[dict[str, Any]]
    every: list[dict[str, Any]]


class Binder:
    """Runs passes over the pods this scheduler owns (see the module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        placement: PlacementClient,
        config: BinderConfig | None = None,
        *,
        stats: SchedulerStats | None = None,
    ) -> None:
        self.kube = kube
        self.placement = placement
        self.config = config or BinderConfig()
        self.stats = stats or SchedulerStats()
        self._wake = asyncio.Event()
        self.pods = pod_informer(kube, self.config.scheduler_name, self._touch)
        # Groups whose pods changed since the last pass: a pass looks only at those (and at
        # every group once per `resync_s`), so a burst of pod events costs what it touches, not
        # a walk over every group per event.
        self._dirty: set[GroupKey] = set()
        self._full_at = 0.0
        self.nodes = node_informer(kube)
        # Nodes kube-scheduler's default filters would allow each pod (cordons, taints, affinity,
        # allocatable less what bound pods request, host ports); a change wakes a pass.
        self.fitness = NodeFitness(kube, self._capacity_moved)
        # Reservations known committed (or adopted after they expired): never undone.
        self._committed: set[str] = set()
        # Reservation -> uids of the pods that record it: it is released once none is live.
        self._holders: dict[str, set[str]] = {}
        self._began: dict[GroupKey, float] = {}
        self._retry_at: dict[GroupKey, float] = {}
        self._said: dict[GroupKey, str] = {}  # last message told to a group's pods
        self._told: dict[GroupKey, set[tuple[str, str]]] = {}  # (reason, pod uid) said once
        self._specs: dict[GroupKey, tuple[GroupSpec, dict[str, Any]]] = {}
        self._spec_at: dict[GroupKey, float] = {}
        self._status: dict[GroupKey, str] = {}  # last group status written
        self._started: dict[GroupKey, str] = {}  # coscheduling scheduleStartTime
        self._native: NativeApi | None = None
        self._native_at = -_DISCOVERY_S
        # The resource version each pod reached by this binder's own writes: a group whose
        # cached pods are older is skipped until the watch catches up, so a decision is never
        # taken twice on a stale copy.
        self._written: dict[str, int] = {}
        # Pods this binder bound (by uid) whose cached copy may still show them unbound: their
        # group waits for the watch, as above (a Binding answers no resource version).
        self._bound: set[str] = set()
        self._inflight: dict[GroupKey, asyncio.Task[None]] = {}
        self._pending: set[GroupKey] = set()
        self._skipped: set[GroupKey] = set()  # in flight when a pass wanted to look at them
        self._limit = asyncio.Semaphore(max(1, self.config.parallel_groups))
        self._uuid_cache: dict[str, dict[int, str]] = {}
        # Idleness (`idle`): `_capacity` counts what may let a waiting group fit (a release,
        # a node change); `_tried` is the count each waiting group was last tried at.
        self._capacity = 0
        self._tried: dict[GroupKey, int] = {}
        self._idle = asyncio.Event()
        # A pass between taking its groups from `_dirty` and starting their work: a group's
        # work that ends meanwhile must not call the binder idle with those groups untouched.
        self._passing = False

    async def idle(self) -> None:
        """Return once the binder has acted on everything it can: no group in flight, every
        pod event it received looked at, and every waiting group tried since GPUs or nodes
        last changed. For callers that change the cluster and must see the outcome (a
        simulation driving the real binder), instead of a guess at how long that takes. The
        binder must have received the caller's change first (wait for its pod cache)."""
        await self._idle.wait()

    def _capacity_moved(self) -> None:
        self._capacity += 1
        self._idle.clear()
        self._wake.set()

    def _check_idle(self) -> None:
        if (
            not self._passing
            and not self._inflight
            and not self._dirty
            and not self._skipped
            and all(self._tried.get(k) == self._capacity for k in self._pending)
        ):
            self._idle.set()
        else:
            self._idle.clear()

    async def run(self) -> None:
        """Keep the pod cache and run passes until cancelled."""
        informer = asyncio.create_task(self.pods.run(), name="scheduler-pods")
        nodes = asyncio.create_task(self.nodes.run(), name="scheduler-nodes")
        fitness = asyncio.create_task(self.fitness.run(), name="scheduler-fitness")
        try:
            await self.pods.synced.wait()
            await self.nodes.synced.wait()
            await self.fitness.synced()
            while True:
                await asyncio.sleep(_COALESCE_S)  # one pass for a burst of events
                self._wake.clear()
                try:
                    await self.run_pass()
                except (KubeError, PlacementCallError) as err:
                    log.warning("pass failed: %s", err)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.config.resync_s)
        finally:
            for task in (informer, nodes, fitness, *self._inflight.values()):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # --- one pass ------------------------------------------------------------------------------

    def _touch(self, pod: Mapping[str, Any]) -> None:
        self._dirty.add(group_key(pod))
        self._idle.clear()
        self._wake.set()

    def _groups(self) -> tuple[dict[GroupKey, _Pass], set[GroupKey]]:
        """Pods by group, and the groups whose cached copies lag this binder's writes."""
        groups: dict[GroupKey, _Pass] = {}
        stale: set[GroupKey] = set()
        for pod in self.pods.cache.values():
            key = group_key(pod)
            if _version(pod) < self._written.get(pod_key(pod), 0):
                stale.add(key)
            if _uid(pod) in self._bound:
                if _node(pod):
                    self._bound.discard(_uid(pod))
                else:
                    stale.add(key)
            group = groups.setdefault(key, _Pass(key, [], []))
            group.every.append(pod)
            if (pod.get("status") or {}).get("phase") in _DONE:
                continue
            if _meta(pod).get("deletionTimestamp"):
                continue
            group.live.append(pod)
        self._bound &= {_uid(p) for p in self.pods.cache.values()}
        return groups, stale

    def _wrote(self, pod: Mapping[str, Any]) -> None:
        self._written[pod_key(pod)] = _version(pod)

    async def run_pass(self) -> None:
        """Start work on every group that needs some (carry a recorded placement forward, grow
        a bound gang, place a gang that reached its minimum), write the status of the settled
        ones, release what no pod holds any more. One group's failure is that group's alone."""
        self._passing = True
        try:
            await self._pass()
        finally:
            self._passing = False
        self._check_idle()

    async def _pass(self) -> None:
        groups, stale = self._groups()
        now = time.monotonic()
        full = now >= self._full_at
        if full:
            self._full_at = now + self.config.resync_s
        look = set(groups) if full else self._dirty & set(groups)
        self._dirty -= look
        self._dirty &= set(groups)  # a group whose pods are all gone has nothing to do
        for key in sorted(look):
            group = groups[key]
            if key in self._inflight:
                self._skipped.add(key)
                continue
            # Stale at the snapshot, or since: work on this group may have ended during this
            # pass (the awaits above), leaving its writes newer than the snapshot.
            if key in stale or self._lagging(group):
                self._dirty.add(key)  # looked at again once the watch caught up
                continue
            if self._settled(group):
                self._pending.discard(key)
                with contextlib.suppress(KubeError):
                    await self._write_status(group, _SETTLED)
                continue
            self._idle.clear()
            self._inflight[key] = asyncio.create_task(self._work(group), name=f"group {key}")
        self._pending &= set(groups)
        self.stats.groups_pending = len(self._pending)
        await self._release_finished()
        tables = (self._began, self._specs, self._spec_at, self._status, self._started, self._told)
        for table in (*tables, self._retry_at, self._tried):
            for key in [k for k in table if k not in groups and k not in self._inflight]:
                table.pop(key, None)

    async def drain(self) -> None:
        """Wait for the work the passes started (tests, and a clean stop)."""
        while self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    def _lagging(self, group: _Pass) -> bool:
        """Whether this binder wrote any of the group's pods after the copies in `group`."""
        for pod in group.every:
            if _version(pod) < self._written.get(pod_key(pod), 0):
                return True
            if _uid(pod) in self._bound and not _node(pod):
                return True
        return False

    def _settled(self, group: _Pass) -> bool:
        """Every live pod bound and every placement it records committed: nothing to do."""
        for pod in group.live:
            if not _node(pod):
                return False
            rid = _annotations(pod).get(RESERVATION_ANNOTATION)
            if rid and rid not in self._committed:
                return False
        return True

    async def _work(self, group: _Pass) -> None:
        try:
            async with self._limit:
                capacity = self._capacity
                decision = await self._guarded(group)
                if decision.status is Status.SUCCESS:
                    self._pending.discard(group.key)
                else:
                    self._pending.add(group.key)
                if decision is not _BACKING_OFF:
                    self._tried[group.key] = capacity
                with contextlib.suppress(KubeError):
                    await self._write_status(group, decision)
        finally:
            self._inflight.pop(group.key, None)
            if group.key in self._skipped:  # a pass passed it by: look again now, not at resync
                self._skipped.discard(group.key)
                self._dirty.add(group.key)
                self._wake.set()
            self._check_idle()

    async def _guarded(self, group: _Pass) -> Decision:
        """`_one_group`, with every failure kept to this group: said, counted, retried."""
        key = group.key
        try:
            return await self._one_group(group)
        except (KubeError, PlacementCallError) as err:  # transient: the next pass retries
            log.warning("%s: %s", key, err)
            return Decision(Status.ERROR, Step.ASK, str(err))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug or an input no check foresaw: this group only
            log.exception("%s: failed", key)
            self.stats.decided("error")
            decision = Decision(Status.ERROR, Step.ASK, f"{type(err).__name__}: {err}")
            self._retry_at[key] = time.monotonic() + self.config.retry_unplaced_s
            with contextlib.suppress(Exception):
                await self._reject(key, group.live, decision, "SchedulerError")
            return decision

    async def _one_group(self, group: _Pass) -> Decision:
        """Every step for one group (see the module docstring); its decision."""
        key, pods = group.key, group.live
        if not pods:
            return Decision(Status.SUCCESS, Step.KEEP, "no live pod")
        try:
            return await self._decide_and_act(group)
        except RequestError as err:
            decision = Decision(Status.UNRESOLVABLE, Step.WAIT, f"{err.field}: {err.reason}")
            self.stats.decided("invalid")
            await self._reject(key, pods, decision, "InvalidRequest")
            return decision

    async def _decide_and_act(self, group: _Pass) -> Decision:
        key, pods = group.key, group.live
        units: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            rid = _annotations(pod).get(RESERVATION_ANNOTATION)
            if rid:
                units.setdefault(rid, []).append(pod)
                self._holders.setdefault(rid, set()).add(_uid(pod))
        kept: list[str] = []
        for rid in sorted(units):
            decision = await self._carry(key, rid, units[rid])
            if decision.step is not Step.KEEP:
                return decision  # a placement in progress: the rest waits for the next pass
            kept.append(rid)
        placed = bool(kept) or any(_node(p) for p in pods)
        waiting = [
            p for p in pods if not _node(p) and not _annotations(p).get(RESERVATION_ANNOTATION)
        ]
        if not waiting:
            return Decision(Status.SUCCESS, Step.KEEP, "bound")
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return _BACKING_OFF
        spec = await self._spec(key, pods)
        if spec is None:
            return Decision(Status.WAIT, Step.WAIT, "its group object is not there (yet)")
        request = build_request(spec, waiting)
        if (stray := stray_label(request, waiting)) is not None:
            raise RequestError(GROUP_LABEL, stray)
        lacking = {} if placed else missing(request, waiting)
        view = GroupView(
            placed=placed,
            waiting=len(waiting),
            lacking=sum(lacking.values()),
            waited_s=_age_s(waiting),
            timeout_s=spec.timeout_s,
        )
        decision = decide_group(view)
        if decision.step is Step.WAIT:
            need = ", ".join(f"{g}: {n} more" for g, n in sorted(lacking.items()))
            await self._say(
                key, waiting, "Waiting", f"waiting for the gang's minimum ({need} when last told)"
            )
        elif decision.step is Step.TIMEOUT:
            self.stats.decided("timeout")
            await self._reject(key, waiting, decision, "Unschedulable")
        elif decision.step is Step.PLACE:
            # Node fitness (cordons, taints, affinity, resources, host ports) before Place.
            verdict = self.fitness.restrict(request, waiting)
            if verdict.request is None:
                self.stats.decided("unschedulable")
                unfit = Decision(Status.UNSCHEDULABLE, Step.WAIT, verdict.message)
                await self._reject(key, waiting, unfit, "Unschedulable")
                return unfit
            self._began.setdefault(key, time.monotonic())
            return await self._place_gang(key, spec, verdict.request, waiting)
        elif decision.step is Step.GROW:
            return await self._grow(group, spec, request, waiting, kept)
        return decision

    async def _release_finished(self) -> None:
        """Release a committed reservation once no live pod records it (the gang finished or
        was deleted), so its GPUs go back to the pool. Live is judged now, from the pods this
        binder recorded (by uid) and the cache, never from the copy a pass began with: that
        copy predates the records of the gangs the pass bound."""
        live: set[str] = set()
        recorded: set[str] = set()
        for pod in self.pods.cache.values():
            if (pod.get("status") or {}).get("phase") in _DONE:
                continue
            live.add(_uid(pod))  # a pod being deleted still runs on its GPUs until it is gone
            if rid := _annotations(pod).get(RESERVATION_ANNOTATION):
                recorded.add(rid)
        for rid in sorted(self._committed):
            if rid in recorded or self._holders.get(rid, set()) & live:
                continue
            try:
                await self.placement.release(rid)
            except PlacementCallError as err:
                if err.status != "NOT_FOUND":
                    log.warning("release %s: %s", rid, err)
                    continue
            self._committed.discard(rid)
            self._holders.pop(rid, None)
            self._capacity_moved()
            log.info("released %s: no live pod records it", rid)

    # --- a recorded placement ------------------------------------------------------------------

    async def _hold(self, rid: str) -> Hold:
        if rid in self._committed:
            return Hold.COMMITTED
        try:
            answer = await self.placement.explain_reservation(rid)
        except PlacementCallError as err:
            if err.status in ("NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT"):
                return Hold.GONE
            log.warning("explain %s: %s", rid, err)
            return Hold.UNKNOWN
        if answer.reservation is not None and answer.reservation.committed:
            self._committed.add(rid)
            return Hold.COMMITTED
        return Hold.HELD

    async def _carry(self, key: GroupKey, rid: str, members: list[dict[str, Any]]) -> Decision:
        """Keep, commit, bind, adopt or undo one recorded placement (`decide_unit`)."""
        size = max(gang_size(p) for p in members)
        unbound = [p for p in members if not _node(p)]
        hold = await self._hold(rid)
        nodes_ok = True
        if hold is Hold.HELD and unbound:
            nodes_ok = await self._nodes_exist(unbound)
        unit = Unit(
            size=size,
            recorded=len(members),
            bound=len(members) - len(unbound),
            running=sum(1 for p in members if _running(p)),
            hold=hold,
            nodes_exist=nodes_ok,
        )
        decision = decide_unit(unit)
        if decision.step not in (Step.KEEP, Step.ASK):
            log.info(
                "%s: carrying forward a recorded gang (%d of %d pods bound): %s",
                key,
                unit.bound,
                size,
                decision.why,
            )
        if decision.step is Step.COMMIT:
            await self._commit(key, rid, members)
        elif decision.step is Step.BIND:
            await self._bind_unit(key, rid, members)
        elif decision.step is Step.UNDO:
            await self._undo(key, members, rid, why=decision.why)
        elif decision.step is Step.ADOPT:
            await self._adopt(key, members, rid, hold, why=decision.why)
        return decision

    async def _bind_unit(self, key: GroupKey, rid: str, recorded: list[dict[str, Any]]) -> Decision:
        """Bind the recorded pods not bound yet, then commit (or undo/adopt on a failed bind)."""
        unbound = [p for p in recorded if not _node(p)]
        done = await self._each(unbound, self._bind)
        failed = [pod_key(p) for p, ok in zip(unbound, done, strict=True) if not ok]
        if failed:
            why = f"pod(s) {', '.join(failed)} could not be bound (deleted or refused)"
            if any(_running(p) for p in recorded):
                await self._adopt(key, recorded, rid, Hold.HELD, why=why)
            else:
                await self._undo(key, recorded, rid, why=why)
            return Decision(Status.UNSCHEDULABLE, Step.UNDO, why)
        await self._pause()
        await self._commit(key, rid, recorded, newly=unbound)
        return Decision(Status.SUCCESS, Step.KEEP, "bound")

    async def _each(
        self, items: Sequence[dict[str, Any]], call: Callable[[dict[str, Any]], Awaitable[Any]]
    ) -> list[Any]:
        """`call` on every item: together (the client's worker pool bounds the concurrency),
        or one at a time with the tests' pause between them."""
        if self.config.step_pause_s <= 0:
            return list(await asyncio.gather(*(call(item) for item in items)))
        out = []
        for item in items:
            await self._pause()
            out.append(await call(item))
        return out

    async def _pause(self) -> None:
        if self.config.step_pause_s > 0:
            await asyncio.sleep(self.config.step_pause_s)

    async def _nodes_exist(self, pods: Sequence[Mapping[str, Any]]) -> bool:
        """Whether every node the pods record exists."""
        for node in sorted({_annotations(p).get(NODE_ANNOTATION, "") for p in pods}):
            if not await self._node_exists(node):
                return False
        return True

    async def _node_exists(self, node: str) -> bool:
        """The Node cache says; an API call when it has not heard of the node (one created a
        moment ago is not taken for gone)."""
        if node in self.nodes.cache:
            return True
        try:
            await self.kube.get_node(node)
        except NotFoundError:
            return False
        return True

    async def _bind(self, pod: Mapping[str, Any], record: Mapping[str, str] | None = None) -> bool:
        """Bind a pod where its record says (`record`, written by the same call, or the one
        it carries); True when it is bound there."""
        meta = _meta(pod)
        node = (record or _annotations(pod))[NODE_ANNOTATION]
        if not await self._node_exists(node):
            log.warning("%s: node %s is gone; not binding there", pod_key(pod), node)
            return False
        try:  # DRA: the pod's GPU claims are allocated to the chosen GPUs before the Binding
            await allocate_recorded(self.kube, _as_bound(pod, record) if record else pod)
        except DraError as err:
            log.warning("%s: cannot allocate its claims: %s", pod_key(pod), err)
            await self._event(pod, "FailedBinding", f"DRA: {err}", "Warning")
            return False
        for attempt in range(self.config.bind_retries):
            self.stats.bind_attempts += 1
            try:
                await self.kube.bind_pod(
                    meta["namespace"],
                    meta["name"],
                    node,
                    uid=str(meta.get("uid", "")),
                    annotations=record,
                )
                self._bound.add(_uid(pod))
                return True
            except ConflictError:
                # Already bound (a previous life of this binder got that far): fine if there.
                try:
                    now = await self.kube.get_pod(meta["namespace"], meta["name"])
                except NotFoundError:
                    return False
                return _node(now) == node
            except NotFoundError:
                return False
            except KubeError as err:
                log.warning("bind %s to %s: %s (attempt %d)", pod_key(pod), node, err, attempt + 1)
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        return False

    async def _commit(
        self,
        key: GroupKey,
        rid: str,
        recorded: list[dict[str, Any]],
        *,
        newly: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        try:
            await self.placement.commit(rid, owner=str(key))
        except PlacementCallError as err:
            if err.status != "NOT_FOUND":
                raise
            # Expired after every pod was bound: the pods now count as bound pods do.
            log.info("%s: reservation %s gone at commit; the bound pods hold the GPUs", key, rid)
        self._committed.add(rid)
        self._holders.setdefault(rid, set()).update(_uid(p) for p in recorded)
        began = self._began.pop(key, None)
        if began is not None:
            self.stats.bound_after(time.monotonic() - began)
            self.stats.decided("bound")
            self._said.pop(key, None)
        told = recorded if newly is None else newly
        if began is not None or newly is not None:

            async def scheduled(pod: Mapping[str, Any]) -> None:
                ann = _annotations(pod)
                await self._event(
                    pod,
                    "Scheduled",
                    f"gang {key} bound: {ann.get(NODE_ANNOTATION)} GPUs "
                    f"{ann.get(GPUS_ANNOTATION)} (reservation {rid})",
                )

            await asyncio.gather(*(scheduled(p) for p in told))
            log.info("%s: %d pod(s) bound, reservation %s committed", key, len(told), rid)

    async def _undo(
        self, key: GroupKey, recorded: list[dict[str, Any]], rid: str, *, why: str
    ) -> None:
        """Delete the bound pods (their controller recreates them), strip the records from the
        rest, release the reservation: the group starts again from step 1. Only for a placement
        that never fully bound, and never a Running pod (`decide_unit` adopts those)."""
        log.warning("%s: undoing: %s", key, why)
        for pod in recorded:
            meta = _meta(pod)
            await self._event(pod, "Undone", f"gang {key} undone and requeued: {why}", "Warning")
            if _node(pod) and not _running(pod):
                await self.kube.delete_pod(
                    meta["namespace"],
                    meta["name"],
                    uid=str(meta.get("uid", "")),
                    grace_s=self.config.undo_grace_s,
                )
            elif not _node(pod):
                await self._strip(pod)
        for one in {_annotations(p).get(RESERVATION_ANNOTATION, "") for p in recorded}:
            with contextlib.suppress(PlacementCallError):
                await self.placement.release(one)
            self._holders.pop(one, None)
        self.stats.repairs += 1
        self.stats.decided("undone")
        self._began.pop(key, None)

    async def _adopt(
        self, key: GroupKey, recorded: list[dict[str, Any]], rid: str, hold: Hold, *, why: str
    ) -> None:
        """Keep a placement that cannot finish but runs: its bound pods stay, the records leave
        the unbound ones (they are placed next to the gang, in the reservation's free slots
        first), and a live reservation is committed so the running pods keep their GPUs."""
        log.warning("%s: adopting: %s", key, why)
        if hold is Hold.HELD:
            with contextlib.suppress(PlacementCallError):
                await self.placement.commit(rid, owner=str(key))
        self._committed.add(rid)
        for pod in recorded:
            await self._event(pod, "Adopted", f"gang {key} kept: {why}", "Warning")
            if not _node(pod):
                await self._strip(pod)
        self.stats.decided("adopted")

    async def _strip(self, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        with contextlib.suppress(NotFoundError):
            self._wrote(
                await self.kube.patch_pod_annotations(
                    meta["namespace"], meta["name"], dict.fromkeys(RECORD_KEYS)
                )
            )

    # --- a new placement -----------------------------------------------------------------------

    async def _native_api(self) -> NativeApi:
        """Which versions of `scheduling.k8s.io` serve `podgroups` and `workloads`, by API
        discovery (asked again every minute: a control-plane upgrade changes it)."""
        if self._native is not None and time.monotonic() - self._native_at < _DISCOVERY_S:
            return self._native
        served: dict[str, frozenset[str]] = {}
        try:
            doc = await self.kube.request("GET", f"/apis/{GROUP}")
        except NotFoundError:
            doc = {}
        listed = {str(v.get("version")) for v in doc.get("versions") or [] if isinstance(v, dict)}
        for version in KNOWN_VERSIONS:
            if version in listed:
                with contextlib.suppress(NotFoundError):
                    served[version] = resources_of(
                        await self.kube.request("GET", f"/apis/{GROUP}/{version}")
                    )
        self._native = native_api(served)
        self._native_at = time.monotonic()
        return self._native

    async def _spec(self, key: GroupKey, pods: list[dict[str, Any]]) -> GroupSpec | None:
        """The group's spec from its object (None: the object is not there, said once)."""
        if key.kind == "pod":
            return spec_of_lone_pod(pods[0])
        known = self._specs.get(key)
        if known is not None and time.monotonic() - self._spec_at.get(key, 0.0) < _SPEC_S:
            return known[0]
        if key.kind == "podgroup":
            path: str | None = COSCHEDULING_PATH.format(
                ns=quote(key.namespace), name=quote(key.name)
            )
            what = "PodGroup (scheduling.x-k8s.io/v1alpha1)"
        else:
            api = await self._native_api()
            if key.kind == "workload":
                path = api.podgroup_path(key.namespace, key.name)
                what = f"PodGroup ({GROUP}/{api.podgroup_version})"
            else:
                path = api.workload_path(key.namespace, key.name.split("/")[0])
                what = f"Workload ({GROUP}/{api.workload_version})"
            if path is None:
                resource = "podgroups" if key.kind == "workload" else "workloads"
                await self._say(
                    key,
                    pods,
                    "Waiting",
                    f"the API server serves no {GROUP} {resource} (Kubernetes 1.35+ with the"
                    " GenericWorkload gate); the pods wait",
                )
                return None
        assert path is not None
        try:
            obj = await self.kube.request("GET", path)
        except NotFoundError:
            await self._say(key, pods, "Waiting", f"{what} {key.name} does not exist (yet)")
            return None
        if key.kind == "podgroup":
            spec = spec_from_coscheduling(obj)
        elif key.kind == "workload":
            spec = spec_from_native(obj)
        else:
            spec = spec_from_workload_v1alpha1(obj, key)
        self._specs[key] = (spec, obj)
        self._spec_at[key] = time.monotonic()
        return spec

    def _ttl(self, spec: GroupSpec) -> float:
        """A partial placement never outlives the group's scheduleTimeoutSeconds."""
        ttl = self.config.reservation_ttl_s
        return ttl if spec.timeout_s is None else min(ttl, spec.timeout_s)

    async def _place_gang(
        self, key: GroupKey, spec: GroupSpec, request: PlacementRequest, pods: list[dict[str, Any]]
    ) -> Decision:
        """Steps 2 to 5 for a gang that reached its minimum."""
        selectors: list[dict[str, str]] = [{}]
        if spec.topology_key and topology_scope(spec.topology_key) is None:
            selectors = await self._domain_selectors(key, spec.topology_key, request, pods)
            if not selectors:
                return await self._refuse_unplaced(
                    key,
                    pods,
                    Status.UNRESOLVABLE,
                    f"no node carries the topology key {spec.topology_key!r}"
                    " (spec.schedulingConstraints.topology[0].key)",
                )
        answer = await self._place_first(key, request, pods, selectors, ttl=self._ttl(spec))
        if answer is None or answer.reservation is None:
            return Decision(Status.UNSCHEDULABLE, Step.WAIT, "not placed")
        rid = answer.reservation.id
        where = assign(request, answer.result, pods)
        chosen = [p for p in pods if pod_key(p) in where]
        uuids = await self._uuids(key, [w.node for w in where.values()])
        records = {
            pod_key(p): record_annotations(
                rid, where[pod_key(p)], len(chosen), uuids.get(where[pod_key(p)].node)
            )
            for p in chosen
        }
        self._holders.setdefault(rid, set()).update(_uid(p) for p in chosen)
        log.info("%s: reserved %s on %s", key, rid, sorted({w.node for w in where.values()}))
        await self._pause()
        done = await self._each(chosen, lambda pod: self._bind(pod, records[pod_key(pod)]))
        bound = [
            _as_bound(p, records[pod_key(p)]) for p, ok in zip(chosen, done, strict=True) if ok
        ]
        if len(bound) < len(chosen):
            failed = [pod_key(p) for p, ok in zip(chosen, done, strict=True) if not ok]
            why = f"pod(s) {', '.join(failed)} could not be bound (deleted or refused)"
            await self._undo(key, bound, rid, why=why)
            return Decision(Status.UNSCHEDULABLE, Step.UNDO, why)
        await self._pause()
        await self._commit(key, rid, bound, newly=bound)
        return Decision(Status.SUCCESS, Step.KEEP, "bound")

    async def _uuids(self, key: GroupKey, nodes: Iterable[str]) -> dict[str, dict[int, str]]:
        """GPU UUIDs of nodes, asked once a node (a GPU swap restarts the node's exporter and
        rarely the binder; the UUIDs are for people, the indices are what binds)."""
        wanted = sorted(set(nodes) - set(self._uuid_cache))
        if wanted:
            try:
                self._uuid_cache.update(await self.placement.gpu_uuids(wanted))
            except PlacementCallError as err:
                log.warning("%s: no GPU UUIDs (%s); recording indices only", key, err)
        return {n: self._uuid_cache[n] for n in nodes if n in self._uuid_cache}

    async def _domain_selectors(
        self,
        key: GroupKey,
        label: str,
        request: PlacementRequest,
        pods: list[dict[str, Any]],
    ) -> list[dict[str, str]]:
        """The domains of a topology key (the values of that node label), best first: a dry
        run in each, ordered by predicted communication time, then by name; the ones that
        cannot hold the gang last (their rejections explain a miss)."""
        page = await self.kube.request("GET", "/api/v1/nodes", query={"labelSelector": label})
        values = sorted(
            {
                str(((n.get("metadata") or {}).get("labels") or {}).get(label, ""))
                for n in page.get("items") or []
            }
            - {""}
        )[:_MAX_DOMAINS]
        scored: list[tuple[int, float, str]] = []
        for value in values:
            trial = replace(request, node_selector={**request.node_selector, label: value})
            try:
                answer = await self.placement.place(trial, dry_run=True)
            except PlacementCallError:
                scored.append((1, 0.0, value))
                continue
            seconds = (
                answer.result.prediction.communication_seconds if answer.result.prediction else 0.0
            )
            scored.append((0 if answer.result.placed else 1, seconds, value))
        return [{label: value} for _, _, value in sorted(scored)]

    async def _place_first(
        self,
        key: GroupKey,
        request: PlacementRequest,
        pods: list[dict[str, Any]],
        selectors: Sequence[Mapping[str, str]],
        *,
        ttl: float,
    ) -> PlaceAnswer | None:
        """Place with a reservation under each node selector in turn; the first placed answer,
        or None after saying why the last one was not placed (typed by its rejection codes)."""
        answer: PlaceAnswer | None = None
        for selector in selectors:
            trial = replace(request, node_selector={**request.node_selector, **selector})
            try:
                answer = await self.placement.place(trial, ttl_s=ttl)
            except PlacementCallError as err:
                status = status_of_call(err.status)
                if status is Status.UNRESOLVABLE:
                    self.stats.decided("invalid")
                    await self._reject(
                        key,
                        pods,
                        Decision(status, Step.WAIT, f"gputopo.io/request: {err.message}"),
                        "InvalidRequest",
                    )
                else:
                    self.stats.decided("error")
                    log.warning("%s: place failed: %s", key, err)
                    self._retry_at[key] = time.monotonic() + self.config.retry_unplaced_s
                return None
            if answer.result.placed and answer.reservation is not None:
                return answer
        assert answer is not None  # selectors is never empty
        status = status_of_result(answer.result)
        log.info("%s: not placed (%s): %s", key, status, answer.result.reason)
        await self._refuse_unplaced(key, pods, status, explain_rejections(answer.result))
        return None

    async def _refuse_unplaced(
        self, key: GroupKey, pods: list[dict[str, Any]], status: Status, message: str
    ) -> Decision:
        self.stats.decided("unschedulable" if status is not Status.ERROR else "error")
        decision = Decision(status, Step.WAIT, message)
        await self._reject(key, pods, decision, "Unschedulable")
        return decision

    # --- growing a bound gang ------------------------------------------------------------------

    async def _grow(
        self,
        group: _Pass,
        spec: GroupSpec,
        request: PlacementRequest,
        waiting: list[dict[str, Any]],
        kept: list[str],
    ) -> Decision:
        """Bind pods beyond a bound gang (elastic members, replacements) next to it: into a
        free slot of its committed reservation (a departed member's node and GPUs), else the
        closest domain around the gang's nodes that holds the pod."""
        key = group.key
        slots = await self._free_slots(group, kept)
        labels = await self._gang_labels(group.live)
        required: dict[str, str] = {}
        if spec.topology_key and labels:
            value = labels[0].get(spec.topology_key)
            if value is not None:
                required = {spec.topology_key: value}
        selectors = near_selectors(labels, required=required)
        last = Decision(Status.SUCCESS, Step.KEEP, "bound")
        for pod in sorted(waiting, key=pod_key):
            gpus = pod_gpus(pod)
            name = self._request_group(request, pod)
            slot = next((s for s in slots if s[1].group == name and len(s[1].gpus) == gpus), None)
            if slot is not None and await self._node_exists(slot[1].node):
                slots.remove(slot)
                rid, where, size = slot
                uuids = await self._uuids(key, [where.node])
                record = record_annotations(rid, where, size, uuids.get(where.node))
                self._holders.setdefault(rid, set()).add(_uid(pod))
                if await self._bind(pod, record):
                    now = _as_bound(pod, record)
                    self.stats.decided("grown")
                    await self._event(
                        now,
                        "Scheduled",
                        f"gang {key}: took a departed member's place: {where.node} GPUs "
                        f"{','.join(map(str, where.gpus))} (reservation {rid})",
                    )
                continue
            one = self._one_pod_request(request, name, gpus, spec)
            verdict = self.fitness.restrict(one, [pod])  # node fitness, as for a whole gang
            if verdict.request is None:
                last = Decision(Status.UNSCHEDULABLE, Step.GROW, verdict.message)
                continue
            one = verdict.request
            answer = await self._place_first(key, one, [pod], selectors, ttl=self._ttl(spec))
            if answer is None or answer.reservation is None:
                last = Decision(
                    Status.UNSCHEDULABLE, Step.GROW, "a pod beyond the gang did not fit"
                )
                continue
            rid = answer.reservation.id
            where = answer.result.pods[0]
            uuids = await self._uuids(key, [where.node])
            record = record_annotations(rid, where, 1, uuids.get(where.node))
            self._holders.setdefault(rid, set()).add(_uid(pod))
            if await self._bind(pod, record):
                now = _as_bound(pod, record)
                await self._commit(key, rid, [now], newly=[now])
                self.stats.decided("grown")
            # a failed bind is carried forward (and undone) by the next pass
        return last

    @staticmethod
    def _request_group(request: PlacementRequest, pod: Mapping[str, Any]) -> str:
        label = (_meta(pod).get("labels") or {}).get(GROUP_LABEL)
        return str(label) if label is not None else request.groups[0].name

    @staticmethod
    def _one_pod_request(
        request: PlacementRequest, name: str, gpus: int, spec: GroupSpec
    ) -> PlacementRequest:
        """One pod of request group `name`, asking what the pod asks."""
        try:
            base = request.group(name)
        except KeyError:
            base = request.groups[0]
        need = gpus or base.gpus_per_pod
        group = Group(
            name=base.name,
            pods=1,
            gpus_per_pod=need,
            pattern=base.pattern if need > 1 else Pattern.NONE,
            message_bytes=base.message_bytes,
            scope=Constraint(),
            node_selector=base.node_selector,
        )
        return PlacementRequest(
            groups=(group,),
            job=f"{spec.key.name}-grow",
            namespace=spec.key.namespace,
            node_selector=request.node_selector,
            priority=request.priority,
            policy=request.policy,
        )

    async def _free_slots(
        self, group: _Pass, kept: list[str]
    ) -> list[tuple[str, PodPlacement, int]]:
        """Slots of the group's committed reservations that no pod records any more (a pod
        being deleted still holds its slot: it runs until it is gone)."""
        taken = {
            (
                _annotations(p).get(RESERVATION_ANNOTATION),
                _annotations(p).get(NODE_ANNOTATION),
                _annotations(p).get(GPUS_ANNOTATION),
            )
            for p in group.every
            if (p.get("status") or {}).get("phase") not in _DONE
        }
        out: list[tuple[str, PodPlacement, int]] = []
        for rid in kept:
            try:
                answer = await self.placement.explain_reservation(rid)
            except PlacementCallError:
                continue
            result: PlacementResult = answer.result
            for where in result.pods:
                gpus = ",".join(str(g) for g in where.gpus)
                if (rid, where.node, gpus) not in taken:
                    out.append((rid, where, len(result.pods)))
        return out

    async def _gang_labels(self, pods: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        """The labels of the node of each bound pod (one entry per pod)."""
        out = []
        for pod in pods:
            node = self.nodes.cache.get(_node(pod))
            if node is not None:
                out.append(dict(_meta(node).get("labels") or {}))
        return out

    # --- group status --------------------------------------------------------------------------

    async def _write_status(self, group: _Pass, decision: Decision) -> None:
        """The group object's status after a pass (written only when it changed)."""
        key = group.key
        known = self._specs.get(key)
        if not self.config.write_group_status or known is None:
            return
        spec, obj = known
        meta = _meta(obj)
        if key.kind == "podgroup":
            start = self._started.setdefault(
                key, str((obj.get("status") or {}).get("scheduleStartTime") or _now())
            )
            body: dict[str, Any] = {
                "status": coscheduling_status(
                    spec.minimum, pod_counts(group.every), start_time=start
                )
            }
            path = COSCHEDULING_PATH.format(ns=quote(key.namespace), name=quote(key.name))
        elif key.kind == "workload":
            existing = (obj.get("status") or {}).get("conditions") or []
            conditions = native_conditions(
                existing,
                decision.status,
                decision.why,
                now=_now(),
                generation=int(meta.get("generation") or 0),
            )
            if conditions is None:
                return
            api = await self._native_api()
            found = api.podgroup_path(key.namespace, key.name)
            if found is None:
                return
            path = found
            body = {"status": {"conditions": conditions}}
            obj.setdefault("status", {})["conditions"] = conditions
        else:
            return
        text = json.dumps(body, sort_keys=True)
        if self._status.get(key) == text:
            return
        try:
            await self.kube.request("PATCH", path + "/status", body=body, content_type=MERGE_PATCH)
        except NotFoundError:
            return
        self._status[key] = text

    # --- saying why ----------------------------------------------------------------------------

    async def _reject(
        self, key: GroupKey, pods: list[dict[str, Any]], decision: Decision, reason: str
    ) -> None:
        """An Event and `PodScheduled=False` on every pod; the group is tried again later
        (rarely when the status says waiting cannot help)."""
        backoff = self.config.retry_unplaced_s
        if decision.status is Status.UNRESOLVABLE:
            backoff *= _UNRESOLVABLE_BACKOFF
        self._retry_at[key] = time.monotonic() + backoff
        said = f"{reason}|{decision.status}|{decision.why}"
        if self._said.get(key) == said:
            return
        self._said[key] = said
        text = f"gang {key} not bound ({decision.status}): {decision.why}"
        for pod in pods:
            meta = _meta(pod)
            await self._event(pod, reason, text, "Warning")
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable" if reason != "SchedulerError" else "SchedulerError",
                "message": text[:2048],
                "lastTransitionTime": _now(),
            }
            with contextlib.suppress(NotFoundError):
                await self.kube.set_pod_condition(meta["namespace"], meta["name"], condition)

    async def _say(
        self, key: GroupKey, pods: list[dict[str, Any]], reason: str, message: str
    ) -> None:
        """A Normal Event on each pod, once a pod per reason: a gang of 256 pods arriving one
        by one was told 'N more' on every arrival, 32,000 Events that slowed its own binding
        down to 7 pods a second."""
        told = self._told.setdefault(key, set())
        fresh = [p for p in pods if (reason, _uid(p)) not in told]
        told.update((reason, _uid(p)) for p in fresh)
        self._said[key] = reason + message
        await asyncio.gather(*(self._event(p, reason, f"gang {key}: {message}") for p in fresh))

    async def _event(
        self, pod: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(pod)}
        try:
            await self.kube.create_event(
                involved, reason=reason, message=message, type_=type_, now=_now()
            )
        except KubeError as err:  # an Event is advice: never let it stop a bind
            log.debug("event on %s: %s", pod_key(pod), err)
