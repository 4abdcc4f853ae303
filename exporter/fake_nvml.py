"""A fake NVML for a whole machine: pynvml's calls, answered from a recorded machine.

NVIDIA's go-nvml ships a fake DGX A100 whose GPUs have no links; discovery here is about links,
so this fake answers every call `exporter.nvml.Nvml` makes with what the machine's hardware
would say: PCIe common ancestors, NVLinks that end at peer GPUs or at NVSwitch chips (with the
remote device type newer drivers report), P2P status, NUMA and CPU affinity masks, fabric info.
It returns the same types as pynvml (`nvmlPciInfo_t`, `c_nvmlMemory_t`, ctypes mask arrays,
str) and raises the same `NVMLError` subclasses, so the adapter cannot tell it from the wheel.

Tests change the hardware through plain attributes: `nvlink_down`, `error_counts`,
`pcie_current`, `utilization`, `fabric`, and `failing` to make one call fail with an NVML
error, for one GPU or all. `driver=False` is a node without a driver.
"""

from __future__ import annotations

import ctypes
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.fake_machine import FakeMachine
from exporter.nvml import (
    memory_struct,
    nvml_error,
    pci_info_struct,
    utilization_struct,
)
from exporter.readings import NVLINK_ERROR_COUNTERS, FabricReading, P2pStatus
from gputopo.importers._lists import parse_idlist
from gputopo.links import LinkKind

__all__ = ["FakeNvml"]

# NVLink generation -> NVML_NVLINK_VERSION_* (4.0 is 6: the enum counts 2.2 and 3.1 too).
_NVML_VERSIONS = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7, 6: 8}
_LEVELS = {
    LinkKind.PIX: 10,
    LinkKind.PXB: 20,
    LinkKind.PHB: 30,
    LinkKind.NODE: 40,
    LinkKind.SYS: 50,
}
_REMOTE_GPU, _REMOTE_SWITCH = 0, 2
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Handle:
    """What nvmlDeviceGetHandleByIndex returns here (pynvml's is an opaque pointer)."""

    index: int


@dataclass(frozen=True, slots=True)
class _Process:
    pid: int
    usedGpuMemory: int  # noqa: N815 - pynvml's field name


class FakeNvml:
    """Answers pynvml's calls for a `FakeMachine` (see the module docstring)."""

    def __init__(
        self,
        machine: FakeMachine,
        *,
        driver: bool = True,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        remote_type_supported: bool = True,
    ) -> None:
        self.machine = machine
        self.driver = driver
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.remote_type_supported = remote_type_supported
        topology = machine.topology
        self.nvlink_down: set[tuple[int, int]] = set()  # (gpu, link)
        self.error_counts: dict[tuple[int, int, str], int] = {}  # (gpu, link, counter name)
        self.pcie_current: dict[int, tuple[int, int]] = {}  # gpu -> (generation, width)
        self.utilization: dict[int, int] = {}
        self.processes: dict[int, int] = {}
        self.p2p: dict[tuple[int, int], P2pStatus] = {}
        self.fabric: dict[int, FabricReading] = {
            g.index: FabricReading(
                cluster_uuid=g.fabric.cluster_uuid,
                clique_id=g.fabric.clique_id,
                state=int(g.fabric.state),
                health_mask=g.fabric.health_mask,
            )
            for g in topology.gpus
            if g.fabric is not None
        }
        # (call name, gpu index or None for every GPU) -> NVML error name, e.g. "NOT_SUPPORTED".
        self.failing: dict[tuple[str, int | None], str] = {}
        self.calls: Counter[str] = Counter()
        self._initialised = 0

    # --- helpers --------------------------------------------------------------------------

    def _enter(self, call: str, handle: _Handle | None = None) -> None:
        self.calls[call] += 1
        if call not in ("nvmlInit",) and not self._initialised:
            raise nvml_error("UNINITIALIZED")
        index = handle.index if handle is not None else None
        failure = self.failing.get((call, index)) or self.failing.get((call, None))
        if failure is not None:
            raise nvml_error(failure)

    def _gpu(self, handle: _Handle) -> Any:
        return self.machine.topology.gpus[handle.index]

    def _link(self, handle: _Handle, link: int) -> Any:
        links = self.machine.nvlinks[handle.index]
        if not links:
            raise nvml_error("NOT_SUPPORTED")
        if not 0 <= link < len(links):
            raise nvml_error("INVALID_ARGUMENT")
        return links[link]

    def set_nvlink_down(self, gpu: int, link: int) -> None:
        """Take a link down at both ends (the peer's matching link too, for a direct link)."""
        self.nvlink_down.add((gpu, link))
        mine = self.machine.nvlinks[gpu]
        peer = mine[link].peer
        if peer is None:
            return
        nth = sum(1 for other in mine[:link] if other.peer == peer)
        theirs = [at for at, other in enumerate(self.machine.nvlinks[peer]) if other.peer == gpu]
        self.nvlink_down.add((peer, theirs[nth]))

    # --- system ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names throughout
        self._enter("nvmlInit")
        if not self.driver:
            raise nvml_error("LIBRARY_NOT_FOUND")
        self._initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown")
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return self.machine.topology.gpu_count

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex", _Handle(index))
        if not 0 <= index < self.machine.topology.gpu_count:
            raise nvml_error("INVALID_ARGUMENT")
        return _Handle(index)

    # --- one GPU --------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle, /) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetUUID", handle)
        return str(self._gpu(handle).uuid)

    def nvmlDeviceGetName(self, handle: _Handle, /) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetName", handle)
        return str(self._gpu(handle).name)

    def nvmlDeviceGetPciInfo(self, handle: _Handle, /) -> Any:  # noqa: N802
        self._enter("nvmlDeviceGetPciInfo", handle)
        return pci_info_struct(bus_id=self._gpu(handle).pci_bus_id, device_id=0x233010DE)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, /) -> Any:  # noqa: N802
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        return memory_struct(total_bytes=self._gpu(handle).memory_mib * _MIB)

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle, /) -> tuple[int, int]:  # noqa: N802
        self._enter("nvmlDeviceGetCudaComputeCapability", handle)
        text = self._gpu(handle).compute_capability
        if not text:
            raise nvml_error("NOT_SUPPORTED")
        major, minor = text.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetMemoryAffinity(  # noqa: N802
        self, handle: _Handle, node_set_size: int, scope: int, /
    ) -> Sequence[int]:
        self._enter("nvmlDeviceGetMemoryAffinity", handle)
        node = self._gpu(handle).numa_node
        if node is None:
            raise nvml_error("NOT_SUPPORTED")
        return _mask([node], node_set_size)

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpu_set_size: int, /) -> Sequence[int]:  # noqa: N802
        self._enter("nvmlDeviceGetCpuAffinity", handle)
        text = self._gpu(handle).cpu_affinity
        return _mask(parse_idlist(text) if text else [], cpu_set_size)

    def _pcie(self, handle: _Handle, *, current: bool) -> tuple[int, int]:
        g = self._gpu(handle)
        if current and handle.index in self.pcie_current:
            return self.pcie_current[handle.index]
        if current:
            return g.pcie_generation, g.pcie_width
        return (g.pcie_max_generation or g.pcie_generation, g.pcie_max_width or g.pcie_width)

    def _known(self, value: int) -> int:
        if value <= 0:
            raise nvml_error("NOT_SUPPORTED")
        return value

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return self._known(self._pcie(handle, current=True)[0])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return self._known(self._pcie(handle, current=True)[1])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return self._known(self._pcie(handle, current=False)[0])

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return self._known(self._pcie(handle, current=False)[1])

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle, /) -> Any:  # noqa: N802
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return utilization_struct(gpu_percent=self.utilization.get(handle.index, 0))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle, /) -> list[Any]:  # noqa: N802
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [_Process(1000 + n, _MIB) for n in range(self.processes.get(handle.index, 0))]

    def nvmlDeviceGetGpuFabricInfoV(self, handle: _Handle, info: Any, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuFabricInfoV", handle)
        found = self.fabric.get(handle.index)
        if found is None:
            info.state = 0  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return 0
        for at, byte in enumerate(uuid.UUID(found.cluster_uuid).bytes):
            info.clusterUuid[at] = byte
        info.cliqueId = found.clique_id
        info.state = found.state
        info.status = found.status
        info.healthMask = found.health_mask
        return 0

    # --- NVLink ---------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkState", handle)
        self._link(handle, link)
        return 0 if (handle.index, link) in self.nvlink_down else 1

    def nvmlDeviceGetNvLinkVersion(self, handle: _Handle, link: int, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkVersion", handle)
        self._link(handle, link)
        generation = self._gpu(handle).nvlink_generation
        return _NVML_VERSIONS.get(generation, 0)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int, /) -> Any:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        found = self._link(handle, link)
        return pci_info_struct(bus_id=found.remote_bus_id, device_id=found.remote_device_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        if not self.remote_type_supported:
            raise nvml_error("FUNCTION_NOT_FOUND")
        found = self._link(handle, link)
        return _REMOTE_SWITCH if found.to_switch else _REMOTE_GPU

    def nvmlDeviceGetNvLinkErrorCounter(  # noqa: N802
        self, handle: _Handle, link: int, counter: int, /
    ) -> int:
        self._enter("nvmlDeviceGetNvLinkErrorCounter", handle)
        self._link(handle, link)
        name = next(n for n, c in NVLINK_ERROR_COUNTERS.items() if c == counter)
        return self.error_counts.get((handle.index, link, name), 0)

    # --- pairs ----------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, a: _Handle, b: _Handle, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTopologyCommonAncestor", a)
        if a.index == b.index:
            return 0
        return _LEVELS[self.machine.pcie_kind(a.index, b.index)]

    def nvmlDeviceGetP2PStatus(self, a: _Handle, b: _Handle, index: int, /) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetP2PStatus", a)
        if not isinstance(index, int):
            raise TypeError("p2pIndex must be an int (NVML_P2P_CAPS_INDEX_READ is a tuple)")
        key = (min(a.index, b.index), max(a.index, b.index))
        return int(self.p2p.get(key, P2pStatus.OK))


def _mask(ids: Sequence[int], words: int) -> Sequence[int]:
    """A mask as pynvml returns it: a ctypes array of `words` 64-bit words."""
    values = [0] * words
    for i in ids:
        if i < words * 64:
            values[i // 64] |= 1 << (i % 64)
    array: Sequence[int] = (ctypes.c_ulonglong * words)(*values)  # type: ignore[assignment]
    return array
