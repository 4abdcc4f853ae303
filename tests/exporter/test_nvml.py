"""The NVML adapter: real pynvml on this GPU-less machine, and the fake that stands in for GPUs."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pynvml
import pytest

from exporter.fake_machine import FakeMachine
from exporter.fake_nvml import FakeNvml, NvmlAbiError
from exporter.nvml import Nvml
from exporter.readings import (
    FabricReading,
    P2pStatus,
    RemoteType,
    normalise_bus_id,
    nvlink_generation,
)
from tests.exporter.conftest import FakeNode

NVL72_FABRIC = FabricReading(
    cluster_uuid="9a4c8e3a-51f2-4b8e-9e0c-2f1d7c6b5a40", clique_id=7, state=3, health_mask=0
)


def test_on_this_machine_nvml_is_down_and_says_why() -> None:
    nvml = Nvml()
    reading = nvml.read()
    assert not reading.status.up
    assert "libnvidia-ml.so.1" in reading.status.reason
    assert reading.gpus == ()
    assert nvml.activity() == ()
    nvml.close()  # nothing to shut down: no error either


def test_the_fake_is_pynvml_itself_over_a_fake_c_library() -> None:
    fake = FakeNvml(FakeMachine.from_profile("workstation-2x-rtx5090", node_name="w"))
    lib = fake.library
    assert lib.nvmlDeviceGetCount.__code__.co_filename == pynvml.__file__  # the wheel's Python
    with pytest.raises(lib.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, lib.c_nvmlDevice_t)
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetNvLinkState(handle, 0)  # an RTX 5090 has no NVLink
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetHandleByIndex(2)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2  # counted by pynvml's names


def test_the_fake_answers_through_pynvml_structs(fake_node: Callable[..., FakeNode]) -> None:
    fake = fake_node("hgx-a100-roce").nvml
    lib = fake.library
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(lib.nvmlDeviceGetPciInfo(handle), lib.nvmlPciInfo_t)
    assert lib.nvmlDeviceGetPciInfo(handle).busId == "00000000:18:00.0"  # 8-digit domain
    assert lib.nvmlDeviceGetMemoryInfo(handle).total == 81920 * 1024 * 1024
    assert lib.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0) == lib.NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert lib.nvmlDeviceGetNvLinkVersion(handle, 0) == lib.NVML_NVLINK_VERSION_3_0
    assert lib.nvmlDeviceGetComputeRunningProcesses(handle) == []
    fake.processes[0] = 2  # pynvml's two-call size protocol runs for real
    assert [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(handle)] == [1000, 1001]


def test_a_struct_passed_by_value_fails_as_it_crashes_on_hardware(
    fake_node: Callable[..., FakeNode],
) -> None:
    """The segfault of the first H100 run: the fabric struct went to C by value."""
    fake = fake_node("gb200-tray").nvml
    fake.fabric[0] = NVL72_FABRIC
    lib = fake.library
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(NvmlAbiError, match="by value"):
        lib.nvmlDeviceGetGpuFabricInfoV(handle, lib.c_nvmlGpuFabricInfoV_t())
    info = lib.c_nvmlGpuFabricInfoV_t()
    lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    assert info.state == lib.NVML_GPU_FABRIC_STATE_COMPLETED


def test_a_fabric_struct_without_its_version_is_refused_like_nvml_does(
    fake_node: Callable[..., FakeNode],
) -> None:
    lib = fake_node("gb200-tray").nvml.library
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    bare = lib.c_nvmlGpuFabricInfo_v2_t()
    bare.version = 0
    with pytest.raises(lib.NVMLError_ArgumentVersionMismatch):
        lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(bare))


def test_arguments_ctypes_cannot_pass_fail_before_c(fake_node: Callable[..., FakeNode]) -> None:
    lib = fake_node("workstation-2x-rtx5090").nvml.library
    lib.nvmlInit()
    a, b = lib.nvmlDeviceGetHandleByIndex(0), lib.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(ctypes.ArgumentError):  # the wheel's NVML_P2P_CAPS_INDEX_READ is (0,)
        lib.nvmlDeviceGetP2PStatus(a, b, lib.NVML_P2P_CAPS_INDEX_READ)
    assert lib.nvmlDeviceGetP2PStatus(a, b, 0) == lib.NVML_P2P_STATUS_OK
    with pytest.raises(NvmlAbiError, match="device handle"):
        lib.nvmlDeviceGetUUID(0)  # an index is not a handle


def test_the_adapter_would_crash_on_hardware_if_it_passed_the_struct_by_value(
    fake_node: Callable[..., FakeNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: main before this fix called `nvmlDeviceGetGpuFabricInfoV(handle, info)`."""
    node = fake_node("gb200-tray")
    node.nvml.fabric[0] = NVL72_FABRIC
    assert Nvml(node.nvml.library).read().gpus[0].fabric == NVL72_FABRIC
    monkeypatch.setattr(ctypes, "byref", lambda obj, offset=0: obj)  # the old, by-value call
    with pytest.raises(NvmlAbiError):
        Nvml(node.nvml.library).read()


def test_no_driver_is_the_loader_failing_as_on_a_node_without_one(
    fake_node: Callable[..., FakeNode],
) -> None:
    lib = fake_node("dgx-h100", driver=False).nvml.library
    with pytest.raises(lib.NVMLError_LibraryNotFound):
        lib.nvmlInit()


def test_a_reading_has_every_gpu_fact_the_issue_lists(fake_node: Callable[..., FakeNode]) -> None:
    reading = Nvml(fake_node("hgx-a100-roce").nvml.library).read()
    g = reading.gpus[5]
    assert g.uuid.startswith("GPU-")
    assert g.pci_bus_id == "0000:68:00.0"
    assert (g.name, g.memory_mib, g.compute_capability) == ("NVIDIA A100-SXM4-80GB", 81920, "8.0")
    assert (g.numa_node, g.cpu_affinity) == (1, "32-63,96-127")
    assert (g.pcie_generation, g.pcie_width, g.pcie_max_generation, g.pcie_max_width) == (
        4,
        16,
        4,
        16,
    )
    assert len(g.nvlinks) == 12
    assert {(lk.active, lk.remote_type, nvlink_generation(lk.version)) for lk in g.nvlinks} == {
        (True, RemoteType.SWITCH, 3)
    }
    assert all(
        lk.errors == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0} for lk in g.nvlinks
    )
    assert g.fabric is None
    assert len(reading.pairs) == 28
    assert {p.p2p_read for p in reading.pairs} == {P2pStatus.OK}
    assert reading.problems == ()
    assert reading.status.driver_version == "550.54.15"
    assert reading.status.cuda_version == "12.4"


def test_p2p_status_reads_as_nvidia_smi_codes(fake_node: Callable[..., FakeNode]) -> None:
    node = fake_node("workstation-2x-rtx5090")
    node.nvml.p2p[(0, 1)] = P2pStatus.GPU_NOT_SUPPORTED  # as the recording's p2p block says
    pair = Nvml(node.nvml.library).read().pair(1, 0)
    assert pair is not None
    assert pair.p2p_read is P2pStatus.GPU_NOT_SUPPORTED
    assert pair.p2p_read.code == "GNS"


def test_a_driver_loaded_after_start_is_picked_up_on_the_next_read(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("g5-a10g-8x", driver=False)
    nvml = Nvml(node.nvml.library)
    assert not nvml.read().status.up
    node.nvml.driver = True
    reading = nvml.read()
    assert reading.status.up
    assert len(reading.gpus) == 8
    nvml.close()
    assert node.nvml.calls["nvmlShutdown"] == 1


@pytest.mark.parametrize(
    ("version", "want"),
    [
        pytest.param(1, 1, id="1.0 is P100's NVLink 1"),
        pytest.param(3, 2, id="2.2 is still NVLink 2 (V100)"),
        pytest.param(5, 3, id="3.1 is still NVLink 3 (A100)"),
        pytest.param(6, 4, id="4.0 is H100's NVLink 4"),
        pytest.param(7, 5, id="5.0 is Blackwell's NVLink 5"),
        pytest.param(None, 0, id="unknown stays unknown"),
        pytest.param(99, 0, id="a future value is unknown, not a guess"),
    ],
)
def test_nvml_nvlink_versions_map_to_generations(version: int | None, want: int) -> None:
    assert nvlink_generation(version) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("00000000:18:00.0", "0000:18:00.0", id="NVML's 8-digit domain"),
        pytest.param("0000:18:00.0", "0000:18:00.0", id="sysfs's form is kept"),
        pytest.param("00000001:1A:00.0", "0001:1a:00.0", id="upper case hex"),
        pytest.param("18:00.0", "0000:18:00.0", id="no domain means domain 0"),
        pytest.param(" junk ", "junk", id="not an address: stripped, otherwise kept"),
    ],
)
def test_bus_ids_normalise_to_the_sysfs_form(text: str, want: str) -> None:
    assert normalise_bus_id(text) == want


# What cannot change while a GPU keeps its UUID is read once (nvml.py rule 6).
_KEPT = (
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetTopologyCommonAncestor",
)
_EVERY_PASS = (
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetP2PStatus",
)


def test_a_second_pass_reads_only_what_can_change_and_finds_the_same(
    fake_node: Callable[..., FakeNode],
) -> None:
    fake = fake_node("dgx-h100").nvml
    nvml = Nvml(fake.library)
    first = nvml.read()
    first_calls = sum(fake.calls.values())
    fake.calls.clear()
    second = nvml.read()
    assert second == first
    assert {name: fake.calls[name] for name in _KEPT} == dict.fromkeys(_KEPT, 0)
    assert all(fake.calls[name] > 0 for name in _EVERY_PASS), fake.calls
    # 18 links a GPU: the first pass learnt how many, so 18 states and not pynvml's 36.
    assert fake.calls["nvmlDeviceGetNvLinkState"] == 8 * 18
    assert sum(fake.calls.values()) < 0.65 * first_calls  # 805 of 1,468 today


def test_what_changes_between_passes_is_seen(fake_node: Callable[..., FakeNode]) -> None:
    fake = fake_node("dgx-h100").nvml
    nvml = Nvml(fake.library)
    nvml.read()
    fake.error_counts[(2, 5, "crc_flit")] = 7
    fake.pcie_current[3] = (1, 16)
    fake.set_nvlink_down(4, 0)
    reading = nvml.read()
    assert reading.gpus[2].nvlinks[5].errors["crc_flit"] == 7
    assert reading.gpus[3].pcie_generation == 1
    assert not reading.gpus[4].nvlinks[0].active
    fake.nvlink_down.clear()
    fake.calls.clear()
    back = nvml.read().gpus[4].nvlinks[0]
    assert back.active
    assert back.remote_type is RemoteType.SWITCH
    # The link came back: where it goes is read again, for that link alone.
    assert fake.calls["nvmlDeviceGetNvLinkRemotePciInfo"] == 1


def test_a_failed_read_is_not_kept_but_reported_again_until_it_answers(
    fake_node: Callable[..., FakeNode],
) -> None:
    fake = fake_node("dgx-h100").nvml
    nvml = Nvml(fake.library)
    fake.failing[("nvmlDeviceGetPciInfo", 1)] = "UNKNOWN"
    for _ in range(2):
        reading = nvml.read()
        assert reading.gpus[1].pci_bus_id == ""
        assert any(p.startswith("GPU1 nvmlDeviceGetPciInfo") for p in reading.problems)
    del fake.failing[("nvmlDeviceGetPciInfo", 1)]
    assert nvml.read().gpus[1].pci_bus_id == normalise_bus_id(
        fake.machine.topology.gpus[1].pci_bus_id
    )
    nvml.close()
    fake.calls.clear()
    nvml.read()  # closed and opened again: nothing kept from before
    assert fake.calls["nvmlDeviceGetPciInfo"] == 8


@pytest.mark.parametrize("answer", ["INVALID_ARGUMENT", "NOT_SUPPORTED"])
def test_a_link_index_that_does_not_answer_hides_no_link_after_it(
    fake_node: Callable[..., FakeNode], answer: str
) -> None:
    """Nothing promises a GPU's links are numbered without gaps: a link 0 that NVML says
    nothing about (fused off on a cut-down part) must not end the scan, first pass or later."""
    fake = fake_node("dgx-h100").nvml
    fake.link_failing[(0, 0)] = answer
    fake.set_nvlink_down(1, 0)  # down is an answer: the links after it are read too
    nvml = Nvml(fake.library)
    for _ in range(2):
        reading = nvml.read()
        assert [lk.link for lk in reading.gpus[0].nvlinks] == list(range(1, 18))
        assert all(lk.active for lk in reading.gpus[0].nvlinks)
        assert [lk.active for lk in reading.gpus[1].nvlinks] == [False] + [True] * 17
        assert not any("NVLink" in p for p in reading.problems)
