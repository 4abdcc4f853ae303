"""The gang binder: bind every pod of a group where gputopo placed it, or none.

Pod by pod binding (kube-scheduler, with or without gputopo's extender) was seen leaving 3 of 4
pods of a job bound while the 4th waited forever, holding 24 GPUs no one could use. Here a group
goes through these steps, and each step leaves a record in the cluster, so a binder killed at
any point finishes or undoes the group when it (or its successor) starts:

1. **Wait** until every pod the group's request needs exists and is unbound (its minimum).
2. **Place** the whole communication graph with a reservation (the GPUs are held for a TTL).
3. **Record** on every pod the reservation, node and GPU indices (`gputopo.io/*` annotations)
   before binding any: from here on, the cluster says what was decided.
4. **Bind** each pod through the Binding subresource (a failed bind is retried).
5. **Commit** the reservation: the GPUs stay held for the pods that now run on them, until no
   live pod records it any more (finished or deleted): then it is released.

On every pass, a group with recorded pods is carried forward (`_finish`): if its reservation is
still alive and every recorded node still exists, the remaining pods are bound and the
reservation committed; otherwise the group is undone: its bound pods are deleted (their
controller recreates them), the records are removed from the unbound ones, the reservation is
released, and the group is placed again from step 1. A reservation lives at most its TTL without
a commit, so no partial group outlives TTL + one pass (the repair time).

Every decision is an Event on the pods; a group that cannot be placed gets `PodScheduled=False`
with gputopo's reason and rejected domains, and a bad `gputopo.io/request` is named by field.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gputopo.request import PlacementRequest, RequestError
from gputopo.runtime.informer import Informer
from gputopo.runtime.kube import ConflictError, KubeClient, KubeError, NotFoundError
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from scheduler.fitness import NodeFitness
from scheduler.groups import (
    NODE_ANNOTATION,
    RECORD_KEYS,
    RESERVATION_ANNOTATION,
    SIZE_ANNOTATION,
    GroupKey,
    GroupSpec,
    assign,
    build_request,
    explain_rejections,
    group_key,
    missing,
    pod_key,
    record_annotations,
    spec_from_coscheduling,
    spec_from_native,
    spec_of_lone_pod,
    stray_label,
)
from scheduler.metrics import SchedulerStats

__all__ = ["Binder", "BinderConfig", "pod_informer"]

log = logging.getLogger(__name__)

COSCHEDULING_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}"
NATIVE_PATH = "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups/{name}"
_DONE = frozenset({"Succeeded", "Failed"})


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
    step_pause_s: float = 0.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(pod).get("annotations") or {}


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _version(pod: Mapping[str, Any]) -> int:
    try:
        return int(_meta(pod).get("resourceVersion") or 0)
    except ValueError:  # opaque to clients in principle; etcd's revisions in practice
        return 0


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_informer(
    kube: KubeClient, scheduler_name: str, on_change: Callable[[], None] = lambda: None
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
        on_upsert=lambda obj, relisted: on_change(),
        on_delete=lambda obj: on_change(),
    )


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
        self.pods = pod_informer(kube, self.config.scheduler_name, self._wake.set)
        self.fitness = NodeFitness(kube, self._wake.set)  # nodes kube-scheduler would allow
        self._committed: set[str] = set()
        self._minimum_at: dict[GroupKey, float] = {}
        self._retry_at: dict[GroupKey, float] = {}
        self._said: dict[GroupKey, str] = {}  # last message told to a group's pods
        # The resource version each pod reached by this binder's own writes: a group whose
        # cached pods are older is skipped until the watch catches up, so a decision is never
        # taken twice on a stale copy.
        self._written: dict[str, int] = {}

    async def run(self) -> None:
        """Keep the pod cache and run passes until cancelled."""
        informer = asyncio.create_task(self.pods.run(), name="scheduler-pods")
        fitness = asyncio.create_task(self.fitness.run(), name="scheduler-fitness")
        try:
            await self.pods.synced.wait()
            await self.fitness.synced()
            while True:
                self._wake.clear()
                try:
                    await self.run_pass()
                except (KubeError, PlacementCallError) as err:
                    log.warning("pass failed: %s", err)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.config.resync_s)
        finally:
            for task in (informer, fitness):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # --- one pass ------------------------------------------------------------------------------

    def _groups(self) -> tuple[dict[GroupKey, list[dict[str, Any]]], set[GroupKey]]:
        """Live pods by group, and the groups whose cached copies lag this binder's writes."""
        groups: dict[GroupKey, list[dict[str, Any]]] = {}
        stale: set[GroupKey] = set()
        for pod in self.pods.cache.values():
            key = group_key(pod)
            if _version(pod) < self._written.get(pod_key(pod), 0):
                stale.add(key)
            if (pod.get("status") or {}).get("phase") in _DONE:
                continue
            if _meta(pod).get("deletionTimestamp"):
                continue
            groups.setdefault(key, []).append(pod)
        return groups, stale

    def _wrote(self, pod: Mapping[str, Any]) -> None:
        self._written[pod_key(pod)] = _version(pod)

    async def run_pass(self) -> None:
        """Carry recorded groups forward, then place the groups that reached their minimum."""
        groups, stale = self._groups()
        # Only reservations committed before this pass's snapshot of the pods may be released
        # for want of a live pod recording them: a gang bound in this pass is recorded on pods
        # the snapshot does not show yet, and a stale group's cached pods may not show it either.
        committed_before = frozenset(self._committed)
        pending = 0
        for key in sorted(groups):
            if key in stale:
                continue
            pods = groups[key]
            recorded = [p for p in pods if _annotations(p).get(RESERVATION_ANNOTATION)]
            if recorded:
                await self._finish(key, recorded, all_live=len(recorded) == len(pods))
                continue
            unbound = [p for p in pods if not _node(p)]
            if not unbound:
                continue
            pending += 1
            if await self._schedule(key, unbound):
                pending -= 1
        self.stats.groups_pending = pending
        if not stale:
            await self._release_finished(groups, committed_before)
        for key in list(self._minimum_at):
            if key not in groups:
                self._minimum_at.pop(key, None)

    async def _release_finished(
        self, groups: Mapping[GroupKey, list[dict[str, Any]]], committed: frozenset[str]
    ) -> None:
        """Release a reservation `committed` before the pods in `groups` were read once no
        live pod records it (the gang finished or was deleted), so its GPUs go back to the
        pool."""
        live = {
            _annotations(p).get(RESERVATION_ANNOTATION) for pods in groups.values() for p in pods
        }
        for rid in sorted(committed - live):
            try:
                await self.placement.release(rid)
            except PlacementCallError as err:
                if err.status != "NOT_FOUND":
                    log.warning("release %s: %s", rid, err)
                    continue
            self._committed.discard(rid)
            log.info("released %s: no live pod records it", rid)

    # --- steps 1 to 5 --------------------------------------------------------------------------

    async def _spec(self, key: GroupKey, pods: list[dict[str, Any]]) -> GroupSpec | None:
        if key.kind == "pod":
            return spec_of_lone_pod(pods[0])
        template = COSCHEDULING_PATH if key.kind == "podgroup" else NATIVE_PATH
        path = template.format(ns=quote(key.namespace), name=quote(key.name))
        try:
            obj = await self.kube.request("GET", path)
        except NotFoundError:
            await self._say(key, pods, "Waiting", f"{key.kind} {key.name} does not exist (yet)")
            return None
        return spec_from_coscheduling(obj) if key.kind == "podgroup" else spec_from_native(obj)

    async def _schedule(self, key: GroupKey, pods: list[dict[str, Any]]) -> bool:
        """Steps 1 to 5 for one group; True when it was bound."""
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return False
        spec = await self._spec(key, pods)
        if spec is None:
            return False
        try:
            request = build_request(spec, pods)
        except RequestError as err:
            self.stats.decided("invalid")
            await self._reject(key, pods, "InvalidRequest", f"{err.field}: {err.reason}")
            return False
        if (stray := stray_label(request, pods)) is not None:
            self.stats.decided("invalid")
            await self._reject(key, pods, "InvalidRequest", stray)
            return False
        lacking = missing(request, pods)
        if lacking:
            need = ", ".join(f"{g}: {n} more" for g, n in sorted(lacking.items()))
            await self._say(key, pods, "Waiting", f"waiting for the gang's minimum ({need})")
            return False
        # Node fitness (cordons, taints, affinity, resources, host ports) before Place.
        verdict = self.fitness.restrict(request, pods)
        if verdict.request is None:
            self.stats.decided("unschedulable")
            await self._reject(key, pods, "Unschedulable", verdict.message)
            return False
        self._minimum_at.setdefault(key, time.monotonic())
        return await self._place_and_bind(key, verdict.request, pods)

    async def _place_and_bind(
        self, key: GroupKey, request: PlacementRequest, pods: list[dict[str, Any]]
    ) -> bool:
        try:
            answer = await self.placement.place(request, ttl_s=self.config.reservation_ttl_s)
        except PlacementCallError as err:
            if err.status == "INVALID_ARGUMENT":
                self.stats.decided("invalid")
                await self._reject(
                    key, pods, "InvalidRequest", f"gputopo.io/request: {err.message}"
                )
            else:
                self.stats.decided("error")
                log.warning("%s: place failed: %s", key, err)
                self._retry_at[key] = time.monotonic() + self.config.retry_unplaced_s
            return False
        if not answer.result.placed or answer.reservation is None:
            log.info("%s: not placed: %s", key, answer.result.reason)
            self.stats.decided("unschedulable")
            await self._reject(key, pods, "Unschedulable", explain_rejections(answer.result))
            return False
        rid = answer.reservation.id
        where = assign(request, answer.result, pods)
        chosen = [p for p in pods if pod_key(p) in where]
        recorded: list[dict[str, Any]] = []
        try:
            uuids = await self.placement.gpu_uuids(sorted({w.node for w in where.values()}))
        except PlacementCallError as err:  # the UUIDs are for people; indices suffice to bind
            log.warning("%s: no GPU UUIDs (%s); recording indices only", key, err)
            uuids = {}
        await self._pause()
        # Step 3: record on every pod before binding any.
        for pod in chosen:
            meta = _meta(pod)
            place = where[pod_key(pod)]
            record = record_annotations(rid, place, len(chosen), uuids.get(place.node))
            pod_now = await self.kube.patch_pod_annotations(meta["namespace"], meta["name"], record)
            self._wrote(pod_now)
            recorded.append(pod_now)
            await self._pause()
        log.info("%s: reserved %s on %s", key, rid, sorted({w.node for w in where.values()}))
        return await self._finish(key, recorded, reservation_alive=True)

    async def _finish(
        self,
        key: GroupKey,
        recorded: list[dict[str, Any]],
        *,
        reservation_alive: bool = False,
        all_live: bool = False,
    ) -> bool:
        """Bind the rest and commit, or undo (see the module docstring); True when bound."""
        rid = _annotations(recorded[0]).get(RESERVATION_ANNOTATION, "")
        mixed = {_annotations(p).get(RESERVATION_ANNOTATION) for p in recorded}
        size = int(_annotations(recorded[0]).get(SIZE_ANNOTATION) or len(recorded))
        unbound = [p for p in recorded if not _node(p)]
        # Every live pod recorded and bound: the gang was whole once (binding starts only after
        # every pod is recorded), so fewer live pods than its size means some finished or were
        # deleted, and a running pod is never deleted to repair a gang. (A live pod without a
        # record, as a kill during an undo leaves, still sends the gang to the undo below.)
        if not unbound and len(mixed) == 1 and (len(recorded) >= size or all_live):
            if rid not in self._committed:
                await self._commit(key, rid, recorded)
            return True
        if not reservation_alive:
            log.info(
                "%s: carrying forward a recorded gang (%d of %d pods bound)",
                key,
                len(recorded) - len(unbound),
                size,
            )
        alive = reservation_alive or await self._alive(rid)
        if alive is None:
            return False  # the aggregator did not answer: try again next pass
        whole = len(mixed) == 1 and len(recorded) >= size
        nodes_ok = alive and whole and await self._nodes_exist(unbound)
        if not nodes_ok:
            await self._undo(key, recorded, rid, why=self._undo_reason(alive, whole))
            return False
        for pod in unbound:
            await self._pause()
            if not await self._nodes_exist([pod]):
                # The node went away while the gang was binding: no pod may wait on it.
                await self._undo(key, recorded, rid, why="a node it was placed on is gone")
                return False
            if not await self._bind(pod):
                # A pod that cannot be bound after retries (deleted, or refused): undo.
                await self._undo(key, recorded, rid, why="a bind failed after retries")
                return False
        await self._pause()
        await self._commit(key, rid, recorded)
        return True

    async def _pause(self) -> None:
        if self.config.step_pause_s > 0:
            await asyncio.sleep(self.config.step_pause_s)

    @staticmethod
    def _undo_reason(alive: bool, whole: bool) -> str:
        if not alive:
            return "its reservation expired or was released before every pod was bound"
        if not whole:
            return "the decision was recorded on only some of its pods"
        return "a node it was placed on is gone"

    async def _alive(self, rid: str) -> bool | None:
        try:
            await self.placement.explain(rid)
        except PlacementCallError as err:
            if err.status in ("NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT"):
                return False
            log.warning("explain %s: %s", rid, err)
            return None
        return True

    async def _nodes_exist(self, pods: list[dict[str, Any]]) -> bool:
        for node in sorted({_annotations(p).get(NODE_ANNOTATION, "") for p in pods}):
            try:
                await self.kube.get_node(node)
            except NotFoundError:
                return False
        return True

    async def _bind(self, pod: dict[str, Any]) -> bool:
        meta = _meta(pod)
        node = _annotations(pod)[NODE_ANNOTATION]
        for attempt in range(self.config.bind_retries):
            self.stats.bind_attempts += 1
            try:
                await self.kube.bind_pod(
                    meta["namespace"], meta["name"], node, uid=str(meta.get("uid", ""))
                )
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

    async def _commit(self, key: GroupKey, rid: str, recorded: list[dict[str, Any]]) -> None:
        try:
            await self.placement.commit(rid, owner=str(key))
        except PlacementCallError as err:
            if err.status != "NOT_FOUND":
                raise
            # Expired after every pod was bound: the pods now count as bound pods do.
            log.info("%s: reservation %s gone at commit; the bound pods hold the GPUs", key, rid)
        self._committed.add(rid)
        began = self._minimum_at.pop(key, None)
        if began is not None:
            self.stats.bound_after(time.monotonic() - began)
            self.stats.decided("bound")
            self._said.pop(key, None)
            for pod in recorded:
                ann = _annotations(pod)
                await self._event(
                    pod,
                    "Scheduled",
                    f"gang {key} bound: {ann.get(NODE_ANNOTATION)} GPUs "
                    f"{ann.get('gputopo.io/gpus')} (reservation {rid})",
                )
            log.info("%s: %d pod(s) bound, reservation %s committed", key, len(recorded), rid)

    async def _undo(
        self, key: GroupKey, recorded: list[dict[str, Any]], rid: str, *, why: str
    ) -> None:
        """Delete the bound pods (their controller recreates them), strip the records from the
        rest, release the reservation: the group starts again from step 1."""
        log.warning("%s: undoing: %s", key, why)
        for pod in recorded:
            meta = _meta(pod)
            await self._event(pod, "Undone", f"gang {key} undone and requeued: {why}", "Warning")
            if _node(pod):
                await self.kube.delete_pod(
                    meta["namespace"],
                    meta["name"],
                    uid=str(meta.get("uid", "")),
                    grace_s=self.config.undo_grace_s,
                )
            else:
                with contextlib.suppress(NotFoundError):
                    self._wrote(
                        await self.kube.patch_pod_annotations(
                            meta["namespace"], meta["name"], dict.fromkeys(RECORD_KEYS)
                        )
                    )
        for one in {_annotations(p).get(RESERVATION_ANNOTATION, "") for p in recorded}:
            with contextlib.suppress(PlacementCallError):
                await self.placement.release(one)
        self.stats.repairs += 1
        self.stats.decided("undone")
        self._minimum_at.pop(key, None)

    # --- saying why ----------------------------------------------------------------------------

    async def _reject(
        self, key: GroupKey, pods: list[dict[str, Any]], reason: str, message: str
    ) -> None:
        """An Event and `PodScheduled=False` on every pod; the group is tried again later."""
        self._retry_at[key] = time.monotonic() + self.config.retry_unplaced_s
        if self._said.get(key) == reason + message:
            return
        self._said[key] = reason + message
        text = f"gang {key} not bound: {message}"
        for pod in pods:
            meta = _meta(pod)
            await self._event(pod, reason, text, "Warning")
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": reason,
                "message": text[:2048],
                "lastTransitionTime": _now(),
            }
            with contextlib.suppress(NotFoundError):
                await self.kube.set_pod_condition(meta["namespace"], meta["name"], condition)

    async def _say(
        self, key: GroupKey, pods: list[dict[str, Any]], reason: str, message: str
    ) -> None:
        """A Normal Event on each pod, once per distinct message."""
        if self._said.get(key) == reason + message:
            return
        self._said[key] = reason + message
        for pod in pods:
            await self._event(pod, reason, f"gang {key}: {message}")

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
