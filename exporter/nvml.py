"""The NVML adapter: the only module that imports `pynvml` (an import-linter contract says so).

`Nvml` makes every NVML call discovery needs and returns a plain `NvmlReading`. It talks to an
`NvmlLibrary`: the real `pynvml` module by default, or a private copy of that same module loaded
over a fake libnvidia-ml (`exporter.fake_nvml`), so the wheel's wrappers, structs and errors run
in tests exactly as on hardware, and the code below cannot tell the two apart.

Rules the calls follow, and why:

1. An NVML error degrades the one field it was about, never the agent: the field stays unknown
   and `problems` gets a line naming the GPU, the call and NVML's message. `NotSupported` is an
   answer, not a problem, for optional features (NVLink on a PCIe card, fabric info off GB200).
2. NVSwitch is recognised by `nvmlDeviceGetNvLinkRemoteDeviceType`, not by comparing PCI
   addresses: go-gpuallocator counts a pair's NVLinks by matching the far end's bus id with the
   peer's, which finds nothing on NVSwitch systems, where every link ends at a switch. Only
   drivers too old to have that call fall back to the addresses (a far end that is a GPU of this
   node is a GPU; another NVIDIA device is taken for a switch).
3. `NVML_P2P_CAPS_INDEX_READ` is `(0,)` in the wheel (a stray trailing comma), so the index is
   passed as the literal 0.
4. The calls block; the agent runs `read()` in a worker thread.
5. At the C boundary (audited after a real H100 segfaulted): pynvml builds and passes its own
   structs and buffers for every call here except `nvmlDeviceGetGpuFabricInfoV`, whose struct the
   caller makes and pynvml hands to C untouched, so it goes by pointer (`ctypes.byref`), with the
   version the struct's constructor sets. Strings come back from pynvml already cut at the NUL.
   Enums come back as ints and map to `RemoteType`/`P2pStatus` with UNKNOWN for values a newer
   driver adds. Versioned entry points (`_v2`, `_v3`) are pynvml's choice, not ours.
6. What cannot change while a GPU keeps its UUID is read once and kept: what the GPU is (PCI
   address, name, memory, compute capability, NUMA node, the most its PCIe link can train at,
   how many link indices NVML answers for), the PCIe common ancestor of each pair, and, per
   link while it stays up, what an active NVLink is and where it goes (version, far end's PCI
   address and device type). Every pass still reads the UUID, utilisation, CPU affinity (CPUs
   taken offline leave it, as sysfs.py's `local_cpulist` does), the PCIe link as trained now,
   each link's state and error counters, fabric state and P2P status.
   Kept facts are dropped when a link is seen down, a GPU is gone or NVML is closed; a read
   that failed is not kept, so its problem is reported again on the next pass. On an 8-GPU
   NVSwitch node that is about 800 NVML round trips per pass instead of about 1,460.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pynvml

from exporter.readings import (
    NVLINK_ERROR_COUNTERS,
    FabricReading,
    GpuActivity,
    GpuReading,
    NvLinkReading,
    NvmlReading,
    P2pStatus,
    PairReading,
    RemoteType,
    normalise_bus_id,
)
from gputopo.importers.idlists import format_cpulist
from gputopo.topology import NvmlStatus

__all__ = ["NVLINK_MAX_LINKS", "XID_APPLICATION_ERRORS", "Nvml", "NvmlLibrary", "XidEvents"]

log = logging.getLogger(__name__)

T = TypeVar("T")

NVLINK_MAX_LINKS: int = pynvml.NVML_NVLINK_MAX_LINKS

_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
_XID_CRITICAL = pynvml.nvmlEventTypeXidCriticalError
# XIDs an application causes (a bad kernel, a reset it asked for), which say nothing of the GPU:
# NVIDIA's device plugin skips the same ones (NVIDIA/k8s-device-plugin, internal/rm/health.go).
XID_APPLICATION_ERRORS = frozenset({13, 31, 43, 45, 68, 109})
# An optional feature the GPU or driver lacks: an answer, not a problem.
_ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
_P2P_READ = 0  # NVML_P2P_CAPS_INDEX_READ, which the wheel defines as the tuple (0,)
_AFFINITY_SCOPE_NODE = pynvml.NVML_AFFINITY_SCOPE_NODE
_FABRIC_STATE_NOT_SUPPORTED = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
_MIB = 1024 * 1024

_INIT_REASONS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this node, or the "
        "container was started without the NVIDIA runtime"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "NVML and the kernel driver are of different versions (driver upgraded without reboot?)"
    ),
}


class NvmlLibrary(Protocol):
    """The part of pynvml's API gputopo calls (names and argument order as in pynvml).

    The real `pynvml` module, or a copy of it over a fake C library (`exporter.fake_nvml`):
    errors are caught as the library's own `NVMLError`, and structs the caller fills are made
    from the library's own classes, so both stay the wheel's.
    """

    NVMLError: type[Exception]
    c_nvmlGpuFabricInfoV_t: Callable[[], Any]  # noqa: N815 - pynvml's name

    def nvmlInit(self) -> None: ...  # noqa: N802 - pynvml's names
    def nvmlShutdown(self) -> None: ...  # noqa: N802
    def nvmlSystemGetDriverVersion(self) -> str: ...  # noqa: N802
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...  # noqa: N802
    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...  # noqa: N802
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str: ...  # noqa: N802
    def nvmlDeviceGetName(self, handle: Any, /) -> str: ...  # noqa: N802
    def nvmlDeviceGetPciInfo(self, handle: Any, /) -> Any: ...  # noqa: N802
    def nvmlDeviceGetMemoryInfo(self, handle: Any, /) -> Any: ...  # noqa: N802
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, /) -> tuple[int, int]: ...  # noqa: N802
    def nvmlDeviceGetMemoryAffinity(  # noqa: N802
        self, handle: Any, node_set_size: int, scope: int, /
    ) -> Sequence[int]: ...
    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpu_set_size: int, /) -> Sequence[int]: ...  # noqa: N802
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int, /) -> Any: ...  # noqa: N802
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetNvLinkErrorCounter(  # noqa: N802
        self, handle: Any, link: int, counter: int, /
    ) -> int: ...
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any, /) -> int: ...  # noqa: N802 - info: a pointer (ctypes.byref)
    def nvmlDeviceGetUtilizationRates(self, handle: Any, /) -> Any: ...  # noqa: N802
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any, /) -> list[Any]: ...  # noqa: N802
    def nvmlEventSetCreate(self) -> Any: ...  # noqa: N802
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int, /) -> Any: ...  # noqa: N802
    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, events: Any, /) -> None: ...  # noqa: N802
    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int, /) -> Any: ...  # noqa: N802
    def nvmlEventSetFree(self, events: Any, /) -> None: ...  # noqa: N802


class _Calls:
    """Makes NVML calls that degrade: an error becomes None and, unless expected, a problem."""

    def __init__(self, error: type[Exception]) -> None:
        self.problems: list[str] = []
        self.errors = 0
        self._error = error

    def get(
        self,
        what: str,
        call: Callable[..., T],
        *args: object,
        absent: frozenset[int] | None = _ABSENT,
    ) -> T | None:
        """`call(*args)`, or None when NVML fails; `absent=None` expects any error."""
        try:
            return call(*args)
        except self._error as error:
            if absent is not None and _code(error) not in absent:
                self.errors += 1
                self.problems.append(f"{what}: {error}")
            return None


class Nvml:
    """Reads a node's GPUs through NVML (see the module docstring).

    `open()` initialises NVML and says whether it is up; `read()` opens it first when needed,
    so a driver installed after the agent started is picked up on the next pass. Thread-safe:
    one read at a time.
    """

    def __init__(
        self, library: NvmlLibrary | None = None, *, cpu_set_words: int | None = None
    ) -> None:
        self._lib: NvmlLibrary = library if library is not None else pynvml
        # Words of 64 CPUs for the affinity masks: enough for every CPU of this machine.
        self._cpu_words = cpu_set_words or max(16, -(-(os.cpu_count() or 1) // 64))
        self._lock = threading.Lock()
        self._up = False
        self._status = NvmlStatus(up=False, reason="NVML not opened yet")
        # What cannot change while a GPU keeps its UUID (rule 6): what it is, what its active
        # links are and where they go, and the PCIe common ancestor of each pair.
        self._known: dict[str, _Identity] = {}
        self._wiring: dict[tuple[str, int], _Wiring] = {}
        self._ancestors: dict[tuple[str, str], int] = {}
        self._link_counts: dict[str, int] = {}  # link indices NVML answers for, per GPU

    @property
    def status(self) -> NvmlStatus:
        """What the last open said."""
        return self._status

    def open(self) -> NvmlStatus:
        """Initialise NVML if it is not up; never raises."""
        with self._lock:
            return self._open()

    def _open(self) -> NvmlStatus:
        if self._up:
            return self._status
        try:
            self._lib.nvmlInit()
        except self._lib.NVMLError as error:
            reason = _INIT_REASONS.get(_code(error), f"nvmlInit failed: {error}")
            self._status = NvmlStatus(up=False, reason=reason)
            return self._status
        except OSError as error:  # a broken libnvidia-ml.so that cannot be loaded
            self._status = NvmlStatus(up=False, reason=f"cannot load NVML: {error}")
            return self._status
        self._up = True
        calls = _Calls(self._lib.NVMLError)
        driver = calls.get("nvmlSystemGetDriverVersion", self._lib.nvmlSystemGetDriverVersion)
        cuda = calls.get("nvmlSystemGetCudaDriverVersion", self._lib.nvmlSystemGetCudaDriverVersion)
        self._status = NvmlStatus(
            up=True,
            driver_version=driver or "",
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "",
        )
        return self._status

    def close(self) -> None:
        """Shut NVML down if it is up."""
        with self._lock:
            if self._up:
                _Calls(self._lib.NVMLError).get("nvmlShutdown", self._lib.nvmlShutdown)
                self._up = False
                self._status = NvmlStatus(up=False, reason="NVML closed")
                self._forget_all_but(set())

    def read(self) -> NvmlReading:
        """One pass over every GPU and GPU pair."""
        with self._lock:
            status = self._open()
            if not status.up:
                return NvmlReading(status=status)
            calls = _Calls(self._lib.NVMLError)
            count = calls.get("nvmlDeviceGetCount", self._lib.nvmlDeviceGetCount) or 0
            handles: dict[int, Any] = {}
            for index in range(count):
                handle = calls.get(
                    f"GPU{index} nvmlDeviceGetHandleByIndex",
                    self._lib.nvmlDeviceGetHandleByIndex,
                    index,
                    absent=frozenset(),
                )
                if handle is not None:
                    handles[index] = handle
            # A GPU NVML cannot open stays in the list (its index is its identity), unknown.
            gpus = tuple(
                self._gpu(index, handles[index], calls) if index in handles else GpuReading(index)
                for index in range(count)
            )
            pairs = tuple(
                self._pair(
                    a, b, handles[a], handles[b], uuids=(gpus[a].uuid, gpus[b].uuid), calls=calls
                )
                for a in handles
                for b in handles
                if a < b
            )
            self._forget_all_but({g.uuid for g in gpus if g.uuid})
            return NvmlReading(
                status=status,
                gpus=gpus,
                pairs=pairs,
                problems=tuple(calls.problems),
                errors=calls.errors,
            )

    def _forget_all_but(self, present: set[str]) -> None:
        """Drop what rule 6 keeps about GPUs not in `present` (gone, or no longer answering)."""
        for uuid_ in [u for u in self._known if u not in present]:
            del self._known[uuid_]
        for uuid_ in [u for u in self._link_counts if u not in present]:
            del self._link_counts[uuid_]
        for link in [k for k in self._wiring if k[0] not in present]:
            del self._wiring[link]
        for pair in [p for p in self._ancestors if not (p[0] in present and p[1] in present)]:
            del self._ancestors[pair]

    def mig_parents(self) -> dict[str, int]:
        """MIG device UUID -> the index of its GPU, for every MIG device that exists now (the
        device plugin names MIG devices by these UUIDs); empty without MIG or NVML."""
        with self._lock:
            if not self._open().up:
                return {}
            calls = _Calls(self._lib.NVMLError)
            found: dict[str, int] = {}
            lib = self._lib
            for index in range(calls.get("count", lib.nvmlDeviceGetCount) or 0):
                handle = calls.get("handle", lib.nvmlDeviceGetHandleByIndex, index)
                slots = (
                    calls.get("mig count", lib.nvmlDeviceGetMaxMigDeviceCount, handle)
                    if handle is not None
                    else None
                )
                for slot in range(slots or 0):
                    # An empty slot answers NOT_FOUND: expected, not a problem.
                    mig = calls.get(
                        "mig", lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot, absent=None
                    )
                    uuid = calls.get("mig uuid", lib.nvmlDeviceGetUUID, mig) if mig else None
                    if uuid:
                        found[uuid] = index
            return found

    def activity(self) -> tuple[GpuActivity, ...]:
        """Utilisation and compute processes of every GPU; empty when NVML is down."""
        with self._lock:
            if not self._open().up:
                return ()
            calls = _Calls(self._lib.NVMLError)
            found = []
            for index in range(calls.get("count", self._lib.nvmlDeviceGetCount) or 0):
                handle = calls.get("handle", self._lib.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    continue
                util = calls.get("util", self._lib.nvmlDeviceGetUtilizationRates, handle)
                procs = calls.get("procs", self._lib.nvmlDeviceGetComputeRunningProcesses, handle)
                found.append(
                    GpuActivity(
                        index=index,
                        utilization_percent=None if util is None else int(util.gpu),
                        processes=None if procs is None else len(procs),
                    )
                )
            return tuple(found)

    # --- one GPU --------------------------------------------------------------------------

    def _gpu(self, index: int, handle: Any, calls: _Calls) -> GpuReading:
        lib = self._lib
        me = f"GPU{index}"

        def get(name: str, *args: object, absent: frozenset[int] | None = _ABSENT) -> Any:
            return calls.get(f"{me} {name}", getattr(lib, name), handle, *args, absent=absent)

        essential = frozenset[int]()
        gpu_uuid = get("nvmlDeviceGetUUID", absent=essential) or ""
        known = self._known.get(gpu_uuid) if gpu_uuid else None
        if known is None:
            known = self._identity(get, calls)
            if gpu_uuid and known.complete:
                self._known[gpu_uuid] = known
        util = get("nvmlDeviceGetUtilizationRates")
        cpu_mask = get("nvmlDeviceGetCpuAffinity", self._cpu_words)
        return GpuReading(
            index=index,
            uuid=gpu_uuid,
            pci_bus_id=known.pci_bus_id,
            name=known.name,
            memory_mib=known.memory_mib,
            numa_node=known.numa_node,
            cpu_affinity=format_cpulist(_bits(cpu_mask)) if cpu_mask is not None else "",
            compute_capability=known.compute_capability,
            pcie_generation=get("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth"),
            pcie_max_generation=known.pcie_max_generation,
            pcie_max_width=known.pcie_max_width,
            nvlinks=self._nvlinks(me, handle, gpu_uuid, calls),
            fabric=self._fabric(me, handle, calls),
            utilization_percent=int(util.gpu) if util is not None else None,
        )

    def _identity(self, get: Callable[..., Any], calls: _Calls) -> _Identity:
        """What a GPU is (rule 6); `complete` when no call failed (an optional feature the GPU
        lacks is an answer, and is kept)."""
        essential = frozenset[int]()
        failed = calls.errors
        pci = get("nvmlDeviceGetPciInfo", absent=essential)
        memory = get("nvmlDeviceGetMemoryInfo", absent=essential)
        capability = get("nvmlDeviceGetCudaComputeCapability")
        numa_mask = get("nvmlDeviceGetMemoryAffinity", 4, _AFFINITY_SCOPE_NODE)
        numa_nodes = _bits(numa_mask) if numa_mask is not None else []
        name = get("nvmlDeviceGetName", absent=essential) or ""
        max_generation = get("nvmlDeviceGetMaxPcieLinkGeneration")
        max_width = get("nvmlDeviceGetMaxPcieLinkWidth")
        return _Identity(
            pci_bus_id=normalise_bus_id(str(pci.busId)) if pci is not None else "",
            name=name,
            memory_mib=int(memory.total) // _MIB if memory is not None else None,
            numa_node=numa_nodes[0] if numa_nodes else None,
            compute_capability=f"{capability[0]}.{capability[1]}" if capability else "",
            pcie_max_generation=max_generation,
            pcie_max_width=max_width,
            complete=calls.errors == failed,
        )

    def _nvlinks(
        self, me: str, handle: Any, gpu_uuid: str, calls: _Calls
    ) -> tuple[NvLinkReading, ...]:
        # pynvml's NVML_NVLINK_MAX_LINKS (36) bounds every GPU; an index past this GPU's links
        # answers INVALID_ARGUMENT (an H100 has 18), and a GPU without NVLink NOT_SUPPORTED for
        # every index. Nothing promises a GPU's links are numbered without gaps (a part with a
        # link fused off), so no answer ends the scan: the first pass asks every index and keeps
        # one past the highest that answered (rule 6); later passes ask only those.
        lib = self._lib
        found = []
        kept = self._link_counts.get(gpu_uuid) if gpu_uuid else None
        answered, failed = 0, False
        for link in range(NVLINK_MAX_LINKS if kept is None else kept):
            where = f"{me} NVLink {link}"
            try:
                state = lib.nvmlDeviceGetNvLinkState(handle, link)
            except self._lib.NVMLError as error:
                if _code(error) not in (_NOT_SUPPORTED, _INVALID_ARGUMENT):
                    failed = True
                    answered = link + 1  # a link is there, it could not say how it is
                    calls.errors += 1
                    calls.problems.append(f"{where} nvmlDeviceGetNvLinkState: {error}")
                self._wiring.pop((gpu_uuid, link), None)
                continue
            answered = link + 1
            active = state == pynvml.NVML_FEATURE_ENABLED
            key = (gpu_uuid, link)
            wiring = self._wiring.get(key) if active and gpu_uuid else None
            if wiring is None:
                wiring = self._read_wiring(where, handle, link, active, calls)
                if active and gpu_uuid and wiring.complete:
                    self._wiring[key] = wiring
                else:
                    self._wiring.pop(key, None)
            errors: dict[str, int] = {}
            if active:
                for name, counter in NVLINK_ERROR_COUNTERS.items():
                    value = calls.get(
                        f"{where} error counter {name}",
                        lib.nvmlDeviceGetNvLinkErrorCounter,
                        handle,
                        link,
                        counter,
                    )
                    if value is not None:
                        errors[name] = int(value)
            found.append(
                NvLinkReading(
                    link=link,
                    active=active,
                    version=wiring.version,
                    remote_bus_id=wiring.remote_bus_id,
                    remote_device_id=wiring.remote_device_id,
                    remote_type=wiring.remote_type,
                    errors=errors,
                )
            )
        if kept is None and gpu_uuid and not failed:
            self._link_counts[gpu_uuid] = answered
        return tuple(found)

    def _read_wiring(
        self, where: str, handle: Any, link: int, active: bool, calls: _Calls
    ) -> _Wiring:
        """What a link is and where it goes: three NVML calls."""
        lib = self._lib
        version = calls.get(f"{where} version", lib.nvmlDeviceGetNvLinkVersion, handle, link)
        # The far end of a link that is down may be unknown: that is no problem.
        quiet = None if not active else _ABSENT
        remote = calls.get(
            f"{where} nvmlDeviceGetNvLinkRemotePciInfo",
            lib.nvmlDeviceGetNvLinkRemotePciInfo,
            handle,
            link,
            absent=quiet,
        )
        remote_type = calls.get(
            f"{where} nvmlDeviceGetNvLinkRemoteDeviceType",
            lib.nvmlDeviceGetNvLinkRemoteDeviceType,
            handle,
            link,
            absent=quiet,
        )
        return _Wiring(
            version=version,
            remote_bus_id=normalise_bus_id(str(remote.busId)) if remote else "",
            remote_device_id=int(remote.pciDeviceId) if remote else 0,
            remote_type=_remote_type(remote_type),
            complete=version is not None and remote is not None and remote_type is not None,
        )

    def _fabric(self, me: str, handle: Any, calls: _Calls) -> FabricReading | None:
        # pynvml hands this argument to C as it is: the struct must go by pointer (a struct
        # passed by value is read as an address by libnvidia-ml and kills the process).
        info = self._lib.c_nvmlGpuFabricInfoV_t()
        done = calls.get(
            f"{me} nvmlDeviceGetGpuFabricInfoV",
            self._lib.nvmlDeviceGetGpuFabricInfoV,
            handle,
            ctypes.byref(info),
        )
        if done is None or info.state == _FABRIC_STATE_NOT_SUPPORTED:
            return None
        return FabricReading(
            cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
            health_mask=int(info.healthMask),
        )

    def _pair(
        self, a: int, b: int, ha: Any, hb: Any, *, uuids: tuple[str, str], calls: _Calls
    ) -> PairReading:
        where = f"GPU{a}-GPU{b}"
        level = self._ancestors.get(uuids) if all(uuids) else None
        if level is None:
            level = calls.get(
                f"{where} nvmlDeviceGetTopologyCommonAncestor",
                self._lib.nvmlDeviceGetTopologyCommonAncestor,
                ha,
                hb,
            )
            if level is not None and all(uuids):
                self._ancestors[uuids] = level
        p2p = calls.get(
            f"{where} nvmlDeviceGetP2PStatus", self._lib.nvmlDeviceGetP2PStatus, ha, hb, _P2P_READ
        )
        return PairReading(
            a=a,
            b=b,
            common_ancestor=level,
            p2p_read=_p2p_status(p2p),
        )


@dataclass(frozen=True, slots=True)
class _Identity:
    """What a GPU is; `complete` when every call answered."""

    pci_bus_id: str
    name: str
    memory_mib: int | None
    numa_node: int | None
    compute_capability: str
    pcie_max_generation: int | None
    pcie_max_width: int | None
    complete: bool


@dataclass(frozen=True, slots=True)
class _Wiring:
    """What a link is and where it goes; `complete` when every call answered."""

    version: int | None
    remote_bus_id: str
    remote_device_id: int
    remote_type: RemoteType | None
    complete: bool


def _code(error: Exception) -> int:
    """NVML's return code carried by an `NVMLError`."""
    return int(getattr(error, "value", -1))


def _bits(words: Sequence[int]) -> list[int]:
    """Set bit positions of a mask given as 64-bit words, least significant word first."""
    found = []
    for at, word in enumerate(words):
        value = int(word)
        while value:  # one step per set bit, not 64 per word (masks are mostly zero words)
            low = value & -value
            found.append(at * 64 + low.bit_length() - 1)
            value ^= low
    return found


def _remote_type(value: int | None) -> RemoteType | None:
    if value is None:
        return None
    try:
        return RemoteType(value)
    except ValueError:
        return RemoteType.UNKNOWN


def _p2p_status(value: int | None) -> P2pStatus | None:
    if value is None:
        return None
    try:
        return P2pStatus(value)
    except ValueError:
        return P2pStatus.UNKNOWN


class XidEvents:
    """Critical XID errors of every GPU, from an NVML event set: what makes NVIDIA's device
    plugin mark a GPU unhealthy. `open` registers every GPU that supports the event (a GPU that
    does not is left out, and `open` says so); `wait` blocks up to `timeout_ms` (run it in a
    thread) and returns `(GPU index, XID)` of the errors that came, application errors
    (`XID_APPLICATION_ERRORS`) left out. Never raises for NVML's sake."""

    def __init__(self, nvml: Nvml) -> None:
        self._lib = nvml._lib  # the adapter's own library: this module is its home
        self._nvml = nvml
        self._set: Any = None
        self._by_uuid: dict[str, int] = {}

    def open(self) -> str:
        """Register; "" when some GPU is watched, else why none is."""
        if not self._nvml.open().up:
            return f"NVML is not up: {self._nvml.status.reason}"
        lib = self._lib
        try:
            self._set = lib.nvmlEventSetCreate()
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as error:
            return f"no NVML events: {error}"
        skipped = []
        for index in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                lib.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, self._set)
                self._by_uuid[lib.nvmlDeviceGetUUID(handle)] = index
            except lib.NVMLError as error:
                skipped.append(f"GPU{index}: {error}")
        if skipped:
            log.warning("XID errors are not watched on %s", "; ".join(skipped))
        return "" if self._by_uuid else "no GPU supports XID events"

    def wait(self, timeout_ms: int) -> list[tuple[int, int]]:
        """The XID errors within `timeout_ms` (the first blocks; any more already queued)."""
        lib = self._lib
        found: list[tuple[int, int]] = []
        wait_ms = timeout_ms
        while self._set is not None:
            try:
                event = lib.nvmlEventSetWait_v2(self._set, wait_ms)
            except lib.NVMLError as error:
                if _code(error) != _TIMEOUT:
                    log.warning("waiting for NVML events failed: %s", error)
                return found
            wait_ms = 0
            if event.eventType != _XID_CRITICAL or event.eventData in XID_APPLICATION_ERRORS:
                continue
            try:
                index = self._by_uuid.get(lib.nvmlDeviceGetUUID(event.device))
            except lib.NVMLError:
                index = None
            if index is not None:
                found.append((index, int(event.eventData)))
        return found

    def close(self) -> None:
        if self._set is not None:
            try:
                self._lib.nvmlEventSetFree(self._set)
            except self._lib.NVMLError as error:
                log.debug("nvmlEventSetFree: %s", error)
            self._set = None
