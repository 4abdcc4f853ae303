"""Which GPUs of this node are held, and by whom, as the kubelet says: its PodResources API.

A placement engine that does not know what is in use places on a cluster it imagines. Pods that
any scheduler bound hold GPUs the kubelet handed them; the kubelet tells which on its
pod-resources socket (`List`: every container's devices; `GetAllocatableResources`: every device
it can hand out). This module reads both and maps device IDs to this node's GPU indices:

1. Device plugins: every resource named `nvidia.com/gpu`, `nvidia.com/gpu.shared` (time-slicing
   with `renameByDefault`) or `nvidia.com/mig-*` (MIG, mixed strategy), and any other name in
   `resources`. NVIDIA's plugin names
   - a GPU by its UUID (`GPU-...`, matched to NVML's), or by its index (`deviceIDStrategy=index`);
   - a time-slicing replica `GPU-<uuid>::<n>` (or `<index>::<n>`): the GPU is held while any
     replica is;
   - a MIG device by its UUID: `MIG-GPU-<parent uuid>/<gi>/<ci>` (drivers before R470) names its
     GPU; `MIG-<uuid>` is found in `mig_parents` (NVML's MIG devices of each GPU). With the
     single strategy these come as `nvidia.com/gpu`. A GPU one of whose MIG slices is held is
     held: it cannot be handed out whole.
   A GPU the kubelet offers (`GetAllocatableResources`) only as slices or replicas is held too,
   by its partition (a holder with no pod, `via` saying which), even while no pod holds a piece.
2. DRA ResourceClaims (`dynamic_resources`): a device of a GPU driver (`drivers`) named `gpu-N`,
   as NVIDIA's DRA driver names whole GPUs. N is the device's minor number, not its NVML index,
   so it is mapped through `dra_minors` (minor -> index) when given, and taken as the index only
   on a node whose minors and indices agree (the default map).
3. Anything else stays `unmapped`, counted, never guessed.

It never raises for the kubelet's sake: no socket, a socket it may not open (the kubelet keeps
its directory root-only, 0750: run the exporter as root, as dcgm-exporter does), a kubelet that
does not answer or an older one without `GetAllocatableResources` each give a reading that says
so (`reason`, `allocatable=None`), and the exporter keeps reporting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import grpc

from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.runtime.grpcio import channel
from gputopo.topology import NodeTopology
from gputopo.v1 import podresources_pb2 as pb
from gputopo.v1 import podresources_pb2_grpc as pb_grpc

__all__ = ["DEFAULT_SOCKET", "PodResourcesReader"]

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_DRIVERS = ("gpu.nvidia.com",)
_DRA_GPU = re.compile(r"^gpu-(\d+)$")
_REPLICA = re.compile(r"^(.+)::\d+$")
_OLD_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$")


class PodResourcesReader:
    """Reads the kubelet's PodResources API on a unix socket (see the module docstring)."""

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        *,
        resources: Iterable[str] = GPU_RESOURCES,
        drivers: Iterable[str] = GPU_DRIVERS,
        timeout_s: float = 5.0,
        mig_parents: Callable[[], Mapping[str, int]] = dict,
        dra_minors: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.resources = frozenset(resources)
        self.drivers = frozenset(drivers)
        self.timeout_s = timeout_s
        self.mig_parents = mig_parents
        self.dra_minors = dra_minors

    def _counted(self, resource: str) -> bool:
        return resource in self.resources or resource.startswith(MIG_RESOURCE_PREFIX)

    async def read(self, topology: NodeTopology) -> GpuUse:
        """Ask the kubelet once; map what it says onto `topology`'s GPUs."""
        try:
            present = self.socket_path.exists()
        except PermissionError:  # the kubelet's directory is 0750 root
            return GpuUse(
                reason=f"no permission to open {self.socket_path} (uid {os.geteuid()}): the "
                "kubelet keeps its pod-resources directory root-only; run the exporter as "
                "root (runAsUser: 0), as dcgm-exporter does"
            )
        if not present:
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
            # grpc reports a socket it may not connect to as UNAVAILABLE with the errno in
            # its details; permission is caught above, on the directory, where it bites.
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
        index = _Index(
            topology,
            self.mig_parents(),
            self.dra_minors() if self.dra_minors is not None else None,
        )
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
            offered = [
                (devs.resource_name, d)
                for devs in allocatable.devices
                if self._counted(devs.resource_name)
                for d in devs.device_ids
            ]
            whole = [d for _, d in offered if not index.is_slice(d) and not index.is_replica(d)]
            can = frozenset(i for i in (index.of(d) for d in whole) if i is not None)
            # A GPU the kubelet hands out in MIG slices or time-slicing replicas is not free for
            # a whole-GPU placement even while no pod holds a piece of it.
            for resource, device in offered:
                found = index.of(device)
                if found is None or found in held or found in can:
                    continue
                kind = "mig partition" if index.is_slice(device) else "time-slicing"
                if index.is_slice(device) or index.is_replica(device):
                    held[found] = GpuHolder("", "", "", f"{kind} ({resource})")
        return GpuUse(held=held, allocatable=can, unmapped=tuple(unmapped))

    def _devices(self, container: pb.ContainerResources) -> list[tuple[str, str]]:
        found = [
            (device, devices.resource_name)
            for devices in container.devices
            if self._counted(devices.resource_name)
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
    """Device IDs -> GPU index (see the module docstring, steps 1 and 2)."""

    def __init__(
        self,
        topology: NodeTopology,
        mig_parents: Mapping[str, int],
        dra_minors: Mapping[int, int] | None,
    ) -> None:
        self._by_uuid = {g.uuid.lower(): g.index for g in topology.gpus if g.uuid}
        self._mig = {uuid.lower(): index for uuid, index in mig_parents.items()}
        self._count = topology.gpu_count
        self._minors = dra_minors

    def is_slice(self, device: str) -> bool:
        return device.upper().startswith("MIG-")

    def is_replica(self, device: str) -> bool:
        return _REPLICA.match(device) is not None

    def of(self, device: str) -> int | None:
        if device.startswith("dra:"):
            match = _DRA_GPU.match(device.removeprefix("dra:"))
            if match is None:
                return None
            minor = int(match[1])
            if self._minors is not None:
                return self._minors.get(minor)
            return self._in_range(minor)
        replica = _REPLICA.match(device)
        if replica is not None:
            device = replica[1]
        old_mig = _OLD_MIG.match(device)
        if old_mig is not None:
            return self._by_uuid.get(old_mig[1].lower())
        if self.is_slice(device):
            return self._mig.get(device.lower())
        if device.isdigit():
            return self._in_range(int(device))
        return self._by_uuid.get(device.lower())

    def _in_range(self, index: int) -> int | None:
        return index if 0 <= index < self._count else None
