"""Which nodes each group of a gang may run on, as kube-scheduler's filters decide it.

gputopo's aggregator knows GPUs and links, not cordons, taints, affinity or CPU. Before a gang
is placed, the binder asks this module for the nodes each request group may use: for every pod
of the group, the nodes that pass kube-scheduler v1.20's default filters (`gputopo.fitness`)
given every Node and every pod bound to one (whoever bound it); the group's set is what all its
pods fit (any of them may take any of the group's places). A pod that fits no node stops the
gang before Place, with kube-scheduler's own "0/N nodes are available: ..." reason and the
count per filter.

Nodes are read once per change and what bound pods take is kept one pod at a time
(`UsageBook`); the view over them is rebuilt only after a change (informer callbacks mark it
stale), in time proportional to the nodes. Like kube-scheduler without its "assumed" pods, a
pod bound a moment ago counts once the watch delivers it (milliseconds); GPUs are never at risk
in that window, because the aggregator's reservations hold them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputopo.fitness import Fitness, FitnessView, NodeFacts, UsageBook, node_facts
from gputopo.request import PlacementRequest
from gputopo.runtime.informer import Informer, bound_pod_informer
from gputopo.runtime.kube import KubeClient

__all__ = ["NodeFitness", "Verdict", "group_members", "restrict_request"]

GROUP_LABEL = "gputopo.io/group"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The request with each group's allowed nodes, or why the gang fits nowhere."""

    request: PlacementRequest | None
    message: str = ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Mapping[str, Any]) -> str:
    return f"{_meta(obj).get('namespace', '')}/{_meta(obj).get('name', '')}"


def group_members(
    request: PlacementRequest, pods: Sequence[Mapping[str, Any]]
) -> dict[str, list[Mapping[str, Any]]]:
    """Request group -> its pods: the `gputopo.io/group` label names the group; with a single
    group an unlabelled pod fills it (the binder's rule, scheduler/groups.py)."""
    names = [g.name for g in request.groups]
    out: dict[str, list[Mapping[str, Any]]] = {name: [] for name in names}
    for pod in pods:
        label = (_meta(pod).get("labels") or {}).get(GROUP_LABEL)
        if label in out:
            out[str(label)].append(pod)
        elif label is None and len(names) == 1:
            out[names[0]].append(pod)
    return out


def _signature(pod: Mapping[str, Any]) -> str:
    """What node fitness reads of a pod's spec: pods of a gang mostly share it, so each
    distinct one is judged once."""
    spec = pod.get("spec") or {}
    parts = {k: spec.get(k) for k in _READ}
    parts["containers"] = [
        {"resources": c.get("resources"), "ports": c.get("ports")}
        for c in spec.get("containers") or ()
    ]
    parts["initContainers"] = [
        {"resources": c.get("resources")} for c in spec.get("initContainers") or ()
    ]
    return json.dumps(parts, sort_keys=True, default=str)


_READ = ("nodeName", "tolerations", "nodeSelector", "affinity", "overhead")


def _unfit(pod: Mapping[str, Any], fit: Fitness) -> str:
    return f"pod {_key(pod)}: {fit.message()} ({fit.summary()})"


def restrict_request(
    request: PlacementRequest, pods: Sequence[Mapping[str, Any]], view: FitnessView
) -> Verdict:
    """Each group's `allowed_nodes` (see the module docstring), or the first reason no node
    can take a pod of it."""
    groups = []
    members = group_members(request, pods)
    judged: dict[str, Fitness] = {}
    for group in request.groups:
        allowed: set[str] | None = None
        for pod in sorted(members[group.name], key=_key):
            signature = _signature(pod)
            fit = judged.get(signature)
            if fit is None:
                fit = judged[signature] = view.check(pod)
            if not fit.feasible:
                return Verdict(None, _unfit(pod, fit))
            allowed = set(fit.feasible) if allowed is None else allowed & set(fit.feasible)
            if not allowed:
                return Verdict(
                    None,
                    f"the pods of group {group.name} fit no node in common "
                    f"(pod {_key(pod)} fits only {', '.join(fit.feasible[:5])})",
                )
        if allowed is not None:
            narrowed = frozenset(allowed)
            if group.allowed_nodes is not None:  # the request's own set narrows it further
                narrowed &= group.allowed_nodes
                if not narrowed:
                    return Verdict(
                        None,
                        f"none of the nodes group {group.name}'s request allows fits its pods "
                        f"(they fit {', '.join(sorted(allowed)[:5])})",
                    )
            group = dataclasses.replace(group, allowed_nodes=narrowed)  # noqa: PLW2901
        groups.append(group)
    return Verdict(dataclasses.replace(request, groups=tuple(groups)))


class NodeFitness:
    """Nodes and bound pods kept by two informers, and the fitness view over them."""

    def __init__(self, kube: KubeClient, on_change: Callable[[], None] = lambda: None) -> None:
        self._view: FitnessView | None = None
        self._facts: dict[str, NodeFacts] = {}
        self._book = UsageBook()

        def node_seen(node: dict[str, Any], relisted: bool = False) -> None:
            facts = node_facts(node)
            self._facts[facts.name] = facts
            changed()

        def node_gone(node: dict[str, Any]) -> None:
            self._facts.pop(str(_meta(node).get("name", "")), None)
            changed()

        # Pods are bound and finish all over a cluster: each marks the view stale but wakes no
        # pass (the periodic pass and the gang's retry see them); a Node change (an uncordon,
        # a taint lifted) wakes the binder at once.
        def pod_seen(pod: dict[str, Any], relisted: bool = False) -> None:
            self._book.put(_key(pod), pod)
            self._view = None

        def pod_gone(pod: dict[str, Any]) -> None:
            self._book.remove(_key(pod))
            self._view = None

        def changed() -> None:
            self._view = None
            on_change()

        self.nodes: Informer[dict[str, Any]] = Informer(
            name="scheduler-nodes",
            list_objects=lambda: kube.list_all("/api/v1/nodes"),
            watch=lambda version: kube.watch_json("/api/v1/nodes", version),
            key=lambda node: str(_meta(node).get("name", "")),
            version=lambda node: str(_meta(node).get("resourceVersion", "")),
            on_upsert=node_seen,
            on_delete=node_gone,
        )
        self.bound = bound_pod_informer(kube, on_upsert=pod_seen, on_delete=pod_gone)

    async def run(self) -> None:
        """Keep both caches until cancelled."""
        tasks = [
            asyncio.create_task(self.nodes.run(), name="scheduler-nodes"),
            asyncio.create_task(self.bound.run(), name="scheduler-bound-pods"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def synced(self) -> None:
        """Until both caches hold a first list."""
        await self.nodes.synced.wait()
        await self.bound.synced.wait()

    def view(self) -> FitnessView:
        """The fitness view of the caches now (rebuilt after a change)."""
        if self._view is None:
            self._view = FitnessView(self._facts.values(), usage=self._book)
        return self._view

    def restrict(self, request: PlacementRequest, pods: Sequence[Mapping[str, Any]]) -> Verdict:
        """`restrict_request` over the current view."""
        return restrict_request(request, pods, self.view())
