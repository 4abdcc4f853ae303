"""A kubelet device plugin that hands each pod the GPUs gputopo recorded for it.

gputopo decides which GPUs of a node a pod should get (`gputopo.io/gpus`), but the kubelet's
device manager picks them: with NVIDIA's plugin, by NVIDIA's policy, which knows nothing of the
gang around the pod. This plugin serves the kubelet's v1beta1 device-plugin API
(`proto/gputopo/v1/deviceplugin.proto`) for one resource name and answers
`GetPreferredAllocation` with the recorded GPUs (`exporter.admission` says how it finds the pod),
so the kubelet's own allocation, its checkpoint and PodResources, are what the binder recorded.

1. **Serve and register**: the plugin listens on a unix socket in the kubelet's device-plugins
   directory and calls `Registration.Register` on `kubelet.sock` there.
2. **Re-register**: a restarting kubelet deletes every socket in that directory and makes a new
   `kubelet.sock`; the plugin notices (its own socket gone, or `kubelet.sock` a new file),
   serves again and registers again. Until the kubelet answers it retries with backoff.
3. **List and watch**: every GPU of the node, named by UUID (or index), with its NUMA node and
   its health. A GPU is unhealthy when NVML reported a critical XID error for it (the agent
   watches `exporter.nvml.XidEvents` and calls `mark_unhealthy`) or discovery found it down; the
   kubelet then stops handing it out. Every change sends the whole
   list again.
4. **Prefer**: `exporter.admission.prefer` over the pods bound to this node (from the API server)
   and what the kubelet already allocated (from PodResources).
5. **Allocate**: as NVIDIA's plugin answers (NVIDIA/k8s-device-plugin, internal/plugin/server.go
   `getAllocateResponse`): `NVIDIA_VISIBLE_DEVICES` with the IDs (strategy `envvar`), and/or the
   CDI device names (`cdi-cri`), and the device nodes when `pass_device_specs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from exporter.admission import DeviceIds, best_devices, pending_pods, prefer
from gputopo.links import LinkHealth
from gputopo.runtime.backoff import Backoff
from gputopo.runtime.grpcio import channel, server
from gputopo.runtime.kube_errors import KubeError
from gputopo.topology import NodeTopology
from gputopo.v1 import deviceplugin_pb2 as pb
from gputopo.v1 import deviceplugin_pb2_grpc as pb_grpc
from gputopo.v1 import podresources_pb2 as pr
from gputopo.v1 import podresources_pb2_grpc as pr_grpc

if TYPE_CHECKING:
    # Not at run time: the kubernetes client costs an agent ~20 MiB of RSS, and only an agent
    # that lists pods (`node_pods`, given a KubeClient made elsewhere) needs it.
    from gputopo.runtime.kube import KubeClient

__all__ = [
    "DEFAULT_DIR",
    "DevicePlugin",
    "DevicePluginConfig",
    "DevicePluginStats",
    "allocate_response",
    "driver_minors",
    "kubelet_allocations",
    "node_pods",
]

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"

PodLister = Callable[[], Awaitable[Sequence[Mapping[str, Any]]]]
AllocatedReader = Callable[[], Awaitable[Mapping[str, int]]]


@dataclass(frozen=True, slots=True)
class DevicePluginConfig:
    """What the plugin serves and where.

    `resource_name` is `nvidia.com/gpu` where it replaces NVIDIA's plugin (which must then be
    off: the GPU operator's `devicePlugin.enabled=false`), else a name of its own.
    `list_strategies`: `envvar` and/or `cdi-cri`, as NVIDIA's `deviceListStrategy`.
    """

    node_name: str
    resource_name: str = "nvidia.com/gpu"
    directory: Path = DEFAULT_DIR
    endpoint: str = "gputopo-gpu.sock"
    id_strategy: str = "uuid"
    list_strategies: tuple[str, ...] = ("envvar",)
    visible_devices_env: str = "NVIDIA_VISIBLE_DEVICES"
    cdi_kind: str = "k8s.device-plugin.nvidia.com/gpu"
    pass_device_specs: bool = False
    driver_root: Path = Path("/")
    watch_interval_s: float = 1.0
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        for strategy in self.list_strategies:
            if strategy not in ("envvar", "cdi-cri"):
                raise ValueError(f"device list strategy: {strategy!r} is not envvar or cdi-cri")
        if self.id_strategy not in ("uuid", "index"):
            raise ValueError(f"device id strategy: {self.id_strategy!r} is not uuid or index")
        if "/" in self.endpoint:
            raise ValueError(f"endpoint: {self.endpoint!r} must be a file name in the directory")


def allocate_response(
    devices: Sequence[str],
    *,
    config: DevicePluginConfig,
    minors: Mapping[str, int],
    exists: Callable[[str], bool] = os.path.exists,
) -> pb.ContainerAllocateResponse:
    """One container's answer to `Allocate` (step 5): env and/or CDI names, device nodes.
    `minors` maps device IDs to the driver's minor numbers (`/dev/nvidia<minor>`)."""
    response = pb.ContainerAllocateResponse()
    if "envvar" in config.list_strategies:
        response.envs[config.visible_devices_env] = ",".join(devices)
    if "cdi-cri" in config.list_strategies:
        response.cdi_devices.extend(pb.CDIDevice(name=f"{config.cdi_kind}={d}") for d in devices)
    if config.pass_device_specs:
        paths = [f"/dev/nvidia{minors[d]}" for d in devices if d in minors]
        # The control devices, where the driver made them (NVIDIA's plugin marks them optional).
        paths += [
            p
            for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
            if exists(str(config.driver_root / p.lstrip("/")))
        ]
        response.devices.extend(
            pb.DeviceSpec(
                container_path=p,
                host_path=str(config.driver_root / p.lstrip("/")),
                permissions="rw",
            )
            for p in paths
        )
    return response


@dataclass(slots=True)
class DevicePluginStats:
    """What the plugin did, for metrics."""

    resource: str
    registrations: int = 0
    preferred: Counter[str] = field(default_factory=Counter)  # record, best, race
    allocations: int = 0


class DevicePlugin(pb_grpc.DevicePluginServicer):
    """The plugin for one resource of one node (see the module docstring)."""

    def __init__(
        self,
        config: DevicePluginConfig,
        topology: Callable[[], NodeTopology],
        *,
        pods: PodLister,
        allocated: AllocatedReader,
        proc: Path = Path("/proc"),
    ) -> None:
        self.config = config
        self._topology = topology
        self._pods = pods
        self._allocated = allocated
        self._proc = proc
        self._unhealthy: dict[str, str] = {}  # device ID -> why
        self._changed = asyncio.Condition()
        self._version = 0
        self._server: grpc.aio.Server | None = None
        self._kubelet_id: tuple[int, int] | None = None
        self.stats = DevicePluginStats(config.resource_name)
        self._rng = random.Random()
        self.registered = asyncio.Event()

    @property
    def socket_path(self) -> Path:
        return self.config.directory / self.config.endpoint

    def ids(self) -> DeviceIds:
        return DeviceIds.of(self._topology(), strategy=self.config.id_strategy)

    # --- health ------------------------------------------------------------------------------

    async def mark_unhealthy(self, gpu: int, reason: str) -> None:
        """Take a GPU out of the advertised healthy set (an XID error, say) until `mark_healthy`."""
        device = self.ids().by_index.get(gpu)
        if device is not None and self._unhealthy.get(device) != reason:
            log.warning("GPU %d (%s) unhealthy: %s", gpu, device, reason)
            self._unhealthy[device] = reason
            await self.devices_changed()

    async def mark_healthy(self, gpu: int) -> None:
        device = self.ids().by_index.get(gpu)
        if device is not None and self._unhealthy.pop(device, None) is not None:
            await self.devices_changed()

    async def devices_changed(self) -> None:
        """Send the device list again (discovery changed, or a GPU's health)."""
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    def _newer(self, sent: int) -> bool:
        return self._version != sent

    def device_list(self) -> pb.ListAndWatchResponse:
        topology = self._topology()
        ids = self.ids()
        response = pb.ListAndWatchResponse()
        for gpu in topology.gpus:
            device = ids.by_index[gpu.index]
            healthy = device not in self._unhealthy and gpu.health != LinkHealth.DOWN
            entry = pb.Device(ID=device, health=HEALTHY if healthy else UNHEALTHY)
            if gpu.numa_node is not None and gpu.numa_node >= 0:
                entry.topology.nodes.append(pb.NUMANode(ID=gpu.numa_node))
            response.devices.append(entry)
        return response

    def _healthy(self) -> frozenset[str]:
        return frozenset(d.ID for d in self.device_list().devices if d.health == HEALTHY)

    # --- the kubelet's calls -------------------------------------------------------------------

    async def GetDevicePluginOptions(  # noqa: N802 - the API's names
        self, request: pb.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        sent = -1
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._newer, sent))
                sent = self._version
            yield self.device_list()

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreferredAllocationResponse:
        ids = self.ids()
        healthy = self._healthy()
        try:
            pods, allocated = await asyncio.gather(self._pods(), self._allocated())
        except Exception as err:
            if not _pods_unknown(err):
                raise
            # An error here would fail the pod's admission in the kubelet; the best set of the
            # free GPUs is a better answer, and the mismatch check will see what came of it.
            log.warning("cannot tell which pod is admitted (%s): answering the best set", err)
            pods, allocated = [], {}
        pending = pending_pods(
            pods,
            node=self.config.node_name,
            resource=self.config.resource_name,
            ids=ids,
            allocated=allocated,
        )
        best = best_devices(self._topology(), ids)
        response = pb.PreferredAllocationResponse()
        for ask in request.container_requests:
            available = [d for d in ask.available_deviceIDs if d in healthy]
            chosen = prefer(
                available=available,
                must_include=list(ask.must_include_deviceIDs),
                size=ask.allocation_size,
                pending=pending,
                best=best,
            )
            if chosen.rivals:
                self.stats.preferred["race"] += 1
                log.warning(
                    "%d GPUs asked for: answered %s's record; %s also fit (a race: "
                    "PodResources will tell which pod got them)",
                    ask.allocation_size,
                    chosen.pod,
                    ", ".join(chosen.rivals),
                )
            self.stats.preferred["record" if chosen.pod else "best"] += 1
            response.container_responses.append(
                pb.ContainerPreferredAllocationResponse(deviceIDs=list(chosen.devices))
            )
        return response

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AllocateResponse:
        ids = self.ids()
        known = set(ids.by_index.values())
        minors = (
            driver_minors(self._topology(), ids, proc=self._proc)
            if self.config.pass_device_specs
            else {}
        )
        response = pb.AllocateResponse()
        for ask in request.container_requests:
            unknown = [d for d in ask.devices_ids if d not in known]
            if unknown:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"devices_ids: unknown device(s) {', '.join(unknown)} of "
                    f"{self.config.resource_name}",
                )
            response.container_responses.append(
                allocate_response(list(ask.devices_ids), config=self.config, minors=minors)
            )
            self.stats.allocations += 1
        return response

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # --- serving and registering ---------------------------------------------------------------

    async def _serve(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        srv = server()
        pb_grpc.add_DevicePluginServicer_to_server(self, srv)
        srv.add_insecure_port(f"unix://{self.socket_path}")
        await srv.start()
        self._server = srv

    def _kubelet_file(self) -> tuple[int, int] | None:
        try:
            st = (self.config.directory / KUBELET_SOCKET).stat()
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def _register(self) -> None:
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.config.endpoint,
            resource_name=self.config.resource_name,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        async with channel(f"unix://{self.config.directory / KUBELET_SOCKET}") as chan:
            await pb_grpc.RegistrationStub(chan).Register(request, timeout=5.0)
        self.stats.registrations += 1
        self.registered.set()
        log.info("registered %s with the kubelet", self.config.resource_name)

    async def run(self) -> None:
        """Serve, register, and serve and register again whenever the kubelet restarts."""
        failures = 0
        try:
            while True:
                kubelet = self._kubelet_file()
                lost = not self.socket_path.exists()
                if kubelet is not None and (kubelet != self._kubelet_id or lost):
                    self.registered.clear()
                    try:
                        await self._serve()
                        await self._register()
                        self._kubelet_id, failures = kubelet, 0
                    except (grpc.aio.AioRpcError, OSError, RuntimeError) as err:
                        failures += 1
                        log.warning("registering with the kubelet failed: %s", err)
                        await asyncio.sleep(self.config.backoff.delay(failures, self._rng))
                        continue
                await asyncio.sleep(self.config.watch_interval_s)
        finally:
            if self._server is not None:
                await self._server.stop(grace=1.0)
                self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()


def kubelet_allocations(
    socket_path: Path, resource: str, *, timeout_s: float = 5.0
) -> AllocatedReader:
    """How many devices of `resource` each pod holds, as the kubelet's PodResources `List`
    says (`namespace/name` -> count): the pods the kubelet has admitted already."""

    async def read() -> Mapping[str, int]:
        async with channel(f"unix://{socket_path}") as chan:
            listed = await pr_grpc.PodResourcesListerStub(chan).List(
                pr.ListPodResourcesRequest(), timeout=timeout_s
            )
        held: Counter[str] = Counter()
        for pod in listed.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if devices.resource_name == resource:
                        held[f"{pod.namespace}/{pod.name}"] += len(devices.device_ids)
        return held

    return read


def _pods_unknown(err: Exception) -> bool:
    """An error that means "the pods cannot be listed now": the API server's, the kubelet's or
    the network's."""
    return isinstance(err, KubeError | grpc.aio.AioRpcError | OSError)


def node_pods(kube: KubeClient, node: str) -> PodLister:
    """The pods bound to `node`, from the API server (RBAC: list pods; the field selector keeps
    the answer to this node's pods)."""
    query = {"fieldSelector": f"spec.nodeName={node}"}

    async def pods() -> Sequence[Mapping[str, Any]]:
        items, _ = await kube.list_all("/api/v1/pods", query=query)
        return items

    return pods


def driver_minors(
    topology: NodeTopology, ids: DeviceIds, *, proc: Path = Path("/proc")
) -> dict[str, int]:
    """Device ID -> the driver's minor number (`/dev/nvidia<minor>`), from
    `<proc>/driver/nvidia/gpus/<bus id>/information` ("Device Minor:"); the minor is not the
    NVML index on every machine. GPUs without the file are left out (no device node passed)."""
    by_bus = {g.pci_bus_id.lower()[-12:]: g.index for g in topology.gpus if g.pci_bus_id}
    found: dict[str, int] = {}
    for info in sorted((proc / "driver" / "nvidia" / "gpus").glob("*/information")):
        index = by_bus.get(info.parent.name.lower()[-12:])
        if index is None:
            continue
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and value.strip().isdigit():
                found[ids.by_index[index]] = int(value.strip())
    return found
