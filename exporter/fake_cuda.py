"""A fake `cuda.bindings.runtime`: the calls the copy probe makes, answered like the real one.

Why: on a real H100 the probe never measured, because `cudaDeviceGetPCIBusId(32, dev)` returns
the whole 32-byte buffer (`b'0000:00:06.0\\x00'` and 19 spaces of padding) and the probe kept the
NUL; there was no fake to show it. This one answers as cuda-bindings 13 does:

1. Every call returns a tuple `(cudaError_t, value...)`; enums are enums, not ints, and a call
   given an int where the binding wants the enum (`cudaMemcpyKind`) raises TypeError as the
   binding's typed signature does.
2. `cudaDeviceGetPCIBusId(length, device)` returns `length` bytes: the NUL-terminated address,
   then what the buffer held before (spaces), exactly as recorded on that machine.
3. Copies take time on a virtual clock: `bytes / bandwidth(t)` for the path, where the bandwidth
   of a path can drop during `slow` stretches (`(start_s, end_s, factor)`), as every tool saw on
   that machine for several hundred milliseconds at a time. Events record the stream's virtual
   time; `sleep` and `now` let the probe wait and read the same clock.

Bandwidths default to the recordings of the H100 VM (host 54.6 GB/s each way, device-local copy
1430 GB/s; `tests/data/torch_copy_bandwidth_h100_vm.json`).
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CudaErrorT", "CudaMemcpyKind", "FakeCudaRuntime", "FakeGpu"]


class CudaErrorT(enum.IntEnum):
    """The error codes the probe can meet (values from the CUDA runtime's `cudaError`)."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorPeerAccessUnsupported = 217
    cudaErrorPeerAccessAlreadyEnabled = 704


class CudaMemcpyKind(enum.IntEnum):
    """Copy directions (`cudaMemcpyKind`)."""

    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


@dataclass(frozen=True, slots=True)
class _Allocation:
    device: int | None  # None: pinned host memory
    size: int


@dataclass(slots=True)
class _Stream:
    device: int
    time_s: float = 0.0


@dataclass(slots=True)
class FakeGpu:
    """One fake GPU: where it sits and how fast it copies."""

    bus_id: str
    host_gbps: float = 54.6
    local_gbps: float = 1430.0
    peers: dict[int, float] = field(default_factory=dict)  # peer device -> GB/s; absent: staged


class FakeCudaRuntime:
    """The part of `cuda.bindings.runtime` the copy probe calls (see the module docstring)."""

    # The binding's names (cuda.bindings.runtime).
    cudaError_t = CudaErrorT
    cudaMemcpyKind = CudaMemcpyKind
    cudaHostAllocDefault = 0
    cudaStreamNonBlocking = 1

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        slow: Sequence[tuple[float, float, float]] = (),
        bus_id_padding: bytes = b" ",
    ) -> None:
        self.gpus = list(gpus)
        self.slow = list(slow)
        self.clock_s = 0.0
        self.calls: Counter[str] = Counter()
        self._padding = bus_id_padding
        self._device = 0
        self._ids = itertools.count(0x7F0000000000, 0x1000)
        self._memory: dict[int, _Allocation] = {}
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, float | None] = {}
        self._peer_enabled: set[tuple[int, int]] = set()

    # --- the probe's clock ----------------------------------------------------------------

    def now(self) -> float:
        """Virtual seconds since the fake started."""
        return self.clock_s

    def sleep(self, seconds: float) -> None:
        """Let virtual time pass (the host waits; streams that are idle catch up)."""
        self.clock_s += max(seconds, 0.0)

    def _rate(self, gbps: float, at_s: float) -> float:
        factor = min((f for start, end, f in self.slow if start <= at_s < end), default=1.0)
        return gbps * factor * 1e9

    # --- devices --------------------------------------------------------------------------

    def cudaGetDeviceCount(self) -> tuple[CudaErrorT, int]:
        self.calls["cudaGetDeviceCount"] += 1
        if not self.gpus:
            return CudaErrorT.cudaErrorNoDevice, 0
        return CudaErrorT.cudaSuccess, len(self.gpus)

    def cudaDeviceGetPCIBusId(self, length: int, device: int) -> tuple[CudaErrorT, bytes]:
        """The binding allocates `length` bytes, lets C write a NUL-terminated string, and
        returns the whole buffer: what follows the NUL is whatever was there before."""
        self.calls["cudaDeviceGetPCIBusId"] += 1
        _int(length, "length")
        if not self._valid(device):
            return CudaErrorT.cudaErrorInvalidDevice, b""
        text = self.gpus[device].bus_id.encode() + b"\0"
        if len(text) > length:
            return CudaErrorT.cudaErrorInvalidValue, b""
        return CudaErrorT.cudaSuccess, text + self._padding * (length - len(text))

    def cudaSetDevice(self, device: int) -> tuple[CudaErrorT]:
        self.calls["cudaSetDevice"] += 1
        if not self._valid(device):
            return (CudaErrorT.cudaErrorInvalidDevice,)
        self._device = device
        return (CudaErrorT.cudaSuccess,)

    def cudaDeviceCanAccessPeer(self, device: int, peer: int) -> tuple[CudaErrorT, int]:
        if not (self._valid(device) and self._valid(peer)):
            return CudaErrorT.cudaErrorInvalidDevice, 0
        return CudaErrorT.cudaSuccess, int(peer in self.gpus[device].peers)

    def cudaDeviceEnablePeerAccess(self, peer: int, flags: int) -> tuple[CudaErrorT]:
        _int(flags, "flags")
        key = (self._device, peer)
        if peer not in self.gpus[self._device].peers:
            return (CudaErrorT.cudaErrorPeerAccessUnsupported,)
        if key in self._peer_enabled:
            return (CudaErrorT.cudaErrorPeerAccessAlreadyEnabled,)
        self._peer_enabled.add(key)
        return (CudaErrorT.cudaSuccess,)

    # --- memory, streams, events ----------------------------------------------------------

    def cudaMalloc(self, size: int) -> tuple[CudaErrorT, int]:
        _int(size, "size")
        pointer = next(self._ids)
        self._memory[pointer] = _Allocation(self._device, size)
        return CudaErrorT.cudaSuccess, pointer

    def cudaHostAlloc(self, size: int, flags: int) -> tuple[CudaErrorT, int]:
        _int(size, "size")
        _int(flags, "flags")
        pointer = next(self._ids)
        self._memory[pointer] = _Allocation(None, size)
        return CudaErrorT.cudaSuccess, pointer

    def cudaFree(self, pointer: int) -> tuple[CudaErrorT]:
        return self._free(pointer, host=False)

    def cudaFreeHost(self, pointer: int) -> tuple[CudaErrorT]:
        return self._free(pointer, host=True)

    def _free(self, pointer: int, *, host: bool) -> tuple[CudaErrorT]:
        found = self._memory.pop(pointer, None)
        if found is None or (found.device is None) != host:
            return (CudaErrorT.cudaErrorInvalidValue,)
        return (CudaErrorT.cudaSuccess,)

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[CudaErrorT, int]:
        _int(flags, "flags")
        handle = next(self._ids)
        self._streams[handle] = _Stream(self._device, self.clock_s)
        return CudaErrorT.cudaSuccess, handle

    def cudaStreamDestroy(self, stream: int) -> tuple[CudaErrorT]:
        return (CudaErrorT.cudaSuccess if self._streams.pop(stream, None) else _bad(),)

    def cudaEventCreate(self) -> tuple[CudaErrorT, int]:
        handle = next(self._ids)
        self._events[handle] = None
        return CudaErrorT.cudaSuccess, handle

    def cudaEventDestroy(self, event: int) -> tuple[CudaErrorT]:
        return (CudaErrorT.cudaSuccess if event in self._events else _bad(),)

    def cudaEventRecord(self, event: int, stream: int) -> tuple[CudaErrorT]:
        if event not in self._events or stream not in self._streams:
            return (CudaErrorT.cudaErrorInvalidValue,)
        queue = self._streams[stream]
        queue.time_s = max(queue.time_s, self.clock_s)
        self._events[event] = queue.time_s
        return (CudaErrorT.cudaSuccess,)

    def cudaEventSynchronize(self, event: int) -> tuple[CudaErrorT]:
        at = self._events.get(event)
        if at is None:
            return (CudaErrorT.cudaErrorInvalidValue,)
        self.clock_s = max(self.clock_s, at)
        return (CudaErrorT.cudaSuccess,)

    def cudaStreamSynchronize(self, stream: int) -> tuple[CudaErrorT]:
        if stream not in self._streams:
            return (CudaErrorT.cudaErrorInvalidValue,)
        self.clock_s = max(self.clock_s, self._streams[stream].time_s)
        return (CudaErrorT.cudaSuccess,)

    def cudaEventElapsedTime(self, start: int, stop: int) -> tuple[CudaErrorT, float]:
        a, b = self._events.get(start), self._events.get(stop)
        if a is None or b is None:
            return CudaErrorT.cudaErrorInvalidValue, 0.0
        return CudaErrorT.cudaSuccess, (b - a) * 1000.0

    def cudaGetErrorString(self, error: CudaErrorT) -> tuple[CudaErrorT, bytes]:
        return CudaErrorT.cudaSuccess, error.name.encode()

    # --- copies ---------------------------------------------------------------------------

    def cudaMemcpyAsync(
        self, dst: int, src: int, count: int, kind: CudaMemcpyKind, stream: int
    ) -> tuple[CudaErrorT]:
        if not isinstance(kind, CudaMemcpyKind):
            raise TypeError(
                f"Argument 'kind' has incorrect type (expected cudaMemcpyKind, got {kind!r})"
            )
        _int(count, "count")
        target, source = self._memory.get(dst), self._memory.get(src)
        if target is None or source is None or stream not in self._streams:
            return (CudaErrorT.cudaErrorInvalidValue,)
        if count > min(target.size, source.size):
            return (CudaErrorT.cudaErrorInvalidValue,)
        device = target.device if target.device is not None else source.device
        if device is None:
            return (CudaErrorT.cudaErrorInvalidValue,)
        gpu = self.gpus[device]
        on_host = target.device is None or source.device is None
        self._run(stream, count, gpu.host_gbps if on_host else gpu.local_gbps)
        return (CudaErrorT.cudaSuccess,)

    def cudaMemcpyPeerAsync(
        self, dst: int, dst_device: int, src: int, src_device: int, count: int, stream: int
    ) -> tuple[CudaErrorT]:
        for value, name in ((dst_device, "dstDevice"), (src_device, "srcDevice"), (count, "count")):
            _int(value, name)
        target, source = self._memory.get(dst), self._memory.get(src)
        if target is None or source is None or stream not in self._streams:
            return (CudaErrorT.cudaErrorInvalidValue,)
        if (target.device, source.device) != (dst_device, src_device):
            return (CudaErrorT.cudaErrorInvalidValue,)
        if src_device == dst_device:
            gbps = self.gpus[src_device].local_gbps
        elif (src_device, dst_device) in self._peer_enabled or (
            dst_device,
            src_device,
        ) in self._peer_enabled:
            gbps = self.gpus[src_device].peers[dst_device]
        else:  # staged through host memory: both host links in turn
            gbps = 1 / (1 / self.gpus[src_device].host_gbps + 1 / self.gpus[dst_device].host_gbps)
        self._run(stream, count, gbps)
        return (CudaErrorT.cudaSuccess,)

    def _run(self, stream: int, count: int, gbps: float) -> None:
        """Advance the stream by the copy's duration, in steps that notice slow stretches."""
        queue = self._streams[stream]
        queue.time_s = max(queue.time_s, self.clock_s)
        left = float(count)
        while left >= 1.0:  # what rounding leaves below a byte is no copy
            rate = self._rate(gbps, queue.time_s)
            edges = [x for a, b, _ in self.slow for x in (a, b) if x > queue.time_s + 1e-12]
            horizon = min(edges, default=float("inf")) - queue.time_s
            step = min(left / rate, horizon)
            queue.time_s += step
            left -= step * rate

    def _valid(self, device: object) -> bool:
        _int(device, "device")
        return isinstance(device, int) and 0 <= device < len(self.gpus)


def _int(value: object, name: str) -> None:
    """The binding's typed integer parameters refuse anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Argument '{name}' has incorrect type (expected int, got {value!r})")


def _bad() -> CudaErrorT:
    return CudaErrorT.cudaErrorInvalidValue
