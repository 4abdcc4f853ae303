"""The NVML adapter: real pynvml on this GPU-less machine, and the fake that stands in for GPUs."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from exporter.fake_machine import FakeMachine
from exporter.fake_nvml import FakeNvml
from exporter.nvml import Nvml, nvml_error
from exporter.readings import P2pStatus, RemoteType, normalise_bus_id, nvlink_generation
from tests.exporter.conftest import FakeNode


def test_on_this_machine_nvml_is_down_and_says_why() -> None:
    nvml = Nvml()
    reading = nvml.read()
    assert not reading.status.up
    assert "libnvidia-ml.so.1" in reading.status.reason
    assert reading.gpus == ()
    assert nvml.activity() == ()
    nvml.close()  # nothing to shut down: no error either


def test_the_fake_raises_the_wheels_error_classes() -> None:
    fake = FakeNvml(FakeMachine.from_profile("workstation-2x-rtx5090", node_name="w"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetNvLinkState(handle, 0)  # an RTX 5090 has no NVLink
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(2)
    assert isinstance(nvml_error("GPU_IS_LOST"), pynvml.NVMLError_GpuIsLost)


def test_the_fake_answers_with_pynvml_types(fake_node: Callable[..., FakeNode]) -> None:
    fake = fake_node("hgx-a100-roce").nvml
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(fake.nvmlDeviceGetPciInfo(handle), pynvml.nvmlPciInfo_t)
    assert fake.nvmlDeviceGetPciInfo(handle).busId == "00000000:18:00.0"  # 8-digit domain
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert (
        fake.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    )
    assert fake.nvmlDeviceGetNvLinkVersion(handle, 0) == pynvml.NVML_NVLINK_VERSION_3_0
    peer = fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(TypeError):  # the wheel's NVML_P2P_CAPS_INDEX_READ is the tuple (0,)
        fake.nvmlDeviceGetP2PStatus(handle, peer, pynvml.NVML_P2P_CAPS_INDEX_READ)


def test_a_reading_has_every_gpu_fact_the_issue_lists(fake_node: Callable[..., FakeNode]) -> None:
    reading = Nvml(fake_node("hgx-a100-roce").nvml).read()
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
    pair = Nvml(node.nvml).read().pair(1, 0)
    assert pair is not None
    assert pair.p2p_read is P2pStatus.GPU_NOT_SUPPORTED
    assert pair.p2p_read.code == "GNS"


def test_a_driver_loaded_after_start_is_picked_up_on_the_next_read(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("g5-a10g-8x", driver=False)
    nvml = Nvml(node.nvml)
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
