"""GPU copy probes with cuda-bindings: peer-to-peer and host-to-GPU bandwidth, copy latency.

The method follows nvbandwidth's copy-engine tests (`*_memcpy_ce`): `cudaMemcpyPeerAsync` /
`cudaMemcpyAsync` of large buffers (256 MiB by default) on a non-blocking stream, timed with CUDA
events, several copies per sample, the median of a few samples. nvbandwidth also holds the stream
behind a spin kernel while it enqueues, so that launch latency is not timed; with buffers this
large one launch (microseconds) is far below one copy (a millisecond at NVLink speed), so this
probe does without a kernel and needs no compiler at run time.

- Peer: copies in both directions, and the link counts at the slower one (placement uses a link
  both ways). Peer access is enabled when CUDA allows it; otherwise the copy is staged through
  host memory, which is exactly what such a pair gets.
- Host: for each NUMA node, pinned host memory allocated while the thread runs on that node's
  CPUs (so the pages live there), copied to the GPU and back; the slower direction counts.
- Latency: the mean time of many 4-byte peer copies, as `p2pBandwidthLatencyTest` reports it.

CUDA device numbers are matched to NVML's GPUs by PCI address, never by position: CUDA orders
devices fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`. Every call here blocks; run them
in a worker thread. Without cuda-bindings, or without a usable GPU, `available()` says why and
the probe measures nothing.
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from exporter.readings import normalise_bus_id
from gputopo.topology import Measurement

__all__ = ["CudaCopyProbe", "CudaError", "GpuProbe", "Rates", "UnavailableGpuProbe"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, order=True)
class Rates:
    """The samples of one copy direction: median first, so the slower direction sorts first."""

    median: float
    low: float  # 10th percentile
    high: float  # 90th percentile
    samples: int

    @classmethod
    def of(cls, rates: list[float]) -> Rates:
        """Median and 10th/90th percentiles (the extremes when there are few samples)."""
        ordered = sorted(rates)
        if len(ordered) < 3:
            low, high = ordered[0], ordered[-1]
        else:
            deciles = statistics.quantiles(ordered, n=10, method="inclusive")
            low, high = deciles[0], deciles[-1]
        return cls(statistics.median(ordered), low, high, len(ordered))

    def measurement(self, **fields: Any) -> Measurement:
        """A `Measurement` of the median with its spread."""
        return Measurement(
            gbps=round(self.median, 3),
            low_gbps=round(self.low, 3),
            high_gbps=round(self.high, 3),
            samples=self.samples,
            **fields,
        )


class CudaError(RuntimeError):
    """A CUDA runtime call failed; the message names the call and CUDA's error."""


class GpuProbe(Protocol):
    """What the probe runner needs from a GPU probe."""

    name: str

    def available(self) -> tuple[bool, str]:
        """Whether the probe can run here, and if not, why."""
        ...

    def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        """Copy bandwidth (and latency) between two GPUs, given by PCI address."""
        ...

    def host(self, bus_id: str, *, cpus: Iterable[int]) -> Measurement:
        """Copy bandwidth between a GPU and host memory on the NUMA node owning `cpus`."""
        ...


@dataclass(frozen=True, slots=True)
class UnavailableGpuProbe:
    """A GPU probe that cannot run, and says why (no cuda-bindings, no GPU, disabled)."""

    reason: str
    name: str = "gpu-copy"

    def available(self) -> tuple[bool, str]:
        """Never available."""
        return False, self.reason

    def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        """Refuses."""
        raise CudaError(self.reason)

    def host(self, bus_id: str, *, cpus: Iterable[int]) -> Measurement:
        """Refuses."""
        raise CudaError(self.reason)


class CudaCopyProbe:
    """Copy-engine bandwidth probes through `cuda.bindings.runtime` (see the module docstring)."""

    name = "gpu-copy"

    def __init__(
        self,
        *,
        size_bytes: int = 256 * _MIB,
        copies: int = 4,
        min_samples: int = 11,
        min_duration_s: float = 1.5,
        max_samples: int = 60,
        gap_s: float = 0.1,
        latency_copies: int = 100,
        runtime: Any = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.size_bytes = size_bytes
        self.copies = copies
        self.min_samples = min_samples
        self.min_duration_s = min_duration_s
        self.max_samples = max_samples
        self.gap_s = gap_s
        self.latency_copies = latency_copies
        self._runtime = runtime
        self._clock = clock
        self._now = monotonic
        self._sleep = sleep
        self._rt: Any = None
        self._devices: dict[str, int] = {}

    def available(self) -> tuple[bool, str]:
        """Load cuda-bindings and map CUDA devices to PCI addresses."""
        try:
            rt = self._runtime or importlib.import_module("cuda.bindings.runtime")
        except ImportError:
            return False, "cuda-bindings is not installed (pip install 'gputopo[cuda]')"
        err, count = rt.cudaGetDeviceCount()
        if err != rt.cudaError_t.cudaSuccess:
            return False, f"CUDA cannot see a GPU: {_error_text(rt, err)}"
        self._rt = rt
        self._devices = {}
        for device in range(count):
            address = _ok(rt, "cudaDeviceGetPCIBusId", rt.cudaDeviceGetPCIBusId(32, device))
            self._devices[normalise_bus_id(_c_string(address))] = device
        if not count:
            return False, "CUDA sees no GPU"
        return True, ""

    def _device(self, bus_id: str) -> int:
        if self._rt is None:
            ok, why = self.available()
            if not ok:
                raise CudaError(why)
        try:
            return self._devices[normalise_bus_id(bus_id)]
        except KeyError:
            raise CudaError(f"CUDA does not see the GPU at {bus_id}") from None

    def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        """Both directions between two GPUs; the slower direction and the copy latency."""
        src, dst = self._device(src_bus_id), self._device(dst_bus_id)
        started = self._clock()
        began = self._now()
        there, latency_us = self._peer_once(src, dst)
        back, _ = self._peer_once(dst, src)
        return min(there, back).measurement(
            method="cuda-memcpy-peer-ce (slower of both directions)",
            size_bytes=self.size_bytes,
            duration_s=self._now() - began,
            measured_at=started,
            latency_us=round(latency_us, 3),
        )

    def host(self, bus_id: str, *, cpus: Iterable[int]) -> Measurement:
        """Host memory on the NUMA node of `cpus` to the GPU and back; the slower direction."""
        device = self._device(bus_id)
        started = self._clock()
        began = self._now()
        previous = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(cpus))  # this thread only: the pinned pages land here
        try:
            h2d, d2h = self._host_once(device)
        finally:
            os.sched_setaffinity(0, previous)
        return min(h2d, d2h).measurement(
            method="cuda-memcpy-h2d-d2h-ce (slower direction)",
            size_bytes=self.size_bytes,
            duration_s=self._now() - began,
            measured_at=started,
        )

    # --- CUDA -----------------------------------------------------------------------------

    def _peer_once(self, src: int, dst: int) -> tuple[Rates, float]:
        rt = self._rt
        for a, b in ((src, dst), (dst, src)):
            _ok(rt, "cudaSetDevice", rt.cudaSetDevice(a))
            if _ok(rt, "cudaDeviceCanAccessPeer", rt.cudaDeviceCanAccessPeer(a, b)):
                err = rt.cudaDeviceEnablePeerAccess(b, 0)[0]
                if err not in (
                    rt.cudaError_t.cudaSuccess,
                    rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled,
                ):
                    raise CudaError(f"cudaDeviceEnablePeerAccess: {_error_text(rt, err)}")
        with _Buffers(rt) as buffers:
            source = buffers.device(src, self.size_bytes)
            target = buffers.device(dst, self.size_bytes)
            _ok(rt, "cudaSetDevice", rt.cudaSetDevice(src))
            stream, start, stop = buffers.stream(), buffers.event(), buffers.event()

            def copy(n: int) -> None:
                _ok(
                    rt,
                    "cudaMemcpyPeerAsync",
                    rt.cudaMemcpyPeerAsync(target, dst, source, src, n, stream),
                )

            gbps = self._timed(copy, stream, start, stop)
            ms = self._elapsed(lambda: copy(4), self.latency_copies, stream, start, stop)
            return gbps, ms * 1000 / self.latency_copies

    def _host_once(self, device: int) -> tuple[Rates, Rates]:
        rt = self._rt
        _ok(rt, "cudaSetDevice", rt.cudaSetDevice(device))
        with _Buffers(rt) as buffers:
            host = buffers.host(self.size_bytes)
            dev = buffers.device(device, self.size_bytes)
            stream, start, stop = buffers.stream(), buffers.event(), buffers.event()
            kinds = rt.cudaMemcpyKind

            def h2d(n: int) -> None:
                _ok(
                    rt,
                    "cudaMemcpyAsync",
                    rt.cudaMemcpyAsync(dev, host, n, kinds.cudaMemcpyHostToDevice, stream),
                )

            def d2h(n: int) -> None:
                _ok(
                    rt,
                    "cudaMemcpyAsync",
                    rt.cudaMemcpyAsync(host, dev, n, kinds.cudaMemcpyDeviceToHost, stream),
                )

            return self._timed(h2d, stream, start, stop), self._timed(d2h, stream, start, stop)

    def _timed(self, copy: Callable[[int], None], stream: Any, start: Any, stop: Any) -> Rates:
        """GB/s samples of one direction, after one warm-up copy.

        Samples are spread over at least `min_duration_s` (a pause of `gap_s` between them) and
        number at least `min_samples`: a slow stretch of a few hundred milliseconds, which every
        tool saw on a real H100 VM, then spoils a minority of samples and not the median.
        """
        rt = self._rt
        copy(self.size_bytes)
        _ok(rt, "cudaStreamSynchronize", rt.cudaStreamSynchronize(stream))
        rates: list[float] = []
        began = self._now()
        while len(rates) < self.max_samples:
            ms = self._elapsed(lambda: copy(self.size_bytes), self.copies, stream, start, stop)
            rates.append(self.copies * self.size_bytes / (ms / 1000) / 1e9)
            if len(rates) >= self.min_samples and self._now() - began >= self.min_duration_s:
                break
            self._sleep(self.gap_s)
        return Rates.of(rates)

    def _elapsed(
        self, enqueue: Callable[[], None], times: int, stream: Any, start: Any, stop: Any
    ) -> float:
        rt = self._rt
        _ok(rt, "cudaEventRecord", rt.cudaEventRecord(start, stream))
        for _ in range(times):
            enqueue()
        _ok(rt, "cudaEventRecord", rt.cudaEventRecord(stop, stream))
        _ok(rt, "cudaEventSynchronize", rt.cudaEventSynchronize(stop))
        ms = float(_ok(rt, "cudaEventElapsedTime", rt.cudaEventElapsedTime(start, stop)))
        if ms <= 0:
            raise CudaError("cudaEventElapsedTime: no time elapsed")
        return ms


class _Buffers:
    """Device and pinned host buffers, streams and events, all freed on exit."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self._free: list[Callable[[], object]] = []

    def __enter__(self) -> _Buffers:
        return self

    def __exit__(self, *exc: object) -> None:
        for free in reversed(self._free):
            free()

    def device(self, device: int, size: int) -> Any:
        rt = self._rt
        _ok(rt, "cudaSetDevice", rt.cudaSetDevice(device))
        pointer = _ok(rt, "cudaMalloc", rt.cudaMalloc(size))
        self._free.append(lambda: (rt.cudaSetDevice(device), rt.cudaFree(pointer)))
        return pointer

    def host(self, size: int) -> Any:
        rt = self._rt
        pointer = _ok(rt, "cudaHostAlloc", rt.cudaHostAlloc(size, rt.cudaHostAllocDefault))
        self._free.append(lambda: rt.cudaFreeHost(pointer))
        return pointer

    def stream(self) -> Any:
        rt = self._rt
        stream = _ok(
            rt, "cudaStreamCreateWithFlags", rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking)
        )
        self._free.append(lambda: rt.cudaStreamDestroy(stream))
        return stream

    def event(self) -> Any:
        rt = self._rt
        event = _ok(rt, "cudaEventCreate", rt.cudaEventCreate())
        self._free.append(lambda: rt.cudaEventDestroy(event))
        return event


def _ok(rt: Any, call: str, result: tuple[Any, ...]) -> Any:
    """The value of a cuda-bindings call (`(err, value)` or `(err,)`); CudaError on failure."""
    err, *values = result
    if err != rt.cudaError_t.cudaSuccess:
        raise CudaError(f"{call}: {_error_text(rt, err)}")
    return values[0] if values else None


def _c_string(value: object) -> str:
    """A C string the binding returns as its whole buffer: up to the first NUL, padding dropped.

    `cudaDeviceGetPCIBusId(32, dev)` gives `b'0000:00:06.0\\x00'` and 19 spaces on a real H100.
    """
    raw = value if isinstance(value, bytes) else str(value).encode()
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip()


def _error_text(rt: Any, err: Any) -> str:
    name = getattr(err, "name", str(err))
    try:
        _, text = rt.cudaGetErrorString(err)
        return f"{name} ({text.decode() if isinstance(text, bytes) else text})"
    except Exception:  # the error string is a nicety; the name says enough
        return str(name)
