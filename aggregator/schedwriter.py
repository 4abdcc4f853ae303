"""Keeps the opt-in scheduler objects (Kueue/KAI `Topology`, Volcano `HyperNode`) in the
cluster equal to what `aggregator.exports` derives from the current state. Leader only.

It owns exactly the objects labelled `app.kubernetes.io/managed-by: gputopo` of each kind it
was asked to write: missing ones are created, changed ones replaced, ones no longer derived
deleted; nothing else is touched. Kueue's v1beta2 `Topology` may change its levels in place
while `kubernetes.io/hostname` is the lowest level before and after (every Topology gputopo
derives ends with it), so it is replaced in place: deleting it instead loops on
`409 object is being deleted` behind Kueue's in-use finalizer while a ClusterQueue uses it.
Where levels are immutable (KAI's, or a Topology without the hostname level) a changed
Topology is deleted and created again. (These are CEL rules the 1.20 test server cannot enforce
but real servers do.) A kind whose CRD is not installed is skipped with one
warning, and retried at the next sync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.exports import (
    HOSTNAME,
    KAI_TOPOLOGY,
    KUEUE_TOPOLOGY,
    MANAGED_BY,
    VOLCANO_HYPERNODE,
    ObjectKind,
    Placed,
    kai_topologies,
    kueue_topologies,
    volcano_hypernodes,
)
from aggregator.labels import LabelScheme
from aggregator.state import ClusterState
from gputopo.runtime.kube import KubeClient, KubeError, NotFoundError

__all__ = ["KINDS", "SchedulerObjectWriter", "placed_nodes"]

log = logging.getLogger(__name__)

KINDS: dict[str, tuple[ObjectKind, Callable[[list[Placed], LabelScheme], list[dict[str, Any]]]]] = {
    "kueue": (KUEUE_TOPOLOGY, kueue_topologies),
    "kai": (KAI_TOPOLOGY, kai_topologies),
    "volcano": (VOLCANO_HYPERNODE, lambda nodes, scheme: volcano_hypernodes(nodes)),
}
_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


def placed_nodes(state: ClusterState) -> list[Placed]:
    """Every known node and its merged fabric position."""
    out = []
    for name in state.node_names:
        rec = state.record(name)
        if rec is not None:
            out.append(Placed(name, rec.topology.fabric))
    return out


class SchedulerObjectWriter:
    """See the module docstring."""

    def __init__(
        self,
        state: ClusterState,
        kube: KubeClient,
        *,
        kinds: Iterable[str],
        scheme: LabelScheme,
        interval_s: float = 30.0,
        settle_s: float = 2.0,
    ) -> None:
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(
                f"unknown scheduler object kind {unknown[0]!r} (known: {sorted(KINDS)})"
            )
        self.state = state
        self.kube = kube
        self.kinds = sorted(set(kinds))
        self.scheme = scheme
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.writes = 0
        self.missing_crds: set[str] = set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Sync now, then after topology changes (settled) and every `interval_s`."""
        unsubscribe = self.state.subscribe(self._heard)
        try:
            while True:
                self._changed.clear()
                await self.sync()
                try:
                    await asyncio.wait_for(self._changed.wait(), self.interval_s)
                    await asyncio.sleep(self.settle_s)
                except TimeoutError:
                    pass
        finally:
            unsubscribe()

    def _heard(self, event: ChangeEvent) -> None:
        """Wake for changes that can move a fabric position, the objects' only input:
        reservations and staleness cannot (stale nodes keep their place)."""
        if event.kind not in (ChangeKind.ALLOCATION, ChangeKind.STALE):
            self._changed.set()

    async def sync(self) -> None:
        """One pass over every kind."""
        nodes = placed_nodes(self.state)
        for name in self.kinds:
            kind, build = KINDS[name]
            try:
                await self._sync_kind(kind, build(nodes, self.scheme))
                self.missing_crds.discard(name)
            except NotFoundError:
                if name not in self.missing_crds:
                    log.warning(
                        "%s %s: the CRD is not installed; not writing them", name, kind.kind
                    )
                self.missing_crds.add(name)
            except KubeError as err:
                log.warning("writing %s objects failed: %s", name, err)

    async def _sync_kind(self, kind: ObjectKind, desired: list[dict[str, Any]]) -> None:
        existing = {
            obj["metadata"]["name"]: obj
            for obj in await self.kube.list_objects(
                kind.group_version, kind.plural, selector=_SELECTOR
            )
        }
        wanted = {obj["metadata"]["name"]: obj for obj in desired}
        for name, obj in wanted.items():
            have = existing.get(name)
            if have is None:
                await self.kube.create_object(kind.group_version, kind.plural, obj)
                self.writes += 1
            elif have.get("spec") != obj["spec"]:
                if kind.kind == "Topology" and not _levels_mutable(kind, have, obj):
                    await self.kube.delete_object(kind.group_version, kind.plural, name)
                    await self.kube.create_object(kind.group_version, kind.plural, obj)
                else:
                    # The object as the server has it, with only the spec (and gputopo's own
                    # labels) changed: another controller's finalizers (Kueue's in-use one),
                    # annotations and labels stay; resourceVersion makes a race a 409.
                    meta = have["metadata"]
                    labels = {**(meta.get("labels") or {}), **obj["metadata"]["labels"]}
                    body = {**have, "spec": obj["spec"], "metadata": {**meta, "labels": labels}}
                    await self.kube.replace_object(kind.group_version, kind.plural, body)
                self.writes += 1
        for name in sorted(set(existing) - set(wanted)):
            await self.kube.delete_object(kind.group_version, kind.plural, name)
            self.writes += 1


def _lowest_is_hostname(obj: dict[str, Any]) -> bool:
    levels = obj.get("spec", {}).get("levels") or []
    return bool(levels) and levels[-1].get("nodeLabel") == HOSTNAME


def _levels_mutable(kind: ObjectKind, have: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether the server lets this Topology's levels change in place (Kueue v1beta2's rule)."""
    return (
        kind.group_version == "kueue.x-k8s.io/v1beta2"
        and _lowest_is_hostname(have)
        and _lowest_is_hostname(want)
    )
