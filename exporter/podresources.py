"""Which GPUs of this node are held, and by whom, as the kubelet says: its PodResources API.

A placement engine that does not know what is in use places on a cluster it imagines. Pods that
any scheduler bound hold GPUs the kubelet handed them; the kubelet tells which on its
pod-resources socket (`List`: every container's devices; `GetAllocatableResources`: every device
it can hand out). This module reads both and maps device IDs to this node's GPU indices:

1. Device plugins (`nvidia.com/gpu` and other GPU resources named in `resources`): NVIDIA's plugin
   names a GPU by its UUID (`GPU-...`, matched to NVML's), or by its index with
   `deviceIDStrategy=index`.
2. DRA ResourceClaims (`dynamic_resources`): a device of a GPU driver (`drivers`) named `gpu-N`,
   as NVIDIA's DRA driver names whole GPUs, is GPU N.
3. Anything else (MIG devices, other drivers' names) stays `unmapped`, counted, never guessed.

It never raises for the kubelet's sake: no socket, a kubelet that does not answer or an older one
without `GetAllocatableResources` each give a reading that says so (`reason`,
`allocatable=None`), and the exporter keeps reporting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import grpc

from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.runtime.grpcio import channel
from gputopo.topology import NodeTopology
from gputopo.v1 import podresources_pb2 as pb
from gputopo.v1 import podresources_pb2_grpc as pb_grpc

__all__ = ["DEFAULT_SOCKET", "PodResourcesReader"]

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES = ("nvidia.com/gpu",)
GPU_DRIVERS = ("gpu.nvidia.com",)
_DRA_GPU = re.compile(r"^gpu-(\d+)$")


class PodResourcesReader:
    """Reads the kubelet's PodResources API on a unix socket (see the module docstring)."""

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        *,
        resources: Iterable[str] = GPU_RESOURCES,
        drivers: Iterable[str] = GPU_DRIVERS,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = socket_path
        self.resources = frozenset(resources)
        self.drivers = frozenset(drivers)
        self.timeout_s = timeout_s

    async def read(self, topology: NodeTopology) -> GpuUse:
        """Ask the kubelet once; map what it says onto `topology`'s GPUs."""
        if not self.socket_path.exists():
            return GpuUse(
                reason=f"kubelet pod-resources socket {self.socket_path} not found "
                "(mount /var/lib/kubelet/pod-resources into the exporter, read-only)"
            )
        async with channel(f"unix://{self.socket_path}") as chan:
            stub = pb_grpc.PodResourcesListerStub(chan)
            try:
                listed = await stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as error:
                return GpuUse(reason=f"kubelet List: {error.code().name}: {error.details()}")
            try:
                allocatable: (
                    pb.AllocatableResourcesResponse | None
                ) = await stub.GetAllocatableResources(
                    pb.AllocatableResourcesRequest(), timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError:
                allocatable = None  # an older kubelet, or its feature gate off
        return self.use(topology, listed, allocatable)

    def use(
        self,
        topology: NodeTopology,
        listed: pb.ListPodResourcesResponse,
        allocatable: pb.AllocatableResourcesResponse | None,
    ) -> GpuUse:
        """The pure part: kubelet messages -> GPU indices of this node."""
        index = _Index(topology)
        held: dict[int, GpuHolder] = {}
        unmapped: list[str] = []
        for pod in listed.pod_resources:
            for container in pod.containers:
                for device, via in self._devices(container):
                    found = index.of(device)
                    holder = GpuHolder(pod.namespace, pod.name, container.name, via)
                    if found is None:
                        unmapped.append(f"{pod.namespace}/{pod.name}/{container.name}: {device}")
                    else:
                        held[found] = holder
        can = None
        if allocatable is not None:
            ids = [
                d
                for devs in allocatable.devices
                if devs.resource_name in self.resources
                for d in devs.device_ids
            ]
            can = frozenset(i for i in (index.of(d) for d in ids) if i is not None)
        return GpuUse(held=held, allocatable=can, unmapped=tuple(unmapped))

    def _devices(self, container: pb.ContainerResources) -> list[tuple[str, str]]:
        found = [
            (device, devices.resource_name)
            for devices in container.devices
            if devices.resource_name in self.resources
            for device in devices.device_ids
        ]
        found += [
            (f"dra:{claim.device_name}", f"claim {dynamic.claim_namespace}/{dynamic.claim_name}")
            for dynamic in container.dynamic_resources
            for claim in dynamic.claim_resources
            if claim.driver_name in self.drivers
        ]
        return found


class _Index:
    """Device IDs -> GPU index: UUID, plain index, or a DRA device named gpu-N."""

    def __init__(self, topology: NodeTopology) -> None:
        self._by_uuid = {g.uuid.lower(): g.index for g in topology.gpus if g.uuid}
        self._count = topology.gpu_count

    def of(self, device: str) -> int | None:
        if device.startswith("dra:"):
            match = _DRA_GPU.match(device.removeprefix("dra:"))
            return self._in_range(int(match[1])) if match else None
        if device.isdigit():
            return self._in_range(int(device))
        return self._by_uuid.get(device.lower())

    def _in_range(self, index: int) -> int | None:
        return index if 0 <= index < self._count else None
