"""The kubelet's device manager and PodResources API, played over the real protocols.

A device plugin is tested against what the kubelet does, on real unix sockets:

1. it serves `Registration` on `<dir>/kubelet.sock`; a plugin that registers is dialled on its
   own socket, asked its options, and its `ListAndWatch` stream is followed;
2. `admit(pod, requests)` allocates a pod as the kubelet's device manager does: per container,
   the healthy devices not yet allocated are `available`; it asks `GetPreferredAllocation`
   when the plugin offers it and takes the answer when it is valid (the right size, all
   available, the must-include ones in it), else the first available ones; then `Allocate`;
3. it serves `PodResourcesLister.List` on another socket with what it allocated, as the kubelet
   does (pods with their containers' device IDs);
4. `restart()` does what a restarting kubelet does to the directory: stops, deletes every socket
   in it (the plugin's too), and serves a new `kubelet.sock`; a plugin must register again.

What it leaves out: checkpoints, NUMA alignment (the topology manager), pod lifecycle beyond
`release`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gputopo.v1 import deviceplugin_pb2 as dp
from gputopo.v1 import deviceplugin_pb2_grpc as dp_grpc
from gputopo.v1 import podresources_pb2 as pr
from gputopo.v1 import podresources_pb2_grpc as pr_grpc

__all__ = ["Admission", "FakeKubelet"]


@dataclass(frozen=True, slots=True)
class Admission:
    """What the kubelet did for one container."""

    container: str
    available: tuple[str, ...]
    preferred: tuple[str, ...] | None  # None: not asked, or an invalid answer
    allocated: tuple[str, ...]
    response: dp.ContainerAllocateResponse


@dataclass(slots=True)
class _Plugin:
    resource: str
    endpoint: str
    options: dp.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: dp_grpc.DevicePluginAsyncStub
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)  # ID -> NUMA nodes
    updates: int = 0
    task: asyncio.Task[None] | None = None


class FakeKubelet(dp_grpc.RegistrationServicer, pr_grpc.PodResourcesListerServicer):
    """See the module docstring. Use `async with`."""

    def __init__(self, directory: Path, pod_resources: Path) -> None:
        self.directory = directory
        self.pod_resources_socket = pod_resources
        self.plugins: dict[str, _Plugin] = {}
        self.registrations = 0
        self.updated = asyncio.Condition()
        # namespace/name -> container -> resource -> device IDs
        self.allocations: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
        self._registration: grpc.aio.Server | None = None
        self._lister: grpc.aio.Server | None = None

    async def __aenter__(self) -> FakeKubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        await self._start_registration()
        self._lister = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(self, self._lister)
        self._lister.add_insecure_port(f"unix://{self.pod_resources_socket}")
        await self._lister.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._drop_plugins()
        for srv in (self._registration, self._lister):
            if srv is not None:
                await srv.stop(grace=None)

    async def _start_registration(self) -> None:
        self._registration = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, self._registration)
        self._registration.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        await self._registration.start()

    async def _drop_plugins(self) -> None:
        for plugin in self.plugins.values():
            if plugin.task is not None:
                plugin.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await plugin.task
            await plugin.channel.close()
        self.plugins.clear()

    async def restart(self) -> list[Path]:
        """Stop, delete every socket in the directory, serve a new kubelet.sock; returns the
        sockets it deleted."""
        await self._drop_plugins()
        if self._registration is not None:
            await self._registration.stop(grace=None)
        removed = [path for path in self.directory.iterdir() if path.is_socket()]
        for path in removed:
            path.unlink()
        await self._start_registration()
        return removed

    # --- Registration --------------------------------------------------------------------------

    async def Register(  # noqa: N802 - the API's names
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        old = self.plugins.pop(request.resource_name, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        chan = grpc.aio.insecure_channel(f"unix://{self.directory / request.endpoint}")
        stub = dp_grpc.DevicePluginStub(chan)
        options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=5.0)
        plugin = _Plugin(request.resource_name, request.endpoint, options, chan, stub)
        plugin.task = asyncio.create_task(self._follow(plugin))
        self.plugins[request.resource_name] = plugin
        self.registrations += 1
        return dp.Empty()

    async def _follow(self, plugin: _Plugin) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for listed in plugin.stub.ListAndWatch(dp.Empty()):
                plugin.devices = {d.ID: d.health for d in listed.devices}
                plugin.numa = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in listed.devices}
                plugin.updates += 1
                async with self.updated:
                    self.updated.notify_all()

    async def wait_for(self, resource: str, *, updates: int = 1, timeout_s: float = 10.0) -> None:
        """Until `resource` is registered and its list arrived `updates` times."""

        def ready() -> bool:
            plugin = self.plugins.get(resource)
            return plugin is not None and plugin.updates >= updates

        async with self.updated:
            await asyncio.wait_for(self.updated.wait_for(ready), timeout_s)

    # --- the device manager --------------------------------------------------------------------

    def healthy(self, resource: str) -> list[str]:
        return sorted(d for d, h in self.plugins[resource].devices.items() if h == "Healthy")

    def in_use(self, resource: str) -> set[str]:
        return {
            d
            for containers in self.allocations.values()
            for by_resource in containers.values()
            for d in by_resource.get(resource, ())
        }

    async def admit(
        self, pod: str, requests: Sequence[int], *, resource: str = "nvidia.com/gpu"
    ) -> list[Admission]:
        """Allocate every container of `pod` (`namespace/name`) that asks for `resource`."""
        plugin = self.plugins[resource]
        done = []
        for number, size in enumerate(requests):
            container = f"c{number}"
            available = [d for d in self.healthy(resource) if d not in self.in_use(resource)]
            if len(available) < size:
                raise RuntimeError(f"{pod}: {size} {resource} asked, {len(available)} left")
            preferred: tuple[str, ...] | None = None
            chosen = available[:size]
            if plugin.options.get_preferred_allocation_available:
                answer = await plugin.stub.GetPreferredAllocation(
                    dp.PreferredAllocationRequest(
                        container_requests=[
                            dp.ContainerPreferredAllocationRequest(
                                available_deviceIDs=available, allocation_size=size
                            )
                        ]
                    ),
                    timeout=10.0,
                )
                ids = tuple(answer.container_responses[0].deviceIDs)
                if len(set(ids)) == size and set(ids) <= set(available):
                    preferred, chosen = ids, list(ids)
            response = await plugin.stub.Allocate(
                dp.AllocateRequest(
                    container_requests=[dp.ContainerAllocateRequest(devices_ids=chosen)]
                ),
                timeout=10.0,
            )
            self.allocations.setdefault(pod, {}).setdefault(container, {})[resource] = tuple(chosen)
            done.append(
                Admission(
                    container,
                    tuple(available),
                    preferred,
                    tuple(chosen),
                    response.container_responses[0],
                )
            )
        return done

    def release(self, pod: str) -> None:
        """The pod ended: its devices are free again."""
        self.allocations.pop(pod, None)

    # --- PodResources --------------------------------------------------------------------------

    async def List(  # noqa: N802
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pr.ListPodResourcesResponse:
        response = pr.ListPodResourcesResponse()
        for pod, containers in sorted(self.allocations.items()):
            namespace, name = pod.split("/", 1)
            entry = response.pod_resources.add(name=name, namespace=namespace)
            for container, by_resource in containers.items():
                c = entry.containers.add(name=container)
                for resource, ids in by_resource.items():
                    c.devices.add(resource_name=resource, device_ids=list(ids))
        return response

    async def GetAllocatableResources(  # noqa: N802
        self, request: pr.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pr.AllocatableResourcesResponse:
        response = pr.AllocatableResourcesResponse()
        for resource, plugin in self.plugins.items():
            response.devices.add(resource_name=resource, device_ids=sorted(plugin.devices))
        return response
