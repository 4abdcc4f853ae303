"""Discovery through fake NVML and a fake sysfs tree finds the graph the recordings describe.

The fake machines are the recordings (via `gputopo.machines`); discovery runs the real adapter,
the real sysfs reader and the real assembly against them, so a test here fails when discovery
would misread the real machine the recording came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.assemble import assemble
from exporter.discovery import Discovery
from exporter.fake_machine import FakeMachine
from exporter.fake_nvml import FakeNvml
from exporter.fake_sysfs import write_sysfs
from exporter.nvml import Nvml
from exporter.sysfs import Sysfs
from gputopo.importers import import_topology
from gputopo.links import LinkHealth, LinkKind
from gputopo.machines import PROFILES, load_profile, read_recording
from gputopo.topology import DeviceKind, FabricState, Link, NodeTopology, gpu, nic, numa
from tests.builders import nvswitch_node, pcie_node
from tests.exporter.conftest import FakeNode

# The machines the issue names, by profile.
NAMED_MACHINES = {
    "8x H100 NVSwitch": "dgx-h100",
    "8x A100 with NICs": "hgx-a100-roce",
    "DGX-1 V100 hybrid cube mesh": "dgx1-v100",
    "4x H100 NV6 pairs": "h100-nv6-4x",
    "GB200 tray": "gb200-tray",
    "2-GPU PCIe workstation": "workstation-2x-rtx5090",
    "8x A10G PCIe": "g5-a10g-8x",
}


def graph(topology: NodeTopology) -> dict[tuple[str, str], tuple[str, int, int, bool, float]]:
    """GPU-GPU and GPU-NIC links as (code, lanes, max lanes, via switch, nominal GB/s)."""
    return {
        (str(lk.a), str(lk.b)): (lk.code, lk.lanes, lk.max_lanes, lk.via_switch, lk.nominal_gbps)
        for lk in topology.links
        if DeviceKind.NUMA not in (lk.a.kind, lk.b.kind)
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_discovery_finds_the_recorded_machine(
    profile: str, fake_node: Callable[..., FakeNode]
) -> None:
    node = fake_node(profile)
    found = node.discovery.run().topology
    want = node.machine.topology
    assert graph(found) == graph(want)
    assert found.gpus == want.gpus
    assert found.nics == want.nics
    assert [(n.id, n.cpus) for n in found.numa_nodes] == [(n.id, n.cpus) for n in want.numa_nodes]
    assert not found.partial
    assert found.problems == ()
    assert found.degraded_links == ()
    assert found.nvml.up
    assert found.nvml.driver_version


@pytest.mark.parametrize(("machine", "profile"), NAMED_MACHINES.items(), ids=NAMED_MACHINES)
def test_discovery_agrees_with_the_importer_on_every_pair_the_recording_states(
    machine: str, profile: str, fake_node: Callable[..., FakeNode]
) -> None:
    """The recording, imported as-is, and discovery agree wherever the recording has a fact."""
    spec = load_profile(profile)
    recorded = import_topology(
        read_recording(spec.recording.file),
        recording_format=spec.recording.format,
        assume_classes=spec.recording.assume_classes,
    )
    found = fake_node(profile).discovery.run().topology
    assert found.gpu_count == recorded.gpu_count
    assert len(found.nics) == len(recorded.nics)
    for link in recorded.links:
        got = found.link(link.a, link.b)
        assert got is not None, f"{link.a}-{link.b}"
        if link.kind is LinkKind.NVLINK or got.kind is not LinkKind.NVLINK:
            # Profiles only add NVLink where a recording lacks it (the XML files list none).
            assert (got.code, got.via_switch) == (link.code, link.via_switch), (link.a, link.b)
    for g in range(recorded.gpu_count):
        if len(recorded.nic_links(g)) == len(recorded.nics):  # a cut row lacks some
            assert found.nearest_nics(g) == recorded.nearest_nics(g)


def test_nvswitch_is_found_by_remote_device_type_not_by_peer_addresses(
    fake_node: Callable[..., FakeNode],
) -> None:
    """On NVSwitch machines no NVLink ends at a peer GPU: matching addresses finds nothing."""
    node = fake_node("dgx-h100")
    reading = Nvml(node.nvml.library).read()
    peers = {g.pci_bus_id for g in reading.gpus}
    assert not any(lk.remote_bus_id in peers for g in reading.gpus for lk in g.nvlinks)
    found = node.discovery.run().topology
    assert {lk.code for lk in found.gpu_links()} == {"NV18"}
    assert all(lk.via_switch for lk in found.gpu_links())


def test_an_old_driver_without_remote_types_falls_back_to_addresses_and_says_so(
    fake_node: Callable[..., FakeNode],
) -> None:
    switched = fake_node("hgx-a100-roce", remote_type_supported=False).discovery.run().topology
    direct = fake_node("dgx1-v100", remote_type_supported=False).discovery.run().topology
    assert {(lk.code, lk.via_switch) for lk in switched.gpu_links()} == {("NV12", True)}
    assert any("NVSwitch" in p for p in switched.problems)
    assert graph(direct) == graph(FakeMachine.from_profile("dgx1-v100", node_name="n").topology)


def test_gpu_to_host_links_go_to_every_numa_node(fake_node: Callable[..., FakeNode]) -> None:
    found = fake_node("dgx-h100").discovery.run().topology
    for g in found.gpus:
        kinds = {n.id: found.link(gpu(g.index), numa(n.id)) for n in found.numa_nodes}
        assert {n: lk.kind for n, lk in kinds.items() if lk is not None} == {
            n.id: LinkKind.PHB if n.id == g.numa_node else LinkKind.SYS for n in found.numa_nodes
        }


def test_gb200_fabric_info_is_read_into_every_gpu(tmp_path: Path) -> None:
    from gputopo.machines import load_machine, with_gpu_fabric

    machine = with_gpu_fabric(
        load_machine("gb200-tray", node_name="tray-1"),
        cluster_uuid="7b968a6d-c8aa-45e1-9e07-e1e51be99c31",
        clique_id=1,
    )
    fake = FakeMachine.from_topology(machine)
    discovery = Discovery(
        node_name="tray-1",
        nvml=Nvml(FakeNvml(fake).library),
        sysfs=Sysfs(write_sysfs(fake, tmp_path)),
    )
    found = discovery.run().topology
    assert {g.fabric.clique for g in found.gpus if g.fabric} == {
        "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"
    }
    assert all(g.fabric is not None and g.fabric.state is FabricState.COMPLETED for g in found.gpus)


@dataclass(frozen=True)
class FailingCall:
    """One NVML call failing with an NVML error, and what discovery should make of it."""

    call: str
    gpu: int | None  # None: on every GPU
    error: str
    want_problem: str | None
    want: Callable[[NodeTopology], bool]


FAILING_CALLS = [
    pytest.param(
        FailingCall(
            "nvmlDeviceGetMemoryAffinity",
            3,
            "NOT_SUPPORTED",
            None,
            lambda t: t.gpus[3].numa_node == 0,
        ),
        id="no NUMA from NVML: sysfs gives it, quietly",
    ),
    pytest.param(
        FailingCall(
            "nvmlDeviceGetTopologyCommonAncestor",
            None,
            "UNKNOWN",
            "PCIe path from sysfs",
            lambda t: t.gpu_link(0, 1).kind is LinkKind.NVLINK,
        ),
        id="common ancestor fails: NVLink still wins, PCIe from sysfs",
    ),
    pytest.param(
        FailingCall(
            "nvmlDeviceGetUUID",
            2,
            "GPU_IS_LOST",
            "GPU2 nvmlDeviceGetUUID: GPU is lost",
            lambda t: t.partial and t.gpus[2].uuid == "" and t.gpu_count == 8,
        ),
        id="a lost GPU keeps its place, unknown, and the topology is partial",
    ),
    pytest.param(
        FailingCall(
            "nvmlDeviceGetNvLinkErrorCounter",
            None,
            "NOT_SUPPORTED",
            None,
            lambda t: not t.degraded_links,
        ),
        id="no error counters on this driver: no problem",
    ),
    pytest.param(
        FailingCall(
            "nvmlDeviceGetCurrPcieLinkWidth",
            1,
            "NO_PERMISSION",
            "GPU1 nvmlDeviceGetCurrPcieLinkWidth: Insufficient Permissions",
            lambda t: t.gpus[1].pcie_width == 16,
        ),
        id="PCIe width refused: sysfs gives it",
    ),
]


@pytest.mark.parametrize("case", FAILING_CALLS)
def test_an_nvml_error_degrades_one_field_not_the_discovery(
    case: FailingCall, fake_node: Callable[..., FakeNode]
) -> None:
    node = fake_node("dgx-h100")
    node.nvml.failing[(case.call, case.gpu)] = case.error
    found = node.discovery.run().topology
    assert case.want(found)
    if case.want_problem is None:
        assert found.problems == ()
    else:
        assert any(case.want_problem in p for p in found.problems), found.problems
    assert found.nvml.up


def test_no_driver_gives_an_empty_node_that_says_why(fake_node: Callable[..., FakeNode]) -> None:
    node = fake_node("dgx-h100", driver=False)
    result = node.discovery.run()
    assert result.topology.gpus == ()
    assert not result.topology.nvml.up
    assert "libnvidia-ml.so.1 not found" in result.topology.nvml.reason
    assert len(result.topology.nics) == 8  # sysfs still shows the NICs
    assert not result.topology.partial


def test_this_machine_has_no_gpu_and_discovery_reads_the_real_sys() -> None:
    """The real adapter and /sys, here: no driver, no error, an empty healthy node."""
    result = Discovery(node_name="here", nvml=Nvml(), sysfs=Sysfs()).run()
    assert not result.topology.nvml.up
    assert result.topology.nvml.reason
    assert result.topology.gpus == ()
    assert result.sysfs.errors == 0
    assert result.topology.numa_nodes  # every Linux kernel lists node0


@given(
    gpus=st.integers(min_value=1, max_value=8),
    lanes=st.integers(min_value=1, max_value=18),
    with_nics=st.booleans(),
    numa_nodes=st.sampled_from([1, 2]),
)
def test_any_nvswitch_node_built_for_a_test_is_discovered_as_built(
    gpus: int, lanes: int, with_nics: bool, numa_nodes: int
) -> None:
    """One NIC per GPU on its switch, or none: the shapes the builder wires consistently."""
    import tempfile

    nics = gpus if with_nics else 0
    built = nvswitch_node("n", gpus=gpus, lanes=lanes, nics=nics, numa_nodes=numa_nodes)
    built = replace(built, gpus=tuple(replace(g, memory_mib=1, name="G") for g in built.gpus))
    fake = FakeMachine.from_topology(built)
    with tempfile.TemporaryDirectory() as root:
        reading = Nvml(FakeNvml(fake).library).read()
        sysfs = Sysfs(write_sysfs(fake, Path(root))).read(
            bus_ids=[g.pci_bus_id for g in reading.gpus]
        )
    found = assemble(node_name="n", nvml=reading, sysfs=sysfs).topology
    assert graph(found) == graph(fake.topology)


@given(
    pairs=st.sets(st.sampled_from([(0, 1), (2, 3), (4, 5), (6, 7)])),
    lanes=st.integers(min_value=1, max_value=18),
)
def test_any_bridged_pcie_server_is_discovered_as_built(
    pairs: set[tuple[int, int]], lanes: int
) -> None:
    import tempfile

    # No NIC: the builder puts its one NIC on every GPU's switch, which no tree can do.
    built = pcie_node("p", bridged_pairs=pairs, bridge_lanes=lanes, numa_nodes=2, nics=0)
    fake = FakeMachine.from_topology(built)
    with tempfile.TemporaryDirectory() as root:
        reading = Nvml(FakeNvml(fake).library).read()
        sysfs = Sysfs(write_sysfs(fake, Path(root))).read(
            bus_ids=[g.pci_bus_id for g in reading.gpus]
        )
    found = assemble(node_name="p", nvml=reading, sysfs=sysfs).topology
    assert graph(found) == graph(fake.topology)


def test_a_recording_whose_classes_cannot_come_from_a_pci_tree_is_refused() -> None:
    """Two GPUs one switch away from the same NIC cannot be SYS to each other: refuse."""
    base = pcie_node("bad", gpus=2, nics=1, numa_nodes=2)
    links = (
        Link(gpu(0), gpu(1), LinkKind.SYS),
        Link(gpu(0), nic(0), LinkKind.PIX),
        Link(gpu(1), nic(0), LinkKind.PIX),
    )
    with pytest.raises(ValueError, match="no PCI tree gives gpu0-gpu1 SYS"):
        FakeMachine.from_topology(replace(base, links=links))


def test_health_survives_a_round_trip_through_discovery(fake_node: Callable[..., FakeNode]) -> None:
    node = fake_node("dgx1-v100")
    node.nvml.set_nvlink_down(0, 0)
    found = node.discovery.run().topology
    degraded = [lk for lk in found.links if lk.health is LinkHealth.DEGRADED]
    assert degraded
    assert all("NVLink" in lk.health_reason for lk in degraded)


def test_the_h100_vm_fake_is_found_as_the_recordings_say(tmp_path: Path) -> None:
    """The machine of the first real run: discovery through pynvml over the fake C library and a
    sysfs tree equals what `nvml_direct_calls_h100_vm.json` and the sysfs listing recorded."""
    data = Path(__file__).parent.parent / "data"
    nvml_text = (data / "nvml_direct_calls_h100_vm.json").read_text()
    sysfs_text = (data / "sysfs_h100_vm_pci_net_numa.txt").read_text()
    machine = FakeMachine.from_nvml_recording(nvml_text, sysfs_text, node_name="h100-vm")
    fake = FakeNvml(machine, driver_version="580.159.04", cuda_version=13000)
    root = write_sysfs(machine, tmp_path)
    sysfs = Sysfs(root)
    result = Discovery(node_name="h100-vm", nvml=Nvml(fake.library), sysfs=sysfs).run()

    recorded = json.loads(nvml_text.split("\n", 1)[1])["gpus"][0]
    (g,) = result.topology.gpus
    assert (g.name, g.uuid, g.memory_mib) == (
        recorded["name"],
        recorded["uuid"],
        recorded["memory_total_mib"],
    )
    assert g.pci_bus_id == "0000:00:06.0"  # NVML's 00000000:00:06.0
    assert g.compute_capability == "9.0"
    kernel = sysfs.pci_device(g.pci_bus_id)
    assert kernel is not None
    assert kernel.numa_node is None  # the kernel says -1 ...
    assert g.numa_node == 0  # ... NVML's memory affinity names node 0
    assert g.cpu_affinity == "0-15"
    assert (g.pcie_generation, g.pcie_width, g.pcie_max_generation, g.pcie_max_width) == (
        5,
        16,
        5,
        16,
    )
    assert g.nvlink_lanes == 0
    assert list(result.topology.gpu_links()) == []
    assert g.fabric is None  # fabric info answered NOT_SUPPORTED state, not an error
    (eth0,) = result.topology.nics
    assert (eth0.netdev, eth0.speed_mbps) == ("eth0", 0)  # speed -1: unknown
    eth0_path = result.topology.link(gpu(0), nic(0))
    assert eth0_path is not None
    assert eth0_path.nominal_gbps == 0.0
    assert result.topology.nvml.driver_version == "580.159.04"
    assert result.topology.problems == ()
