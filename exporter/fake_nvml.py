"""A fake NVML for a whole machine, faked at the C library, so pynvml's own Python runs for real.

Why the C boundary: on a real H100 every NVML path crashed the process because one struct went
to `nvmlDeviceGetGpuFabricInfoV` by value where libnvidia-ml takes a pointer. The fake of that
day answered pynvml's *Python* functions, so it never saw what the caller handed the library,
and 700 tests stayed green. Here the fake stands where `libnvidia-ml.so.1` stands:

1. `FakeNvml.library` is a private copy of the installed `pynvml` module whose dynamic loader
   (`CDLL`) returns `FakeLibNvml` instead of the driver's library. Every wrapper, struct, version
   constant and error class is the wheel's own; only the functions behind `_nvmlGetFunctionPointer`
   are fake. A copy per fake keeps machines apart (pynvml keeps its library in a module global).
2. `FakeLibNvml` exposes the C entry points pynvml resolves (`nvmlDeviceGetCount_v2`,
   `nvmlDeviceGetPciInfo_v3`, ...). Each takes its arguments as ctypes hands them to a C function
   and checks them the way the ABI would: a Python object ctypes cannot convert raises
   `ctypes.ArgumentError` (as the real call does before it reaches C); a struct, union or array
   passed by value where C expects a pointer, a NULL or foreign pointer, or a handle NVML never
   gave out raises `NvmlAbiError`: on hardware that is a segmentation fault, here a failing test.
   Versioned structs must carry their version (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH` otherwise),
   and outputs are written into the caller's memory with the C layout, as the library does.
3. The hardware comes from a `FakeMachine` (built from recordings). Tests change it through plain
   attributes: `nvlink_down`, `error_counts`, `pcie_current`, `utilization`, `processes`, `p2p`,
   `fabric`, `failing` to make one call return an NVML error for one GPU or all (keyed by
   pynvml's function name without its `_vN` suffix), and `link_failing` for every call on one
   link. `driver=False` is a node where the loader
   cannot find libnvidia-ml at all. `calls` counts calls by the same names.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import re
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pynvml  # the installed wheel: only its file is used, to load private copies

from exporter.fake_machine import FakeMachine
from exporter.readings import NVLINK_ERROR_COUNTERS, FabricReading, P2pStatus, normalise_bus_id
from gputopo.importers.idlists import parse_idlist
from gputopo.links import LinkKind

__all__ = ["FakeLibNvml", "FakeNvml", "NvmlAbiError", "load_pynvml_over"]

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
_GPU_DEVICE_ID = 0x233010DE

# NVML return codes by name (nvml.h `nvmlReturn_t`).
_CODES: dict[str, int] = {
    name.removeprefix("NVML_ERROR_"): int(getattr(pynvml, name))
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}
_SUCCESS = 0
# Versions of the versioned structs NVML accepts, per entry point (nvml.h `nvml*_v*` macros).
_FABRIC_VERSIONS = frozenset({pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3})
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_CArg = type(ctypes.byref(ctypes.c_int()))
_CONVERTIBLE = (
    type(None),
    int,
    bytes,
    str,
    ctypes._SimpleCData,
    ctypes.Structure,
    ctypes.Union,
    ctypes.Array,
    ctypes._Pointer,
    _CArg,
)
_CONVERTIBLE_TYPES: set[type] = set()


class NvmlAbiError(RuntimeError):
    """An argument the real libnvidia-ml would crash on (the process dies; the test fails)."""


def load_pynvml_over(library: Callable[[], object] | None) -> ModuleType:
    """A private copy of the installed pynvml whose loader gives `library()` (None: not found).

    The copy is the wheel's file executed as a new module, so its wrappers, structs and error
    classes are the real ones; only `CDLL`, the loader it calls for `libnvidia-ml.so.1`, differs.
    """
    name = f"_gputopo_fake_pynvml_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, pynvml.__file__)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a copy of pynvml from {pynvml.__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pynvml registers its error classes through sys.modules
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]

    def load(path: str, *args: object, **kwargs: object) -> object:
        found = library() if library is not None else None
        if found is None:
            raise OSError(f"{path}: cannot open shared object file: No such file or directory")
        return found

    module.CDLL = load  # type: ignore[attr-defined]
    return module


_copies = itertools.count()


@dataclass(frozen=True, slots=True)
class _Out:
    """The caller's memory a pointer argument points at."""

    target: Any

    def write(self, ctype: Any, **fields: object) -> Any:
        """Lay `ctype` over the memory (as C would see it) and set fields; returns the view."""
        if ctypes.sizeof(self.target) < ctypes.sizeof(ctype):
            raise NvmlAbiError(
                f"a {type(self.target).__name__} of {ctypes.sizeof(self.target)} bytes where "
                f"NVML writes a {ctype.__name__} of {ctypes.sizeof(ctype)}"
            )
        view = ctype.from_buffer(self.target)
        for key, value in fields.items():
            setattr(view, key, value)
        return view

    def set(self, ctype: Any, value: object) -> None:
        """Write one scalar of C type `ctype`."""
        self.write(ctype).value = value

    def string(self, text: str, size: int) -> int:
        """Copy a NUL-terminated string of at most `size` bytes; INSUFFICIENT_SIZE if too long."""
        raw = text.encode() + b"\0"
        if len(raw) > size or len(raw) > ctypes.sizeof(self.target):
            return _CODES["INSUFFICIENT_SIZE"]
        ctypes.memmove(ctypes.addressof(self.target), raw, len(raw))
        return _SUCCESS


def _pointer(arg: object, what: str, *, nullable: bool = False) -> _Out | None:
    """What a pointer argument points at; NvmlAbiError for anything C cannot take as one."""
    if arg is None:
        if nullable:
            return None
        raise NvmlAbiError(f"{what}: NULL where NVML writes its answer")
    if isinstance(arg, _CArg):
        return _Out(arg._obj)  # type: ignore[attr-defined]
    if isinstance(arg, ctypes.Array):
        return _Out(arg)  # an array decays to a pointer to its first element
    if isinstance(arg, ctypes._Pointer):
        if not arg:
            raise NvmlAbiError(f"{what}: NULL pointer")
        return _Out(arg.contents)
    if isinstance(arg, (ctypes.Structure, ctypes.Union)):
        raise NvmlAbiError(
            f"{what}: a {type(arg).__name__} passed by value where NVML takes a pointer "
            "(pass ctypes.byref(...)); libnvidia-ml dereferences it and the process crashes"
        )
    raise NvmlAbiError(f"{what}: {type(arg).__name__} {arg!r} is not a pointer")


def _uint(arg: object, what: str) -> int:
    """An integer argument as C receives it."""
    if type(arg) is int:
        return arg  # the common case, pynvml passing a Python int
    if isinstance(arg, bool) or not isinstance(arg, (int, ctypes._SimpleCData)):
        raise NvmlAbiError(f"{what}: {type(arg).__name__} where NVML takes an integer")
    value = arg if isinstance(arg, int) else arg.value
    if not isinstance(value, int):
        raise NvmlAbiError(f"{what}: {type(arg).__name__} where NVML takes an integer")
    return value


def _convertible(name: str, args: tuple[object, ...]) -> None:
    """ctypes refuses Python objects it cannot pass to C before the call happens."""
    for at, arg in enumerate(args, start=1):
        kind = type(arg)
        if kind in _CONVERTIBLE_TYPES:
            continue
        if isinstance(arg, _CONVERTIBLE):
            _CONVERTIBLE_TYPES.add(kind)  # the same answer for every object of this type
        else:
            raise ctypes.ArgumentError(
                f"argument {at}: TypeError: Don't know how to convert parameter {at} ({name})"
            )


class FakeLibNvml:
    """The C entry points of libnvidia-ml that pynvml calls for gputopo, over a `FakeNvml`.

    Attribute lookup is how pynvml's `_nvmlGetFunctionPointer` finds a function in a `CDLL`; an
    entry point not defined here raises AttributeError, which pynvml turns into
    `NVMLError_FunctionNotFound`, as for a driver too old to have it.
    """

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake
        # One opaque object per GPU; its address is the handle NVML gives out.
        self._devices = [ctypes.create_string_buffer(16) for _ in fake.machine.topology.gpus]
        self._by_address = {ctypes.addressof(d): i for i, d in enumerate(self._devices)}

    def __getattr__(self, name: str) -> Any:
        method = getattr(type(self), f"_c_{name}", None)
        if method is None:
            raise AttributeError(name)
        bound = method.__get__(self)

        def entry(*args: object) -> int:
            _convertible(name, args)
            return int(bound(*args))

        # pynvml keeps what it looked up (`_nvmlGetFunctionPointer_cache`), so this runs once
        # per entry point and copy; the per-call path below stays short.
        return entry

    # --- plumbing -------------------------------------------------------------------------

    def _enter(self, name: str, handle: object = None) -> tuple[int | None, int]:
        """Count the call, check NVML is up, and find the GPU: (gpu index, return code)."""
        fake = self._fake
        call = _PYTHON_NAMES.get(name) or _python_name(name)
        fake.calls[call] += 1
        index = self._gpu(handle, name) if handle is not None else None
        if call != "nvmlInit" and fake.initialised <= 0:
            return index, _CODES["UNINITIALIZED"]
        if not fake.failing:
            return index, _SUCCESS
        failure = fake.failing.get((call, index)) or fake.failing.get((call, None))
        if failure is not None:
            return index, _CODES[failure]
        return index, _SUCCESS

    def _gpu(self, handle: object, name: str) -> int | None:
        # The handle's address, read without `ctypes.cast` (which builds a new object per call
        # and was a fifth of a fake call's cost); NULL is an address NVML never gave out.
        if isinstance(handle, ctypes._Pointer):
            address = ctypes.addressof(handle.contents) if handle else None
        elif isinstance(handle, ctypes.c_void_p):
            address = handle.value
        else:
            raise NvmlAbiError(f"{name}: {type(handle).__name__} where NVML takes a device handle")
        # None for a pointer NVML never gave out: INVALID_ARGUMENT in the caller.
        return self._by_address.get(address) if address is not None else None

    def _device_call(self, name: str, handle: object) -> tuple[int, int]:
        index, code = self._enter(name, handle)
        if index is None and code == _SUCCESS:
            return -1, _CODES["INVALID_ARGUMENT"]
        return (index if index is not None else -1), code

    def _machine_gpu(self, index: int) -> Any:
        return self._fake.machine.topology.gpus[index]

    # --- system ---------------------------------------------------------------------------

    def _c_nvmlInitWithFlags(self, flags: object) -> int:
        _uint(flags, "nvmlInitWithFlags flags")
        _, code = self._enter("nvmlInitWithFlags")
        if code == _SUCCESS:
            self._fake.initialised += 1
        return code

    def _c_nvmlShutdown(self) -> int:
        _, code = self._enter("nvmlShutdown")
        if code == _SUCCESS:
            self._fake.initialised -= 1
        return code

    def _c_nvmlErrorString(self, result: object) -> bytes:
        code = _uint(result, "nvmlErrorString result")
        name = next((n for n, c in _CODES.items() if c == code), "UNKNOWN")
        return name.replace("_", " ").title().encode()

    def _c_nvmlSystemGetDriverVersion(self, buffer: object, size: object) -> int:
        _, code = self._enter("nvmlSystemGetDriverVersion")
        out = _pointer(buffer, "nvmlSystemGetDriverVersion version")
        length = _uint(size, "nvmlSystemGetDriverVersion length")
        if code != _SUCCESS or out is None:
            return code
        return out.string(self._fake.driver_version, length)

    def _c_nvmlSystemGetCudaDriverVersion(self, version: object) -> int:
        _, code = self._enter("nvmlSystemGetCudaDriverVersion")
        out = _pointer(version, "nvmlSystemGetCudaDriverVersion cudaDriverVersion")
        if code == _SUCCESS and out is not None:
            out.set(ctypes.c_int, self._fake.cuda_version)
        return code

    def _c_nvmlDeviceGetCount_v2(self, count: object) -> int:
        _, code = self._enter("nvmlDeviceGetCount_v2")
        out = _pointer(count, "nvmlDeviceGetCount_v2 deviceCount")
        if code == _SUCCESS and out is not None:
            out.set(ctypes.c_uint, self._fake.machine.topology.gpu_count)
        return code

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: object, device: object) -> int:
        at = _uint(index, "nvmlDeviceGetHandleByIndex_v2 index")
        _, code = self._enter("nvmlDeviceGetHandleByIndex_v2")
        failure = self._fake.failing.get(("nvmlDeviceGetHandleByIndex", at))
        out = _pointer(device, "nvmlDeviceGetHandleByIndex_v2 device")
        if code != _SUCCESS or out is None:
            return code
        if failure is not None:
            return _CODES[failure]
        if not 0 <= at < len(self._devices):
            return _CODES["INVALID_ARGUMENT"]
        out.set(ctypes.c_void_p, ctypes.addressof(self._devices[at]))
        return _SUCCESS

    # --- one GPU --------------------------------------------------------------------------

    def _string_call(self, name: str, handle: object, buffer: object, size: object) -> int:
        index, code = self._device_call(name, handle)
        out = _pointer(buffer, f"{name} buffer")
        length = _uint(size, f"{name} length")
        if code != _SUCCESS or out is None:
            return code
        g = self._machine_gpu(index)
        return out.string(str(g.uuid if name == "nvmlDeviceGetUUID" else g.name), length)

    def _c_nvmlDeviceGetUUID(self, handle: object, buffer: object, size: object) -> int:
        return self._string_call("nvmlDeviceGetUUID", handle, buffer, size)

    def _c_nvmlDeviceGetName(self, handle: object, buffer: object, size: object) -> int:
        return self._string_call("nvmlDeviceGetName", handle, buffer, size)

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: object, info: object) -> int:
        index, code = self._device_call("nvmlDeviceGetPciInfo_v3", handle)
        out = _pointer(info, "nvmlDeviceGetPciInfo_v3 pci")
        if code == _SUCCESS and out is not None:
            _write_pci(out, self._machine_gpu(index).pci_bus_id, _GPU_DEVICE_ID)
        return code

    def _c_nvmlDeviceGetMemoryInfo(self, handle: object, memory: object) -> int:
        index, code = self._device_call("nvmlDeviceGetMemoryInfo", handle)
        out = _pointer(memory, "nvmlDeviceGetMemoryInfo memory")
        if code == _SUCCESS and out is not None:
            total = self._machine_gpu(index).memory_mib * _MIB
            out.write(pynvml.c_nvmlMemory_t, total=total, free=total, used=0)
        return code

    def _c_nvmlDeviceGetCudaComputeCapability(
        self, handle: object, major: object, minor: object
    ) -> int:
        index, code = self._device_call("nvmlDeviceGetCudaComputeCapability", handle)
        outs = (_pointer(major, "major"), _pointer(minor, "minor"))
        if code != _SUCCESS:
            return code
        text = self._machine_gpu(index).compute_capability
        if not text:
            return _CODES["NOT_SUPPORTED"]
        for out, part in zip(outs, text.split("."), strict=True):
            if out is not None:
                out.set(ctypes.c_int, int(part))
        return _SUCCESS

    def _c_nvmlDeviceGetMemoryAffinity(
        self, handle: object, size: object, mask: object, scope: object
    ) -> int:
        index, code = self._device_call("nvmlDeviceGetMemoryAffinity", handle)
        words = _uint(size, "nvmlDeviceGetMemoryAffinity nodeSetSize")
        _uint(scope, "nvmlDeviceGetMemoryAffinity scope")
        out = _pointer(mask, "nvmlDeviceGetMemoryAffinity nodeSet")
        if code != _SUCCESS or out is None:
            return code
        node = self._machine_gpu(index).numa_node
        if node is None:
            return _CODES["NOT_SUPPORTED"]
        _write_mask(out, [node], words)
        return _SUCCESS

    def _c_nvmlDeviceGetCpuAffinity(self, handle: object, size: object, mask: object) -> int:
        index, code = self._device_call("nvmlDeviceGetCpuAffinity", handle)
        words = _uint(size, "nvmlDeviceGetCpuAffinity cpuSetSize")
        out = _pointer(mask, "nvmlDeviceGetCpuAffinity cpuSet")
        if code != _SUCCESS or out is None:
            return code
        text = self._machine_gpu(index).cpu_affinity
        _write_mask(out, parse_idlist(text) if text else [], words)
        return _SUCCESS

    def _pcie_call(self, name: str, handle: object, value: object, *, current: bool) -> int:
        index, code = self._device_call(name, handle)
        out = _pointer(value, f"{name} value")
        if code != _SUCCESS or out is None:
            return code
        found = self._fake.pcie(index, current=current)["Width" in name]
        if found <= 0:
            return _CODES["NOT_SUPPORTED"]
        out.set(ctypes.c_uint, found)
        return _SUCCESS

    def _c_nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object, value: object) -> int:
        return self._pcie_call("nvmlDeviceGetCurrPcieLinkGeneration", handle, value, current=True)

    def _c_nvmlDeviceGetCurrPcieLinkWidth(self, handle: object, value: object) -> int:
        return self._pcie_call("nvmlDeviceGetCurrPcieLinkWidth", handle, value, current=True)

    def _c_nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object, value: object) -> int:
        return self._pcie_call("nvmlDeviceGetMaxPcieLinkGeneration", handle, value, current=False)

    def _c_nvmlDeviceGetMaxPcieLinkWidth(self, handle: object, value: object) -> int:
        return self._pcie_call("nvmlDeviceGetMaxPcieLinkWidth", handle, value, current=False)

    def _c_nvmlDeviceGetUtilizationRates(self, handle: object, utilization: object) -> int:
        index, code = self._device_call("nvmlDeviceGetUtilizationRates", handle)
        out = _pointer(utilization, "nvmlDeviceGetUtilizationRates utilization")
        if code == _SUCCESS and out is not None:
            busy = self._fake.utilization.get(index, 0)
            out.write(pynvml.c_nvmlUtilization_t, gpu=busy, memory=0)
        return code

    def _c_nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: object, count: object, infos: object
    ) -> int:
        name = "nvmlDeviceGetComputeRunningProcesses_v3"
        index, code = self._device_call(name, handle)
        counter = _pointer(count, f"{name} infoCount")
        room = _pointer(infos, f"{name} infos", nullable=True)
        if code != _SUCCESS or counter is None:
            return code
        running = self._fake.processes.get(index, 0)
        asked = counter.write(ctypes.c_uint).value
        counter.set(ctypes.c_uint, running)
        if running == 0:
            return _SUCCESS
        if room is None or asked < running:
            return _CODES["INSUFFICIENT_SIZE"]
        entry = pynvml.c_nvmlProcessInfo_v3_t
        for n in range(running):
            view = entry.from_buffer(room.target, n * ctypes.sizeof(entry))
            view.pid, view.usedGpuMemory = 1000 + n, _MIB
        return _SUCCESS

    def _c_nvmlDeviceGetGpuFabricInfoV(self, handle: object, info: object) -> int:
        index, code = self._device_call("nvmlDeviceGetGpuFabricInfoV", handle)
        out = _pointer(info, "nvmlDeviceGetGpuFabricInfoV gpuFabricInfo")
        if code != _SUCCESS or out is None:
            return code
        version = out.write(ctypes.c_uint).value
        if version not in _FABRIC_VERSIONS:
            return _CODES["ARGUMENT_VERSION_MISMATCH"]
        found = self._fake.fabric.get(index)
        view = out.write(pynvml.c_nvmlGpuFabricInfo_v2_t)
        if found is None:
            view.state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return _SUCCESS
        for at, byte in enumerate(uuid.UUID(found.cluster_uuid).bytes):
            view.clusterUuid[at] = byte
        view.cliqueId, view.state = found.clique_id, found.state
        view.status, view.healthMask = found.status, found.health_mask
        return _SUCCESS

    # --- NVLink ---------------------------------------------------------------------------

    def _link_call(self, name: str, handle: object, link: object) -> tuple[int, int, Any]:
        index, code = self._device_call(name, handle)
        at = _uint(link, f"{name} link")
        if code != _SUCCESS:
            return index, code, None
        links = self._fake.machine.nvlinks[index]
        if not links:
            return index, _CODES["NOT_SUPPORTED"], None
        if not 0 <= at < len(links):
            return index, _CODES["INVALID_ARGUMENT"], None
        failure = self._fake.link_failing.get((index, at))
        if failure is not None:
            return index, _CODES[failure], None
        return index, _SUCCESS, links[at]

    def _c_nvmlDeviceGetNvLinkState(self, handle: object, link: object, active: object) -> int:
        index, code, _ = self._link_call("nvmlDeviceGetNvLinkState", handle, link)
        out = _pointer(active, "nvmlDeviceGetNvLinkState isActive")
        if code == _SUCCESS and out is not None:
            down = (index, _uint(link, "link")) in self._fake.nvlink_down
            out.set(ctypes.c_uint, 0 if down else 1)
        return code

    def _c_nvmlDeviceGetNvLinkVersion(self, handle: object, link: object, version: object) -> int:
        index, code, _ = self._link_call("nvmlDeviceGetNvLinkVersion", handle, link)
        out = _pointer(version, "nvmlDeviceGetNvLinkVersion version")
        if code == _SUCCESS and out is not None:
            generation = self._machine_gpu(index).nvlink_generation
            out.set(ctypes.c_uint, _NVML_VERSIONS.get(generation, 0))
        return code

    def _c_nvmlDeviceGetNvLinkRemotePciInfo_v2(
        self, handle: object, link: object, pci: object
    ) -> int:
        _, code, found = self._link_call("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, link)
        out = _pointer(pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2 pci")
        if code == _SUCCESS and out is not None:
            _write_pci(out, found.remote_bus_id, found.remote_device_id)
        return code

    def _c_nvmlDeviceGetNvLinkRemoteDeviceType(
        self, handle: object, link: object, kind: object
    ) -> int:
        name = "nvmlDeviceGetNvLinkRemoteDeviceType"
        _, code, found = self._link_call(name, handle, link)
        out = _pointer(kind, f"{name} pNvLinkDeviceType")
        if code == _SUCCESS and out is not None:
            out.set(ctypes.c_uint, _REMOTE_SWITCH if found.to_switch else _REMOTE_GPU)
        return code

    def _c_nvmlDeviceGetNvLinkErrorCounter(
        self, handle: object, link: object, counter: object, value: object
    ) -> int:
        name = "nvmlDeviceGetNvLinkErrorCounter"
        index, code, _ = self._link_call(name, handle, link)
        at = _uint(link, f"{name} link")
        which = _uint(counter, f"{name} counter")
        out = _pointer(value, f"{name} counterValue")
        if code != _SUCCESS or out is None:
            return code
        counter_name = _COUNTER_NAMES.get(which)
        if counter_name is None:
            return _CODES["INVALID_ARGUMENT"]
        key = (index, at, counter_name)
        out.set(ctypes.c_ulonglong, self._fake.error_counts.get(key, 0))
        return _SUCCESS

    # --- pairs ----------------------------------------------------------------------------

    def _c_nvmlDeviceGetTopologyCommonAncestor(
        self, first: object, second: object, level: object
    ) -> int:
        name = "nvmlDeviceGetTopologyCommonAncestor"
        a, code = self._device_call(name, first)
        b = self._gpu(second, name)
        out = _pointer(level, f"{name} pathInfo")
        if code != _SUCCESS or out is None:
            return code
        if b is None:
            return _CODES["INVALID_ARGUMENT"]
        found = 0 if a == b else _LEVELS[self._fake.machine.pcie_kind(a, b)]
        out.set(ctypes.c_uint, found)
        return _SUCCESS

    def _c_nvmlDeviceGetP2PStatus(
        self, first: object, second: object, index: object, status: object
    ) -> int:
        name = "nvmlDeviceGetP2PStatus"
        a, code = self._device_call(name, first)
        b = self._gpu(second, name)
        caps = _uint(index, f"{name} p2pIndex")
        out = _pointer(status, f"{name} p2pStatus")
        if code != _SUCCESS or out is None:
            return code
        if b is None or not 0 <= caps <= pynvml.NVML_P2P_CAPS_INDEX_UNKNOWN:
            return _CODES["INVALID_ARGUMENT"]
        key = (min(a, b), max(a, b))
        out.set(ctypes.c_uint, int(self._fake.p2p.get(key, P2pStatus.OK)))
        return _SUCCESS


class FakeNvml:
    """A machine's NVML: its hardware state, and `library`, pynvml over a fake libnvidia-ml.

    See the module docstring. Pass `library` where the real `pynvml` module would go:
    `Nvml(FakeNvml(machine).library)`.
    """

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
        # (gpu, link) -> the NVML error every call on that link returns (a link index the part
        # does not expose, inside its range of links).
        self.link_failing: dict[tuple[int, int], str] = {}
        self.calls: Counter[str] = Counter()
        self.initialised = 0
        self.clib = FakeLibNvml(self)
        self.library = load_pynvml_over(self._load)

    def _load(self) -> object | None:
        if not self.driver:
            return None
        if not self.remote_type_supported:
            return _Without(self.clib, "nvmlDeviceGetNvLinkRemoteDeviceType")
        return self.clib

    def pcie(self, index: int, *, current: bool) -> tuple[int, int]:
        """A GPU's PCIe (generation, width): as trained now, or the most it can train at."""
        g = self.machine.topology.gpus[index]
        if current and index in self.pcie_current:
            return self.pcie_current[index]
        if current:
            return g.pcie_generation, g.pcie_width
        return (g.pcie_max_generation or g.pcie_generation, g.pcie_max_width or g.pcie_width)

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


@dataclass(frozen=True, slots=True)
class _Without:
    """A library as an older driver ships it: one entry point missing."""

    library: FakeLibNvml
    missing: str

    def __getattr__(self, name: str) -> Any:
        if name == self.missing:
            raise AttributeError(name)
        return getattr(self.library, name)


_COUNTER_NAMES = {code: name for name, code in reversed(NVLINK_ERROR_COUNTERS.items())}
_PYTHON_NAMES: dict[str, str] = {}


def _python_name(c_name: str) -> str:
    """pynvml's name for a C entry point: `nvmlDeviceGetPciInfo_v3` -> `nvmlDeviceGetPciInfo`."""
    found = "nvmlInit" if c_name == "nvmlInitWithFlags" else _VERSION_SUFFIX.sub("", c_name)
    _PYTHON_NAMES[c_name] = found  # a few dozen entry points: remembered, not parsed per call
    return found


def _write_pci(out: _Out, bus_id: str, device_id: int) -> None:
    """An `nvmlPciInfo_t` as NVML fills it (bus id with an 8-digit domain, upper case)."""
    domain, bus, devfn = normalise_bus_id(bus_id).split(":")
    device, function = devfn.split(".")
    long_id = f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function}".encode()
    out.write(
        pynvml.nvmlPciInfo_t,
        busIdLegacy=long_id,
        busId=long_id,
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(device, 16),
        pciDeviceId=device_id,
    )


def _write_mask(out: _Out, ids: Sequence[int], words: int) -> None:
    """A bit mask of `words` 64-bit words into the caller's array."""
    if ctypes.sizeof(out.target) < words * 8:
        raise NvmlAbiError(f"a mask of {words} words does not fit {ctypes.sizeof(out.target)} B")
    values = [0] * words
    for i in ids:
        if i < words * 64:
            values[i // 64] |= 1 << (i % 64)
    array = (ctypes.c_ulonglong * words).from_buffer(out.target)
    for at, value in enumerate(values):
        array[at] = value
