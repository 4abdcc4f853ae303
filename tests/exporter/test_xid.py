"""NVML beyond discovery: XID errors (which GPU, which error, application errors left out) and
which GPU each MIG device is.

The fake stands where pynvml's wrappers do (the C-level fake has no event set): event data with
the wheel's field names, errors carrying NVML's return codes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from exporter.nvml import Nvml, XidEvents

NOT_SUPPORTED, TIMEOUT = 3, 10  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT
XID_CRITICAL = 8  # nvmlEventTypeXidCriticalError


class NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Event:
    device: str
    eventType: int  # noqa: N815 - pynvml's field names
    eventData: int  # noqa: N815


class EventLibrary:
    """Four GPUs; GPU 2 cannot report XID events; queued events come out in order."""

    NVMLError = NvmlError

    def __init__(self, events: list[Event]) -> None:
        self.queue = deque(events)
        self.freed = False

    def nvmlInit(self) -> None: ...  # noqa: N802
    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "550.0"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 12040

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        return f"h{index}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:  # noqa: N802
        return f"GPU-{handle}"

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        return object()

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, events: Any) -> None:  # noqa: N802
        assert types == XID_CRITICAL
        if handle == "h2":
            raise NvmlError(NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> Event:  # noqa: N802
        if not self.queue:
            raise NvmlError(TIMEOUT)
        return self.queue.popleft()

    def nvmlEventSetFree(self, events: Any) -> None:  # noqa: N802
        self.freed = True


def test_critical_xids_name_their_gpu_and_application_errors_are_left_out() -> None:
    lib = EventLibrary(
        [
            Event("h1", XID_CRITICAL, 79),  # fallen off the bus
            Event("h0", XID_CRITICAL, 13),  # an application's bad kernel: not the GPU's fault
            Event("h3", XID_CRITICAL, 48),  # double-bit ECC error
            Event("h3", 1, 0),  # another event type
        ]
    )
    events = XidEvents(Nvml(lib))  # type: ignore[arg-type]
    assert events.open() == ""
    assert events.wait(1000) == [(1, 79), (3, 48)]
    assert events.wait(10) == []  # a timeout is no error
    events.close()
    assert lib.freed


def test_without_events_it_says_why() -> None:
    class NoEvents(EventLibrary):
        def nvmlEventSetCreate(self) -> object:  # noqa: N802
            raise NvmlError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND

    assert XidEvents(Nvml(NoEvents([]))).open().startswith("no NVML events")  # type: ignore[arg-type]


class MigLibrary(EventLibrary):
    """GPU 1 is MIG-partitioned into two slices (slot 1 empty); the others are not."""

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:  # noqa: N802
        if handle != "h1":
            raise NvmlError(NOT_SUPPORTED)
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, slot: int) -> str:  # noqa: N802
        if slot == 1:
            raise NvmlError(6)  # NVML_ERROR_NOT_FOUND: an empty slot
        return f"mig{slot}-of-{handle}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:  # noqa: N802
        return f"MIG-{handle}" if handle.startswith("mig") else f"GPU-{handle}"


def test_mig_devices_map_to_their_gpu() -> None:
    nvml = Nvml(MigLibrary([]))  # type: ignore[arg-type]
    assert nvml.mig_parents() == {"MIG-mig0-of-h1": 1, "MIG-mig2-of-h1": 1}
