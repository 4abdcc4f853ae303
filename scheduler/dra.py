"""DRA, as a scheduler does it: allocate a pod's GPU ResourceClaims to the GPUs gputopo chose.

With Dynamic Resource Allocation the kubelet hands a pod the devices written in its claims'
`status.allocation`, and it is the scheduler that writes them (kube-scheduler's DynamicResources
plugin, in its PreBind step). A pod that gputopo's binder places and whose GPUs come from
ResourceClaims (NVIDIA's DRA driver, `gpu.nvidia.com`) therefore gets its claims allocated by
the binder, after the record and before the binding:

1. **Which claims**: the pod's `spec.resourceClaims`, by `resourceClaimName`, or for a template
   by the name the claim controller gave it (`status.resourceClaimStatuses`).
2. **Which devices**: the node's ResourceSlices of the driver; a whole GPU is the device whose
   `uuid` attribute is the chosen GPU's UUID (`gpu-N`, the device's name, is its minor number,
   not the NVML index gputopo places by, so names are never guessed from indices).
3. **What is written**: each request of a GPU device class takes its `count` (`All`: the rest)
   of the chosen GPUs in rank order; the allocation's results (`request`, `driver`, `pool`,
   `device`), a node selector naming the node, and `reservedFor` the pod. A claim already
   allocated is only reserved for the pod as well (a shared claim).
4. **Errors** name the field: a request of another kind (`firstAvailable`, `adminAccess`), too
   few chosen GPUs, or a chosen GPU missing from the slices stops the pod before it is bound.

`claim_status` and friends are pure (objects in, status out); `allocate_recorded` reads and writes
through the API server. The binder calls it once per pod, between Record and Bind.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gputopo.runtime.kube import KubeClient

__all__ = [
    "DRA_API",
    "GPU_CLASSES",
    "DraError",
    "SliceDevice",
    "allocate_recorded",
    "claim_names",
    "claim_status",
    "slice_devices",
]

DRA_API = "/apis/resource.k8s.io/v1"
GPU_DRIVER = "gpu.nvidia.com"
GPU_CLASSES = frozenset({"gpu.nvidia.com"})
# The binder's record (scheduler.groups): the node and the chosen GPUs' UUIDs in rank order.
_NODE = "gputopo.io/node"
_UUIDS = "gputopo.io/gpu-uuids"


class DraError(Exception):
    """A claim that cannot be allocated to the chosen GPUs: which field, and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A whole GPU as a ResourceSlice publishes it."""

    driver: str
    pool: str
    device: str


def _attribute(device: Mapping[str, Any], name: str, driver: str) -> str:
    """A string attribute, by its short name or qualified with the driver's domain."""
    attributes = device.get("attributes") or {}
    for key in (name, f"{driver}/{name}"):
        value = (attributes.get(key) or {}).get("string")
        if value:
            return str(value)
    return ""


def slice_devices(
    slices: Iterable[Mapping[str, Any]], *, node: str, driver: str = GPU_DRIVER
) -> dict[str, SliceDevice]:
    """The whole GPUs the driver publishes for `node`, by lower-case UUID (step 2). A device
    whose `type` attribute says it is not a whole GPU (a MIG slice) is left out."""
    found: dict[str, SliceDevice] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver or spec.get("nodeName") != node:
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or []:
            kind = _attribute(device, "type", driver)
            uuid = _attribute(device, "uuid", driver)
            if uuid and kind in ("", "gpu"):
                found[uuid.lower()] = SliceDevice(driver, pool, str(device.get("name", "")))
    return found


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The pod's ResourceClaims, in the order of `spec.resourceClaims` (step 1). A template's
    claim not yet created by the claim controller is left out (nothing to allocate yet)."""
    generated = {
        str(s.get("name")): str(s.get("resourceClaimName") or "")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(str(entry.get("name")), "")
        if name:
            names.append(str(name))
    return names


def _reserved(status: Mapping[str, Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = pod.get("metadata") or {}
    reserved = [dict(r) for r in status.get("reservedFor") or []]
    if not any(r.get("uid") == meta.get("uid") for r in reserved):
        reserved.append({"resource": "pods", "name": meta.get("name", ""), "uid": meta.get("uid")})
    return reserved


def claim_status(
    claim: Mapping[str, Any],
    *,
    pod: Mapping[str, Any],
    node: str,
    gpus: Sequence[str],
    devices: Mapping[str, SliceDevice],
    classes: Collection[str] = GPU_CLASSES,
    now: dt.datetime | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The claim's new status (step 3) and the chosen GPUs it left for the pod's next claims."""
    status = dict(claim.get("status") or {})
    if status.get("allocation"):
        return {**status, "reservedFor": _reserved(status, pod)}, list(gpus)
    left = list(gpus)
    results = []
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for number, request in enumerate(requests):
        where = f"spec.devices.requests[{number}]"
        exactly = request.get("exactly")
        if exactly is None:
            raise DraError(f"{where}.firstAvailable", "not supported by gputopo's binder")
        if exactly.get("deviceClassName") not in classes:
            raise DraError(
                f"{where}.exactly.deviceClassName",
                f"{exactly.get('deviceClassName')!r} is not a GPU class ({', '.join(classes)})",
            )
        if exactly.get("adminAccess"):
            raise DraError(f"{where}.exactly.adminAccess", "not a GPU for a workload")
        mode = exactly.get("allocationMode") or "ExactCount"
        count = len(left) if mode == "All" else int(exactly.get("count") or 1)
        if count > len(left) or count < 1:
            raise DraError(
                f"{where}.exactly.count",
                f"{count} GPUs asked, {len(left)} of the {len(gpus)} chosen left",
            )
        for uuid in left[:count]:
            device = devices.get(uuid.lower())
            if device is None:
                raise DraError(
                    f"ResourceSlice of {node}",
                    f"no {GPU_DRIVER} device with uuid {uuid} (is the driver running there?)",
                )
            results.append(
                {
                    "request": str(request.get("name", "")),
                    "driver": device.driver,
                    "pool": device.pool,
                    "device": device.device,
                }
            )
        left = left[count:]
    stamp = (now or dt.datetime.now(tz=dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    status["allocation"] = {
        "devices": {"results": results},
        "nodeSelector": {"nodeSelectorTerms": [selector]},
        "allocationTimestamp": stamp,
    }
    status["reservedFor"] = _reserved(status, pod)
    return status, left


async def allocate_recorded(
    kube: KubeClient, pod: Mapping[str, Any], *, driver: str = GPU_DRIVER
) -> list[str]:
    """Allocate the claims of a recorded pod to its recorded GPUs (see the module docstring);
    the claims written, `namespace/name`. A pod without claims costs nothing (no API call).
    Raises DraError (nothing written for the failing claim) or KubeError (a conflict: a claim
    changed meanwhile; the binder's next pass tries again)."""
    names = claim_names(pod)
    if not names:
        return []
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    node = str(annotations.get(_NODE, ""))
    gpus = [u for u in str(annotations.get(_UUIDS, "")).split(",") if u]
    if not node or not gpus:
        raise DraError(f"metadata.annotations[{_UUIDS}]", "the record names no GPU UUIDs")
    namespace = str(meta.get("namespace", ""))
    slices, _ = await kube.list_all(f"{DRA_API}/resourceslices")
    devices = slice_devices(slices, node=node, driver=driver)
    written = []
    for name in names:
        path = f"{DRA_API}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        claim = await kube.request("GET", path)
        status, gpus = claim_status(claim, pod=pod, node=node, gpus=gpus, devices=devices)
        await kube.request("PUT", f"{path}/status", body={**claim, "status": status})
        written.append(f"{namespace}/{name}")
    return written
