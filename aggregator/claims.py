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
3. NVIDIA's DRA driver names a whole GPU `gpu-N` and a partition of it `gpu-N-...` (a MIG
   slice): either way GPU N is not free for a whole-GPU placement (`whole` says which). Other
   names of a GPU driver's devices are kept with `gpu=None`: in use, not located.

The test API server (1.20) does not serve `resource.k8s.io/v1`; this reader is tested on recorded
objects written to those types (`tests/data/dra/`). It is pure: objects in, claimed GPUs out.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GPU_DRIVERS", "ClaimedDevice", "claimed_devices"]

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


def claimed_devices(
    claims: Iterable[Mapping[str, Any]],
    *,
    nodes: Collection[str] | None = None,
    drivers: Collection[str] = GPU_DRIVERS,
) -> list[ClaimedDevice]:
    """Every device of a GPU driver that an allocated claim holds: on the node its selector
    names, else on the node its pool is named after; only on `nodes` when given."""
    found = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        selected = _selected_node(allocation.get("nodeSelector") or {})
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") not in drivers:
                continue
            pool, device = str(result.get("pool", "")), str(result.get("device", ""))
            node = selected or pool
            if not node or (nodes is not None and node not in nodes):
                continue
            gpu = _GPU.match(device)
            if gpu is None:
                found.append(ClaimedDevice(node, None, device, name, whole=False))
            else:
                found.append(ClaimedDevice(node, int(gpu[1]), device, name, whole=not gpu[2]))
    return sorted(found)


def _selected_node(selector: Mapping[str, Any]) -> str:
    """The node a node selector names with `metadata.name In [node]`, or ""."""
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            values = field.get("values") or []
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and values:
                return str(values[0])
    return ""
