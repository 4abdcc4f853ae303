"""The device plugin against a kubelet device manager played over the real protocol.

The kubelet (`tests.harness.kubelet.FakeKubelet`) registers the plugin on real unix sockets,
follows its ListAndWatch, asks GetPreferredAllocation and Allocate as its device manager does,
and serves PodResources with what it allocated; the pods come as the API server lists them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporter.admission import DeviceIds, PendingPod, prefer
from exporter.deviceplugin import (
    DevicePlugin,
    DevicePluginConfig,
    allocate_response,
    driver_minors,
    kubelet_allocations,
)
from gputopo.links import LinkKind
from gputopo.machines import load_machine
from gputopo.runtime.backoff import Backoff
from gputopo.runtime.kube import KubeError
from gputopo.topology import NodeTopology
from tests.builders import nvswitch_node
from tests.harness.kubelet import FakeKubelet

NODE = "node-a"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory: a unix socket path has a length limit (108 bytes), pytest's can be
    longer."""
    with tempfile.TemporaryDirectory(prefix="dp-") as root:
        yield Path(root)


def pod(
    name: str,
    requests: Sequence[int],
    *,
    gpus: Sequence[int] | None,
    created: int,
    uuids: Sequence[str] = (),
    node: str = NODE,
) -> dict[str, Any]:
    """A pod bound to `node` as the binder leaves it: the record, then the binding."""
    annotations: dict[str, str] = {}
    if gpus is not None:
        annotations = {"gputopo.io/node": node, "gputopo.io/gpus": ",".join(map(str, gpus))}
        if uuids:
            annotations["gputopo.io/gpu-uuids"] = ",".join(uuids)
    stamp = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=created)
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "annotations": annotations,
            "creationTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": str(n)}}}
                for i, n in enumerate(requests)
            ],
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class Node:
    topology: NodeTopology
    kubelet: FakeKubelet
    plugin: DevicePlugin
    pods: list[dict[str, Any]] = field(default_factory=list)

    def uuid(self, index: int) -> str:
        return self.topology.gpus[index].uuid


@asynccontextmanager
async def node_with_plugin(tmp_path: Path, topology: NodeTopology) -> AsyncIterator[Node]:
    directory = tmp_path / "device-plugins"
    kubelet = FakeKubelet(directory, tmp_path / "pod-resources.sock")
    pods: list[dict[str, Any]] = []

    async def list_pods() -> Sequence[Mapping[str, Any]]:
        return list(pods)

    config = DevicePluginConfig(
        node_name=NODE,
        directory=directory,
        watch_interval_s=0.05,
        backoff=Backoff(base_s=0.05, cap_s=0.2),
    )
    async with kubelet:
        plugin = DevicePlugin(
            config,
            lambda: topology,
            pods=list_pods,
            allocated=kubelet_allocations(kubelet.pod_resources_socket, config.resource_name),
        )
        task = asyncio.create_task(plugin.run())
        try:
            await kubelet.wait_for("nvidia.com/gpu")
            yield Node(topology, kubelet, plugin, pods)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("gpus", [8, 16], ids=["8-GPU node", "16-GPU node"])
def test_the_kubelet_allocates_exactly_the_recorded_gpus(tmp_path: Path, gpus: int) -> None:
    """A seeded stream of 200 admissions: batches of pods are recorded on random free GPUs in a
    random rank order (some with two GPU containers), bound, then admitted oldest first, as the
    kubelet admits; some end and free their GPUs. Every allocation equals its record."""

    async def scenario() -> None:
        rng = random.Random(gpus)
        async with node_with_plugin(tmp_path, nvswitch_node(NODE, gpus=gpus)) as node:
            admitted, running, created = 0, [], 0
            free = set(range(gpus))
            while admitted < 200:
                batch = []
                while free and len(batch) < 3:
                    size = rng.choice([s for s in (1, 2, 3, 4, 8) if s <= len(free)])
                    gpus_of = rng.sample(sorted(free), size)  # rank order, not index order
                    free -= set(gpus_of)
                    split = [1, size - 1] if size > 1 and rng.random() < 0.2 else [size]
                    created += 1
                    name = f"p{created}"
                    uuids = [node.uuid(g) for g in gpus_of] if rng.random() < 0.5 else []
                    node.pods.append(pod(name, split, gpus=gpus_of, created=created, uuids=uuids))
                    batch.append((name, split, gpus_of))
                for name, split, gpus_of in batch:
                    done = await node.kubelet.admit(f"ns/{name}", split)
                    allocated = [d for a in done for d in a.allocated]
                    assert allocated == [node.uuid(g) for g in gpus_of], name
                    for a in done:
                        named = a.response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
                        assert named == list(a.allocated)
                    admitted += 1
                    running.append((name, gpus_of))
                while running and (not free or rng.random() < 0.5):
                    name, gpus_of = running.pop(rng.randrange(len(running)))
                    node.kubelet.release(f"ns/{name}")
                    node.pods[:] = [p for p in node.pods if p["metadata"]["name"] != name]
                    free |= set(gpus_of)
            assert node.plugin.stats.preferred["record"] >= 200
            assert node.plugin.stats.preferred["best"] == 0

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_an_unhealthy_gpu_leaves_the_list_and_is_never_allocated(tmp_path: Path) -> None:

    async def scenario() -> None:
        async with node_with_plugin(tmp_path, nvswitch_node(NODE, gpus=8)) as node:
            before = node.kubelet.plugins["nvidia.com/gpu"].updates
            await node.plugin.mark_unhealthy(3, "XID 79: fallen off the bus")
            await node.kubelet.wait_for("nvidia.com/gpu", updates=before + 1)
            assert node.uuid(3) not in node.kubelet.healthy("nvidia.com/gpu")
            assert len(node.kubelet.healthy("nvidia.com/gpu")) == 7
            # A record naming the sick GPU is not followed into it; pods without one avoid it too.
            node.pods.append(pod("sick", [2], gpus=[3, 4], created=1))
            done = await node.kubelet.admit("ns/sick", [2])
            assert node.uuid(3) not in done[0].allocated
            for n in range(5):
                node.pods.append(pod(f"plain{n}", [1], gpus=None, created=2 + n))
                done = await node.kubelet.admit(f"ns/plain{n}", [1])
                assert node.uuid(3) not in done[0].allocated
            await node.plugin.mark_healthy(3)
            await node.kubelet.wait_for("nvidia.com/gpu", updates=before + 2)
            assert node.uuid(3) in node.kubelet.healthy("nvidia.com/gpu")

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_restarted_kubelet_gets_the_plugin_registered_again(tmp_path: Path) -> None:

    async def scenario() -> None:
        async with node_with_plugin(tmp_path, nvswitch_node(NODE, gpus=8)) as node:
            assert node.kubelet.registrations == 1
            numa = node.kubelet.plugins["nvidia.com/gpu"].numa
            assert numa == {g.uuid: (g.numa_node,) for g in node.topology.gpus}
            removed = await node.kubelet.restart()
            assert node.plugin.socket_path in removed  # the plugin must serve again
            await node.kubelet.wait_for("nvidia.com/gpu")
            assert node.kubelet.registrations == 2
            assert node.plugin.stats.registrations == 2
            node.pods.append(pod("after", [2], gpus=[6, 1], created=1))
            done = await node.kubelet.admit("ns/after", [2])
            assert done[0].allocated == (node.uuid(6), node.uuid(1))

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_pod_without_a_record_gets_the_link_graph_best_gpus(tmp_path: Path) -> None:
    """On a node of NVLink-bridged pairs, two GPUs without a record come as one bridged pair."""

    async def scenario() -> None:
        topology = load_machine("pcie-h100-nvlbridge-8x", node_name=NODE)
        async with node_with_plugin(tmp_path, topology) as node:
            node.pods.append(pod("free", [2], gpus=None, created=1))
            done = await node.kubelet.admit("ns/free", [2])
            a, b = (node.plugin.ids().index_of(d) for d in done[0].allocated)
            assert a is not None
            assert b is not None
            link = topology.gpu_link(a, b)
            assert link is not None
            assert link.kind is LinkKind.NVLINK
            assert node.plugin.stats.preferred["best"] == 1

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_allocate_answers_as_nvidias_plugin_with_the_driver_minor(tmp_path: Path) -> None:
    """Env and CDI names list the IDs; device nodes use the minor (here not the index)."""
    topology = load_machine("dgx-h100", node_name=NODE)
    ids = DeviceIds.of(topology)
    for gpu in topology.gpus:
        info = tmp_path / "driver" / "nvidia" / "gpus" / gpu.pci_bus_id.lower() / "information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: H100\nDevice Minor: \t {7 - gpu.index}\nBus Location: x\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    config = DevicePluginConfig(
        node_name=NODE,
        list_strategies=("envvar", "cdi-cri"),
        pass_device_specs=True,
        driver_root=tmp_path,
    )
    devices = [ids.by_index[1], ids.by_index[6]]
    response = allocate_response(
        devices, config=config, minors=driver_minors(topology, ids, proc=tmp_path)
    )
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(devices)
    assert [c.name for c in response.cdi_devices] == [
        f"k8s.device-plugin.nvidia.com/gpu={d}" for d in devices
    ]
    assert [(d.container_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidia6", "rw"),
        ("/dev/nvidia1", "rw"),
        ("/dev/nvidiactl", "rw"),  # uvm absent here: left out, as NVIDIA's optional nodes
    ]
    assert response.devices[0].host_path == str(tmp_path / "dev" / "nvidia6")


def test_without_the_pod_list_the_kubelet_still_gets_an_answer(tmp_path: Path) -> None:
    """An API server that does not answer must not fail the pod's admission."""

    async def scenario() -> None:
        async with node_with_plugin(tmp_path, nvswitch_node(NODE, gpus=8)) as node:

            async def broken() -> Sequence[Mapping[str, Any]]:
                raise KubeError(503, "the API server is away")

            node.plugin._pods = broken  # the API server goes away
            node.pods.append(pod("p", [2], gpus=[6, 7], created=1))
            done = await node.kubelet.admit("ns/p", [2])
            assert done[0].preferred is not None  # an answer, the best set
            assert len(done[0].allocated) == 2
            assert node.plugin.stats.preferred["best"] == 1

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_prefer_keeps_the_init_containers_gpus_the_kubelet_reuses() -> None:
    """The kubelet reuses an init container's GPUs for the next container (must_include)."""
    ids = [f"GPU-{i}" for i in range(8)]
    pending = [PendingPod("ns/p", "t0", (ids[5], ids[2], ids[7]), (1, 3))]
    chosen = prefer(
        available=[d for d in ids if d != ids[5]],  # GPU 5 went to the init container
        must_include=[ids[5]],
        size=3,
        pending=pending,
        best=lambda available, must, size: (),
    )
    assert chosen.devices == (ids[5], ids[2], ids[7])
    assert chosen.pod == "ns/p"
