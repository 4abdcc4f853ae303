"""Which GPUs the kubelet should hand the container it is admitting: the ones gputopo recorded.

The kubelet's device manager picks a container's devices itself; a device plugin can only state a
preference (`GetPreferredAllocation`), and no call says which pod is being admitted. So the plugin
finds the pod the way the kubelet admits them:

1. **Candidates**: pods bound to this node, not finished or being deleted, whose record
   (`gputopo.io/gpus`, `gputopo.io/gpu-uuids`) names this node, and that the kubelet has not yet
   given devices to (PodResources lists them). The kubelet admits pods one at a time, oldest
   first (it sorts new pods by creation time), and a pod's devices are allocated during its
   admission, container by container.
2. **Match**: a candidate fits the call when one of its containers asks for `allocation_size`
   GPUs, its recorded GPUs not yet allocated (still `available`) are at least that many, and
   every `must_include` device is one of them. A pod some of whose recorded GPUs are already gone
   is mid-admission (an earlier container took them) and is preferred; otherwise the oldest fits.
3. **Answer**: `must_include`, then the pod's remaining recorded GPUs in rank order.
4. **Race**: when more than one candidate fits, the answer is for the one the kubelet admits
   first, and the others are named in `rivals` (logged and counted). Whatever the kubelet then
   really gives is checked against the record through PodResources (`exporter.claims`'s
   mismatch count and the aggregator's Event), so a wrong guess is seen, never silent.
5. **Fallback**: no candidate fits (a pod gputopo did not place): the link-graph-best set among
   `available` (`gputopo.placement.intranode.choose_gpus`), keeping `must_include`.

Pure: pod objects and device IDs in, an answer out. `exporter.deviceplugin` serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputopo.placement.intranode import choose_gpus
from gputopo.topology import NodeTopology

__all__ = [
    "GPUS_ANNOTATION",
    "NODE_ANNOTATION",
    "UUIDS_ANNOTATION",
    "DeviceIds",
    "PendingPod",
    "Preference",
    "best_devices",
    "pending_pods",
    "prefer",
]

# The binder's record (scheduler.groups writes them; the processes share no code, the names are
# the contract).
NODE_ANNOTATION = "gputopo.io/node"
GPUS_ANNOTATION = "gputopo.io/gpus"
UUIDS_ANNOTATION = "gputopo.io/gpu-uuids"
_DONE = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class DeviceIds:
    """This node's GPUs as the plugin names them: by UUID (NVIDIA's default) or by index
    (`deviceIDStrategy=index`)."""

    by_index: Mapping[int, str]

    @classmethod
    def of(cls, topology: NodeTopology, *, strategy: str = "uuid") -> DeviceIds:
        if strategy not in ("uuid", "index"):
            raise ValueError(f"device id strategy: {strategy!r} is not 'uuid' or 'index'")
        return cls(
            {
                g.index: (g.uuid if strategy == "uuid" and g.uuid else str(g.index))
                for g in topology.gpus
            }
        )

    def index_of(self, device: str) -> int | None:
        for index, name in self.by_index.items():
            if name.lower() == device.lower():
                return index
        return None


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod with a record on this node that the kubelet has not given devices to yet."""

    key: str  # namespace/name
    created: str  # RFC 3339: sorts in time order
    devices: tuple[str, ...]  # the recorded GPUs as device IDs, in rank order
    requests: tuple[int, ...]  # GPUs each container asks for (init containers first), > 0 only


@dataclass(frozen=True, slots=True)
class Preference:
    """The answer for one container, and why: `pod` is "" for the fallback."""

    devices: tuple[str, ...]
    pod: str = ""
    rivals: tuple[str, ...] = ()


def _requests(pod: Mapping[str, Any], resource: str) -> tuple[int, ...]:
    spec = pod.get("spec") or {}
    found = []
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(resource) or (
            resources.get("requests") or {}
        ).get(resource)
        try:
            count = int(str(value)) if value is not None else 0
        except ValueError:
            count = 0
        if count > 0:
            found.append(count)
    return tuple(found)


def _recorded(annotations: Mapping[str, str], ids: DeviceIds) -> tuple[str, ...] | None:
    """The record as device IDs: the UUIDs when the strategy names GPUs by UUID and the binder
    wrote them (exact, whatever the index order), else the indices mapped; None if unreadable."""
    uuids = [u for u in str(annotations.get(UUIDS_ANNOTATION, "")).split(",") if u]
    known = {name.lower(): name for name in ids.by_index.values()}
    if uuids and all(u.lower() in known for u in uuids):
        return tuple(known[u.lower()] for u in uuids)
    try:
        indices = [int(t) for t in str(annotations.get(GPUS_ANNOTATION, "")).split(",") if t]
    except ValueError:
        return None
    if not indices or any(i not in ids.by_index for i in indices):
        return None
    return tuple(ids.by_index[i] for i in indices)


def pending_pods(
    pods: Iterable[Mapping[str, Any]],
    *,
    node: str,
    resource: str,
    ids: DeviceIds,
    allocated: Mapping[str, int],
) -> list[PendingPod]:
    """Candidates (step 1), in the kubelet's admission order. `allocated`: how many devices of
    `resource` PodResources lists for each pod (`namespace/name`); a pod that holds all it asks
    for is admitted, one that holds some is mid-admission and still a candidate."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        annotations = meta.get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in _DONE:
            continue
        if annotations.get(NODE_ANNOTATION, node) != node:
            continue
        devices = _recorded(annotations, ids)
        requests = _requests(pod, resource)
        if devices is None or not requests or allocated.get(key, 0) >= sum(requests):
            continue
        found.append(PendingPod(key, str(meta.get("creationTimestamp", "")), devices, requests))
    return sorted(found, key=lambda p: (p.created, p.key))


def prefer(
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    pending: Sequence[PendingPod],
    best: Callable[[Sequence[str], Sequence[str], int], tuple[str, ...]],
) -> Preference:
    """Steps 2 to 5 for one container request of the kubelet."""
    free = set(available)
    must = list(dict.fromkeys(must_include))
    fits: list[tuple[bool, PendingPod, list[str]]] = []
    for pod in pending:
        # must_include: devices the kubelet reuses from the pod's init containers (no longer
        # available, but the pod's own).
        left = [d for d in pod.devices if d in free or d in must]
        if size not in pod.requests or len(left) < size or not set(must) <= set(left):
            continue
        fits.append((len(left) < len(pod.devices), pod, left))
    if fits:
        started = [f for f in fits if f[0]]
        _, chosen, left = (started or fits)[0]
        answer = must + [d for d in left if d not in must][: size - len(must)]
        rivals = tuple(p.key for _, p, _ in fits if p is not chosen)
        return Preference(tuple(answer), chosen.key, rivals)
    return Preference(best(available, must, size))


def best_devices(
    topology: NodeTopology, ids: DeviceIds
) -> Callable[[Sequence[str], Sequence[str], int], tuple[str, ...]]:
    """The fallback (step 5): the link-graph-best `size` of `available` that keeps `must`."""

    def best(available: Sequence[str], must: Sequence[str], size: int) -> tuple[str, ...]:
        need = size - len(must)
        if need <= 0:
            return tuple(must[:size])
        index = {d: ids.index_of(d) for d in available}
        free = frozenset(i for d, i in index.items() if i is not None and d not in must)
        chosen = choose_gpus(topology, free, need) if len(free) >= need else None
        if chosen is None:  # devices this node does not know: keep the kubelet's order
            rest = [d for d in available if d not in must]
            return (*must, *rest[:need])
        return (*must, *(ids.by_index[i] for i in chosen))

    return best
