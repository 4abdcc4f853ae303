"""Shared and partitioned GPUs are held, not free: time-slicing replicas and MIG devices.

Device IDs as NVIDIA's device plugin names them (NVIDIA/k8s-device-plugin: replicas
`<id>::<n>` in internal/rm/devices.go `AnnotatedID`; MIG devices by their MIG UUID), as the
kubelet's PodResources reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from aggregator.state import ClusterState
from exporter.fake_machine import FakeMachine
from exporter.podresources import PodResourcesReader
from gputopo.topology import NodeTopology
from gputopo.v1 import podresources_pb2 as pb

NODE: NodeTopology = FakeMachine.from_profile("dgx-h100", node_name="h100-01").topology
UUID = [g.uuid for g in NODE.gpus]
MIG_A = "MIG-0f6a8c44-2d1b-5e7c-9a3f-1b2c3d4e5f60"  # a slice of GPU 4
MIG_B = "MIG-7e1d2c3b-4a5f-5b6c-8d7e-9f0a1b2c3d4e"  # a slice of GPU 4 too
MIG_PARENTS = {MIG_A: 4, MIG_B: 4}


@dataclass(frozen=True)
class Case:
    resource: str
    held_ids: tuple[str, ...]
    allocatable_ids: tuple[str, ...]
    want_held: frozenset[int]
    want_allocatable: frozenset[int]


CASES = [
    pytest.param(
        Case(
            "nvidia.com/gpu",
            (f"{UUID[1]}::3",),
            (*(f"{u}::{n}" for u in UUID[:6] for n in range(4)), UUID[6], UUID[7]),
            frozenset(range(6)),
            frozenset({6, 7}),
        ),
        id="time-slicing: a replica holds its GPU, a shared GPU is never free, whole ones are",
    ),
    pytest.param(
        Case(
            "nvidia.com/gpu.shared",
            (f"{UUID[6]}::0", f"{UUID[6]}::1"),
            tuple(f"{u}::{n}" for u in UUID for n in range(2)),
            frozenset(range(8)),
            frozenset(),
        ),
        id="time-slicing renamed nvidia.com/gpu.shared is counted the same",
    ),
    pytest.param(
        Case("nvidia.com/gpu", ("2::1",), ("2::0", "2::1"), frozenset({2}), frozenset()),
        id="time-slicing with index ids",
    ),
    pytest.param(
        Case(
            "nvidia.com/mig-1g.10gb",
            (MIG_A,),
            (MIG_A, MIG_B),
            frozenset({4}),
            frozenset(),
        ),
        id="MIG mixed strategy: a held slice holds its GPU, which is never allocatable whole",
    ),
    pytest.param(
        Case("nvidia.com/gpu", (MIG_B,), (MIG_A, MIG_B, UUID[0]), frozenset({4}), frozenset({0})),
        id="MIG single strategy: slices come as nvidia.com/gpu",
    ),
    pytest.param(
        Case(
            "nvidia.com/mig-3g.40gb",
            (f"MIG-{UUID[7]}/1/0",),
            (),
            frozenset({7}),
            frozenset(),
        ),
        id="MIG ids of drivers before R470 name their GPU",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_shared_and_partitioned_gpus_are_held(case: Case) -> None:
    devices = pb.ContainerDevices(resource_name=case.resource, device_ids=list(case.held_ids))
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="p",
                namespace="ns",
                containers=[pb.ContainerResources(name="c", devices=[devices])],
            )
        ]
    )
    allocatable = pb.AllocatableResourcesResponse(
        devices=[
            pb.ContainerDevices(resource_name=case.resource, device_ids=list(case.allocatable_ids))
        ]
    )
    reader = PodResourcesReader(mig_parents=lambda: MIG_PARENTS)
    use = reader.use(NODE, listed, allocatable)
    assert frozenset(use.held) == case.want_held
    assert use.allocatable == case.want_allocatable
    assert use.unmapped == ()
    pods = {i for i, holder in use.held.items() if holder.pod}
    assert {use.held[i].pod_key for i in pods} == {"ns/p"}  # the rest: held by a partition


def test_a_dra_device_is_located_by_its_minor_not_taken_for_the_index() -> None:
    """NVIDIA's DRA driver names a GPU `gpu-<minor>`; here minor 3 is NVML index 0."""
    claim = pb.DynamicResource(
        claim_name="c",
        claim_namespace="ns",
        claim_resources=[pb.ClaimResource(driver_name="gpu.nvidia.com", device_name="gpu-3")],
    )
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="p",
                namespace="ns",
                containers=[pb.ContainerResources(name="c", dynamic_resources=[claim])],
            )
        ]
    )
    reader = PodResourcesReader(dra_minors=lambda: {3: 0, 0: 3})
    assert set(reader.use(NODE, listed, None).held) == {0}


@pytest.mark.parametrize(
    ("resource", "held_ids", "want_free"),
    [
        pytest.param(
            "nvidia.com/gpu.shared",
            (f"{UUID[6]}::0",),
            frozenset(range(8)) - {6},
            id="a time-slicing node: the shared GPU is not free",
        ),
        pytest.param(
            "nvidia.com/mig-1g.10gb",
            (MIG_A,),
            frozenset(range(8)) - {4},
            id="a MIG node: the partitioned GPU is not free",
        ),
    ],
)
def test_the_aggregator_counts_them_held(
    resource: str, held_ids: tuple[str, ...], want_free: frozenset[int]
) -> None:
    devices = pb.ContainerDevices(resource_name=resource, device_ids=list(held_ids))
    listed = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="p",
                namespace="ns",
                containers=[pb.ContainerResources(name="c", devices=[devices])],
            )
        ]
    )
    use = PodResourcesReader(mig_parents=lambda: MIG_PARENTS).use(NODE, listed, None)
    state = ClusterState(clock=lambda: 1000.0)
    state.add_static(NODE)
    state.set_kubelet_use(NODE.name, use)
    assert state.snapshot().node(NODE.name).free == want_free
