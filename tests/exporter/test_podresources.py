"""The kubelet's PodResources API, spoken by a real gRPC server on a unix socket."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from exporter.fake_machine import FakeMachine
from exporter.podresources import PodResourcesReader
from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.topology import NodeTopology
from gputopo.v1 import podresources_pb2 as pb
from gputopo.v1 import podresources_pb2_grpc as pb_grpc
from tests.exporter.conftest import FakeNode
from tests.exporter.test_agent import fake_agent, until


@pytest.fixture(scope="module")
def dgx() -> NodeTopology:
    return FakeMachine.from_profile("dgx-h100", node_name="h100-01").topology


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # A unix socket path has a length limit (108 bytes): tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="pr-") as root:
        yield Path(root) / "kubelet.sock"


class Kubelet(pb_grpc.PodResourcesListerServicer):
    """What a kubelet with NVIDIA's device plugin and DRA driver answers."""

    def __init__(
        self,
        listed: pb.ListPodResourcesResponse,
        allocatable: pb.AllocatableResourcesResponse | None,
    ) -> None:
        self.listed = listed
        self.allocatable = allocatable

    async def List(  # noqa: N802 - the kubelet's method name
        self,
        request: pb.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[pb.ListPodResourcesRequest, pb.ListPodResourcesResponse],
    ) -> pb.ListPodResourcesResponse:
        return self.listed

    async def GetAllocatableResources(  # noqa: N802
        self,
        request: pb.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[
            pb.AllocatableResourcesRequest, pb.AllocatableResourcesResponse
        ],
    ) -> pb.AllocatableResourcesResponse:
        if self.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "feature gate off")
        assert self.allocatable is not None
        return self.allocatable


def _serve_and_read(kubelet: Kubelet, socket_path: Path, topology: NodeTopology) -> GpuUse:
    async def scenario() -> GpuUse:
        server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        server.add_insecure_port(f"unix://{socket_path}")
        await server.start()
        try:
            return await PodResourcesReader(socket_path).read(topology)
        finally:
            await server.stop(0)

    return asyncio.run(asyncio.wait_for(scenario(), 30))


def _pod(name: str, *containers: pb.ContainerResources) -> pb.PodResources:
    return pb.PodResources(name=name, namespace="team-a", containers=list(containers))


def test_gpus_held_by_device_plugin_and_dra_map_to_indices(
    dgx: NodeTopology, socket_path: Path
) -> None:
    uuids = [g.uuid for g in dgx.gpus]
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            _pod(
                "train-0",
                pb.ContainerResources(
                    name="worker",
                    devices=[
                        pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=uuids[:2]),
                        pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["f0"]),
                    ],
                ),
            ),
            _pod(
                "serve-0",
                pb.ContainerResources(
                    name="server",
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_name="gpu-claim",
                            claim_namespace="team-a",
                            claim_resources=[
                                pb.ClaimResource(
                                    driver_name="gpu.nvidia.com",
                                    pool_name="h100-01",
                                    device_name="gpu-5",
                                )
                            ],
                        )
                    ],
                ),
            ),
            _pod(
                "mig-0",
                pb.ContainerResources(
                    name="c",
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu", device_ids=["MIG-2b1c3d4e-0000"]
                        )
                    ],
                ),
            ),
        ]
    )
    allocatable = pb.AllocatableResourcesResponse(
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=uuids)]
    )
    use = _serve_and_read(Kubelet(listed, allocatable), socket_path, dgx)
    assert use.known
    assert use.held == {
        0: GpuHolder("team-a", "train-0", "worker", "nvidia.com/gpu"),
        1: GpuHolder("team-a", "train-0", "worker", "nvidia.com/gpu"),
        5: GpuHolder("team-a", "serve-0", "server", "claim team-a/gpu-claim"),
    }
    assert use.allocatable == frozenset(range(8))
    assert use.unmapped == ("team-a/mig-0/c: MIG-2b1c3d4e-0000",)  # counted, never guessed


def test_an_older_kubelet_without_allocatable_still_lists(
    dgx: NodeTopology, socket_path: Path
) -> None:
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            _pod(
                "p",
                pb.ContainerResources(
                    name="c",
                    devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["3"])],
                ),
            )
        ]
    )
    use = _serve_and_read(Kubelet(listed, None), socket_path, dgx)
    assert set(use.held) == {3}  # deviceIDStrategy=index
    assert use.allocatable is None


def test_no_socket_says_how_to_mount_it(dgx: NodeTopology, socket_path: Path) -> None:
    use = asyncio.run(PodResourcesReader(socket_path).read(dgx))
    assert not use.known
    assert "not found" in use.reason
    assert "/var/lib/kubelet/pod-resources" in use.reason


def test_a_dead_socket_is_a_reason_not_a_crash(dgx: NodeTopology, socket_path: Path) -> None:
    socket_path.touch()  # a file where the kubelet's socket should be, nobody listening
    use = asyncio.run(PodResourcesReader(socket_path, timeout_s=2).read(dgx))
    assert not use.known
    assert use.reason.startswith("kubelet List: UNAVAILABLE")


def test_the_kubelets_answer_reaches_the_aggregator_and_leaves_exactly_those_gpus_out(
    fake_node: Callable[..., FakeNode], socket_path: Path
) -> None:
    """Exporter -> report stream -> aggregator: GPUs 2 and 5 held by a pod are not free there,
    and come back when the kubelet says they are released."""
    node = fake_node("dgx-h100", node_name="h100-01")
    uuids = [g.uuid for g in node.machine.topology.gpus]
    holding = pb.ListPodResourcesResponse(
        pod_resources=[
            _pod(
                "train-0",
                pb.ContainerResources(
                    name="worker",
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu", device_ids=[uuids[2], uuids[5]]
                        )
                    ],
                ),
            )
        ]
    )
    kubelet = Kubelet(holding, None)

    async def scenario() -> None:
        server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        server.add_insecure_port(f"unix://{socket_path}")
        await server.start()
        aggregator = Aggregator(AggregatorConfig(heartbeat_interval_s=0.2))
        await aggregator.start()
        try:
            async with fake_agent(
                node,
                aggregator.grpc_target,
                pod_resources_socket=socket_path,
                pod_resources_interval_s=0.1,
            ):
                state = aggregator.state

                def held() -> bool:
                    return state.free_gpus("h100-01") == frozenset({0, 1, 3, 4, 6, 7})

                await until(held, what="the kubelet's GPUs left out")
                use = state.kubelet_use("h100-01")
                assert use is not None
                assert use.held[5].pod_key == "team-a/train-0"
                kubelet.listed = pb.ListPodResourcesResponse()  # the pod ended
                await until(
                    lambda: len(state.free_gpus("h100-01")) == 8, what="the GPUs given back"
                )
        finally:
            await aggregator.stop()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(scenario(), 60))
