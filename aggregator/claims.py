"""GPUs that DRA ResourceClaims hold (`resource.k8s.io/v1`), read from the claim objects.

With Dynamic Resource Allocation the scheduler allocates devices to a ResourceClaim and writes the
result into the claim's status; the kubelet then hands them to the pod. Those GPUs are in use from
the moment of allocation (a claim can be allocated before its pod runs, and stays allocated until
the scheduler deallocates it), whoever scheduled the pod, so gputopo counts them as used.

The fields read, as `k8s.io/api/resource/v1/types.go` defines them:

1. `status.allocation.devices.results[]`: `driver`, `pool`, `device` of each allocated device.
2. `status.allocation.nodeSelector`: for node-local devices, a node selector term with a
   `matchFields` entry `metadata.name In [node]`; that is the node. Without it, the pool's name
   is taken as the node's (NVIDIA's DRA driver names its pool after the node); a name that is
   no node of the cluster holds nothing anyone asks about.
3. Which GPU: the device's `uuid` attribute in the node's ResourceSlice (`SliceIndex`; for a
   MIG slice its `parentUUID`), matched to the node's GPUs by UUID (`located`). That is exact:
   NVIDIA's DRA driver names a whole GPU `gpu-N` and a partition of it `gpu-N-...`, but N is
   the GPU's minor number (`GpuInfo.CanonicalName()` in kubernetes-sigs/dra-driver-nvidia-gpu),
   which differs from the NVML index gputopo places by on many machines. Only while no slice of
   the pool has been seen is N taken as the index. Either way a partitioned GPU is not free for
   a whole-GPU placement (`whole` says which). Other names are kept with `gpu=None`: in use,
   not located.
4. A result with `adminAccess: true` (monitoring access to a device others use) holds nothing.

The test API server (1.20) does not serve `resource.k8s.io/v1`; this reader is tested on recorded
objects written to those types (`tests/data/dra/`). It is pure: objects in, claimed GPUs out.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gputopo.topology import NodeTopology

__all__ = ["GPU_DRIVERS", "ClaimedDevice", "SliceIndex", "claimed_devices", "located"]

GPU_DRIVERS = frozenset({"gpu.nvidia.com"})
_GPU = re.compile(r"^gpu-(\d+)(-.+)?$")


@dataclass(frozen=True, slots=True, order=True)
class ClaimedDevice:
    """One allocated device of a GPU driver: where, which GPU (None: not a whole GPU), by whom."""

    node: str
    gpu: int | None
    device: str
    claim: str  # namespace/name
    whole: bool = True
    uuid: str = ""  # the GPU's UUID from its ResourceSlice ("" when no slice was seen)


class SliceIndex:
    """GPU UUIDs of DRA devices, from ResourceSlices: (driver, pool, device) -> UUID (the
    parent GPU's for a MIG slice). Kept by the claim watcher; pure."""

    def __init__(self) -> None:
        self._slices: dict[str, dict[tuple[str, str, str], str]] = {}

    def set_slice(self, name: str, obj: Mapping[str, Any] | None) -> None:
        """A ResourceSlice as it is now (None: deleted)."""
        if obj is None:
            self._slices.pop(name, None)
            return
        spec = obj.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        found = {}
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}

            def text(key: str, attributes: Mapping[str, Any] = attributes) -> str:
                for k in (key, f"{driver}/{key}"):
                    value = (attributes.get(k) or {}).get("string")
                    if value:
                        return str(value)
                return ""

            uuid = text("parentUUID") or text("uuid")
            if uuid:
                found[(driver, pool, str(device.get("name", "")))] = uuid
        self._slices[name] = found

    def uuid(self, driver: str, pool: str, device: str) -> str:
        for devices in self._slices.values():
            found = devices.get((driver, pool, device))
            if found:
                return found
        return ""

    def knows(self, driver: str, pool: str) -> bool:
        return any(
            d == driver and p == pool for devices in self._slices.values() for d, p, _ in devices
        )


def claimed_devices(
    claims: Iterable[Mapping[str, Any]],
    *,
    nodes: Collection[str] | None = None,
    drivers: Collection[str] = GPU_DRIVERS,
    slices: SliceIndex | None = None,
) -> list[ClaimedDevice]:
    """Every device of a GPU driver that an allocated claim holds: on the node its selector
    names, else on the node its pool is named after; only on `nodes` when given. With
    `slices`, each device carries its GPU's UUID."""
    found = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        selected = _selected_node(allocation.get("nodeSelector") or {})
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") not in drivers or result.get("adminAccess") is True:
                continue
            driver = str(result.get("driver"))
            pool, device = str(result.get("pool", "")), str(result.get("device", ""))
            node = selected or pool
            if not node or (nodes is not None and node not in nodes):
                continue
            gpu = _GPU.fullmatch(device)
            uuid = slices.uuid(driver, pool, device) if slices is not None else ""
            whole = gpu is not None and not gpu[2]
            if uuid or (slices is not None and slices.knows(driver, pool)):
                found.append(ClaimedDevice(node, None, device, name, whole=whole, uuid=uuid))
            elif gpu is None:
                found.append(ClaimedDevice(node, None, device, name, whole=False))
            else:  # no slice seen yet: the name's N, which is the index only where minors are
                found.append(ClaimedDevice(node, int(gpu[1]), device, name, whole=whole))
    return sorted(found)


def located(devices: Iterable[ClaimedDevice], topology: NodeTopology) -> tuple[frozenset[int], int]:
    """The node's GPUs these devices hold (by UUID, else by the index of their name), and how
    many hold a GPU that could not be located (counted, not pinned)."""
    by_uuid = {g.uuid.lower(): g.index for g in topology.gpus if g.uuid}
    held: set[int] = set()
    unlocated = 0
    for d in devices:
        index = by_uuid.get(d.uuid.lower()) if d.uuid else d.gpu
        if index is None:
            unlocated += 1
        else:
            held.add(index)
    return frozenset(held), unlocated


def _selected_node(selector: Mapping[str, Any]) -> str:
    """The node a node selector names with `metadata.name In [node]`, or ""."""
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            values = field.get("values") or []
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and values:
                return str(values[0])
    return ""
