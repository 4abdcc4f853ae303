"""What holds a node's GPUs besides gputopo's own reservations: pods, the kubelet, DRA claims.

Beside a real kube-scheduler, gputopo reserved a node that was already full: kube-scheduler had
bound pods holding 14 GPUs, and gputopo still said `free 136 of 136`. Every pod bound to a node
and not finished holds the GPUs its containers ask for, whoever scheduled it, so the state takes
them out of the node's free GPUs:

1. A pod's GPUs: its effective request of a GPU resource (`nvidia.com/gpu`, or the names
   given) as Kubernetes counts it, init containers, sidecars and overhead included
   (`gputopo.pods.pod_gpus`, the one rule the binder and the extender use too).
2. A pod counts while it is bound (`spec.nodeName`) and not `Succeeded` or `Failed`: a
   terminating pod still holds its devices until its containers stop.
3. A pod that carries `gputopo.io/reservation` of a live reservation is already held by the
   reservation book: counting it again would hold its GPUs twice. A pod whose reservation is
   gone (expired, released, unknown after a restart) counts as any other pod.

4. A pod whose reservation is gone but that carries the GPUs gputopo recorded for it
   (`gputopo.io/gpus`, written by the binder before it binds) holds exactly those GPUs. Seen
   under load: a binder stalled past its reservation's TTL after binding, the reservation
   expired, and counting the pod (rather than locating it) left its GPUs free, so a later
   placement was given the same indices.

Other pods are counted, not located: the state leaves out that many of the node's free GPUs
(the highest indices), so placement never hands out more GPUs than are free, and which GPUs the
device plugin gives is up to the kubelet. Where the exporter reports what the
kubelet handed out (`gputopo.gpu_use`), those exact GPUs are left out instead, and the pods it
names are not counted again; a pod bound but not yet reported by the kubelet still counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.claims import ClaimedDevice, located
from gputopo.gpu_use import GpuUse
from gputopo.pods import (
    GPU_RESOURCES,
    GPUS_ANNOTATION,
    RESERVATION_ANNOTATION,
    annotations_of,
    decode_gpus,
    pod_gpus,
    pod_key,
)
from gputopo.topology import NodeTopology

__all__ = [
    "GPU_RESOURCES",
    "RECORDED_GPUS_ANNOTATION",
    "RESERVATION_ANNOTATION",
    "Occupancy",
    "PodUse",
    "pod_gpus",
    "pod_use",
]

RECORDED_GPUS_ANNOTATION = GPUS_ANNOTATION  # the binder's record: "0,1,2,3"
_DONE = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodUse:
    """What one bound pod holds: `gpus` on `node`, and the reservation it belongs to, if any."""

    key: str  # namespace/name
    node: str
    gpus: int
    reservation: str = ""
    recorded: frozenset[int] = frozenset()  # the GPUs gputopo recorded for it, if it did


def pod_use(pod: Mapping[str, Any], resources: Collection[str] = GPU_RESOURCES) -> PodUse | None:
    """The GPUs a pod holds now, or None when it holds none (unbound, finished, no GPUs)."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    phase = str((pod.get("status") or {}).get("phase") or "")
    gpus = pod_gpus(pod, resources)
    if not node or phase in _DONE or gpus <= 0:
        return None
    annotations = annotations_of(pod)
    return PodUse(
        key=pod_key(pod),
        node=node,
        gpus=gpus,
        reservation=annotations.get(RESERVATION_ANNOTATION, ""),
        recorded=decode_gpus(annotations.get(GPUS_ANNOTATION, ""), gpus),
    )


def _noop(nodes: Iterable[str]) -> None:
    return None


class Occupancy:
    """What holds a node's GPUs besides gputopo's reservations, from every source, and the
    precedence between them (see the module docstring): bound pods, the kubelet's exact report
    and DRA ResourceClaims. Each change reports the nodes whose free GPUs may have moved through
    `on_change`, as the reservation book does; the cluster state composes the two."""

    def __init__(
        self,
        resources: Collection[str] = GPU_RESOURCES,
        *,
        on_change: Callable[[Iterable[str]], None] = _noop,
    ) -> None:
        self.resources = tuple(resources)
        self._on_change = on_change
        self._pods: dict[str, PodUse] = {}
        self._by_node: dict[str, dict[str, PodUse]] = {}
        # The exact GPUs each node's kubelet says it handed out (from the exporters).
        self._kubelet: dict[str, GpuUse] = {}
        # Devices of GPU drivers that DRA ResourceClaims hold, by claim (namespace/name), and
        # the same by node, which is what every free-GPU question asks.
        self._claims: dict[str, tuple[ClaimedDevice, ...]] = {}
        self._claimed: dict[str, dict[str, tuple[ClaimedDevice, ...]]] = {}

    # --- the sources --------------------------------------------------------------------

    def upsert(self, pod: Mapping[str, Any]) -> set[str]:
        """Take a pod as it is now; the nodes whose count may have moved."""
        key = pod_key(pod)
        moved = self._drop(key)
        use = pod_use(pod, self.resources)
        if use is not None:
            self._pods[key] = use
            self._by_node.setdefault(use.node, {})[key] = use
            moved.add(use.node)
        self._on_change(moved)
        return moved

    def remove(self, pod: Mapping[str, Any]) -> set[str]:
        """Forget a deleted pod; the nodes whose count moved."""
        moved = self._drop(pod_key(pod))
        self._on_change(moved)
        return moved

    def _drop(self, key: str) -> set[str]:
        old = self._pods.pop(key, None)
        if old is None:
            return set()
        on_node = self._by_node.get(old.node, {})
        on_node.pop(key, None)
        if not on_node:
            self._by_node.pop(old.node, None)
        return {old.node}

    def set_kubelet_use(self, node: str, use: GpuUse | None) -> None:
        """What a node's kubelet says is held (None: its exporter does not ask the kubelet)."""
        if self._kubelet.get(node) == use:
            return
        if use is None:
            self._kubelet.pop(node, None)
        else:
            self._kubelet[node] = use
        self._on_change((node,))

    def kubelet_use(self, node: str) -> GpuUse | None:
        """What a node's kubelet last said is held."""
        return self._kubelet.get(node)

    def set_claim(self, claim: str, devices: Iterable[ClaimedDevice]) -> None:
        """The GPU devices a DRA ResourceClaim holds now (none: deallocated or deleted)."""
        found = tuple(devices)
        old = self._claims.get(claim, ())
        if found == old:
            return
        if found:
            self._claims[claim] = found
        else:
            self._claims.pop(claim, None)
        moved = sorted({d.node for d in (*old, *found)})
        for node in moved:
            on_node = self._claimed.setdefault(node, {})
            here = tuple(d for d in found if d.node == node)
            if here:
                on_node[claim] = here
            else:
                on_node.pop(claim, None)
            if not on_node:
                del self._claimed[node]
        self._on_change(moved)

    def claimed(self, node: str) -> list[ClaimedDevice]:
        """Devices of GPU drivers that claims hold on a node."""
        return sorted(d for devices in self._claimed.get(node, {}).values() for d in devices)

    def pods(self, node: str) -> list[PodUse]:
        """The pods that hold GPUs of a node."""
        return sorted(self._by_node.get(node, {}).values(), key=lambda p: p.key)

    # --- the precedence -----------------------------------------------------------------

    def free(
        self,
        node: str,
        unreserved: frozenset[int],
        *,
        live: Callable[[str], bool],
        topology: NodeTopology | None = None,
    ) -> frozenset[int]:
        """Which of a node's `unreserved` GPUs (those no live reservation holds) nothing else
        holds, in this order: the kubelet's exact report, DRA claims of located devices, pods
        by gputopo's record; then as many as pods and unlocated claims hold by count, the
        highest indices first. `live(rid)`: whether a reservation is live (its pods are the
        book's already). With the node's `topology`, a claimed device is located by its
        ResourceSlice `uuid` (exact), else by the index its name carries."""
        free = unreserved
        use = self._kubelet.get(node)
        if use is not None and use.known:
            free = free.difference(use.held)
        claimed = self.claimed(node)
        if topology is not None:
            pinned_claims, unlocated = located(claimed, topology)
        else:
            pinned_claims = frozenset(d.gpu for d in claimed if d.gpu is not None)
            unlocated = sum(1 for d in claimed if d.gpu is None)
        free = free.difference(pinned_claims)
        counted, pinned = self.pods_holding(node, live=live)
        free = free.difference(pinned)
        taken = counted + unlocated
        if not taken:
            return free
        return frozenset(sorted(free)[: max(len(free) - taken, 0)])

    def pods_holding(self, node: str, *, live: Callable[[str], bool]) -> tuple[int, frozenset[int]]:
        """(GPUs bound pods hold by count, GPUs they hold by gputopo's record), beyond what
        live reservations and the kubelet's exact report account for."""
        use = self._kubelet.get(node)
        located = {h.pod_key for h in use.held.values()} if use is not None and use.known else set()
        return self.holding(node, live=live, located=located)

    def held(self, node: str, *, live: Callable[[str], bool], located: Collection[str] = ()) -> int:
        """GPUs of a node that pods hold by count (`holding`'s first half)."""
        return self.holding(node, live=live, located=located)[0]

    def holding(
        self, node: str, *, live: Callable[[str], bool], located: Collection[str] = ()
    ) -> tuple[int, frozenset[int]]:
        """What pods hold on a node that nothing else accounts for (not a live reservation, not
        the kubelet, which `located` the GPUs of these pods, `namespace/name`): how many GPUs
        pods hold by count, and which GPUs they hold by gputopo's record (rule 4 above)."""
        counted, pinned = 0, set[int]()
        for p in self._by_node.get(node, {}).values():
            if (p.reservation and live(p.reservation)) or p.key in located:
                continue
            if p.recorded:
                pinned |= p.recorded
            else:
                counted += p.gpus
        return counted, frozenset(pinned)
