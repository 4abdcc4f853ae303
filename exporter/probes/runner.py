"""When probes run, and where their results go.

1. Rounds start after a jittered delay and repeat at a jittered interval (`ProbeSchedule`), so a
   DaemonSet's exporters do not all load the fabric at the same moment.
2. Before each GPU measurement the runner asks NVML how busy the GPUs involved are; a GPU with
   utilisation at or above `busy_percent`, or with compute processes, is left alone and the
   measurement is counted as skipped. A probe round never competes with a job.
3. GPU copies run in a worker process (`exporter.probes.gpu_worker`), never in the agent:
   CUDA contexts stay in the process that made them.
4. Results go to `ProbeResults`; the agent lays them over the discovered topology and sends the
   change. Peer (TCP) results go to the report stream as `Delta.peer_probes`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import random
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporter.probes.results import ProbeOutcome, ProbeResults
from exporter.probes.tcp import probe_peer
from exporter.readings import GpuActivity
from gputopo.importers.idlists import parse_idlist
from gputopo.topology import DeviceKind, DeviceRef, Measurement, NodeTopology, gpu, numa

__all__ = [
    "GPU_PROBE",
    "NOT_YET_PROBED",
    "TCP_PROBE",
    "GpuProbeClient",
    "ProbeError",
    "ProbeRunner",
    "ProbeSchedule",
    "WorkerGpuProbe",
]

log = logging.getLogger(__name__)

GPU_PROBE = "gpu-copy"
NOT_YET_PROBED = "not yet probed"
_FIRST_AFTER_S = 120.0
TCP_PROBE = "tcp"


class ProbeError(RuntimeError):
    """A probe that could not measure; the message says why."""


class GpuProbeClient(Protocol):
    """A GPU probe as the runner drives it (the real one runs a worker process)."""

    def installed(self) -> tuple[bool, str]:
        """Whether the probe can run at all here (cuda-bindings present), and if not, why."""
        ...

    async def start(self) -> tuple[bool, str]:
        """Prepare a round; whether CUDA is usable, and if not, why."""
        ...

    async def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        """Measure between two GPUs; ProbeError when it cannot."""
        ...

    async def host(self, bus_id: str, cpus: Sequence[int]) -> Measurement:
        """Measure between a GPU and host memory near `cpus`; ProbeError when it cannot."""
        ...

    async def close(self) -> None:
        """End the round."""
        ...


@dataclass(frozen=True, slots=True)
class _Task:
    """One GPU measurement: a GPU pair, or a GPU and a NUMA node's memory."""

    gpus: tuple[int, ...]
    a: DeviceRef
    b: DeviceRef
    src: str
    dst: str = ""
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeSchedule:
    """How often probes run. Waits are `interval_s` (or `first_after_s`) times a random factor
    in [1 - jitter, 1 + jitter]."""

    interval_s: float = 900.0
    first_after_s: float = _FIRST_AFTER_S
    jitter: float = 0.25
    busy_percent: int = 10

    @classmethod
    def every(cls, interval_s: float) -> ProbeSchedule:
        """Rounds every `interval_s`; the first no later than that either (an operator who asks
        for a round every 30 s does not wait the default two minutes for the first)."""
        return cls(interval_s=interval_s, first_after_s=min(_FIRST_AFTER_S, interval_s))


class WorkerGpuProbe:
    """Drives `python -m exporter.probes.gpu_worker` (see that module) for one round at a time."""

    def __init__(self, *, python: str = sys.executable, timeout_s: float = 300.0) -> None:
        self._python = python
        self._timeout_s = timeout_s
        self._process: asyncio.subprocess.Process | None = None

    def installed(self) -> tuple[bool, str]:
        """cuda-bindings importable in this environment."""
        try:
            found = importlib.util.find_spec("cuda.bindings") is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return False, "cuda-bindings is not installed (pip install 'gputopo[cuda]')"
        return True, ""

    async def start(self) -> tuple[bool, str]:
        """Start the worker and wait for it to say whether CUDA works."""
        self._process = await asyncio.create_subprocess_exec(
            self._python,
            "-m",
            "exporter.probes.gpu_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            ready = await self._read()
        except ProbeError as error:
            await self.close()
            return False, str(error)
        if not ready.get("ready"):
            await self.close()
            return False, str(ready.get("error", "the GPU probe worker did not start"))
        return True, ""

    async def peer(self, src_bus_id: str, dst_bus_id: str) -> Measurement:
        """One peer task."""
        return await self._task({"op": "peer", "src": src_bus_id, "dst": dst_bus_id})

    async def host(self, bus_id: str, cpus: Sequence[int]) -> Measurement:
        """One host task."""
        return await self._task({"op": "host", "bus": bus_id, "cpus": list(cpus)})

    async def close(self) -> None:
        """Close the worker's stdin and wait for it to exit (kill it if it hangs)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def _task(self, task: dict[str, object]) -> Measurement:
        if self._process is None or self._process.stdin is None:
            raise ProbeError("the GPU probe worker is not running")
        self._process.stdin.write((json.dumps(task) + "\n").encode())
        await self._process.stdin.drain()
        answer = await self._read()
        if not answer.get("ok"):
            raise ProbeError(str(answer.get("error", "the GPU probe failed")))
        fields = answer.get("measurement")
        if not isinstance(fields, dict):
            raise ProbeError("the GPU probe worker sent no measurement")
        return Measurement(**fields)

    async def _read(self) -> dict[str, object]:
        if self._process is None or self._process.stdout is None:
            raise ProbeError("the GPU probe worker is not running")
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), self._timeout_s)
        except TimeoutError:
            raise ProbeError(
                f"the GPU probe worker said nothing for {self._timeout_s:.0f} s"
            ) from None
        if not line:
            raise ProbeError(f"the GPU probe worker exited ({self._process.returncode})")
        message: dict[str, object] = json.loads(line)
        return message


class ProbeRunner:
    """Runs probe rounds (see the module docstring)."""

    def __init__(
        self,
        *,
        results: ProbeResults,
        gpu_probe: GpuProbeClient,
        activity: Callable[[], Awaitable[tuple[GpuActivity, ...]]],
        schedule: ProbeSchedule | None = None,
        rng: random.Random | None = None,
        peer_probe: Callable[[str], Awaitable[Measurement]] = probe_peer,
    ) -> None:
        self.results = results
        self.schedule = schedule or ProbeSchedule()
        self._gpu = gpu_probe
        self._activity = activity
        self._rng = rng or random.Random()
        self._peer_probe = peer_probe

    def not_yet(self, probe: str) -> None:
        """Say in the metrics that `probe` has not run a round yet (until its first does); for
        the GPU probe, say at once when it cannot run at all (cuda-bindings missing), so an
        operator does not wait for the first round to learn it."""
        if probe == GPU_PROBE:
            installed, why = self._gpu.installed()
            if not installed:
                self.results.available[GPU_PROBE] = (False, why)
                return
        self.results.available.setdefault(probe, (False, NOT_YET_PROBED))

    def off(self, probe: str, reason: str) -> None:
        """Say in the metrics that `probe` will not run here, and why."""
        self.results.available[probe] = (False, reason)

    def wait_s(self, *, first: bool = False) -> float:
        """Seconds until the next round, jittered."""
        base = self.schedule.first_after_s if first else self.schedule.interval_s
        j = self.schedule.jitter
        return base * self._rng.uniform(1 - j, 1 + j)

    async def gpu_round(self, topology: NodeTopology) -> int:
        """Measure every GPU pair and every GPU-NUMA path that is idle; the number measured."""
        installed, why = self._gpu.installed()
        if not installed or not topology.gpus:
            reason = why if not installed else "no GPU on this node"
            self.results.available[GPU_PROBE] = (False, reason)
            return 0
        if all(self._busy(await self._activity(), range(topology.gpu_count))):
            self.results.count(GPU_PROBE, ProbeOutcome.SKIPPED_BUSY, 1)
            return 0
        ok, why = await self._gpu.start()
        self.results.available[GPU_PROBE] = (ok, why)
        if not ok:
            self.results.count(GPU_PROBE, ProbeOutcome.UNAVAILABLE)
            log.info("GPU probes unavailable: %s", why)
            return 0
        measured = 0
        try:
            for task in self._gpu_tasks(topology):
                if any(self._busy(await self._activity(), task.gpus)):
                    self.results.count(GPU_PROBE, ProbeOutcome.SKIPPED_BUSY)
                    continue
                try:
                    measurement = await self._measure(task)
                except ProbeError as error:
                    self.results.count(GPU_PROBE, ProbeOutcome.FAILED)
                    log.warning("GPU probe %s-%s failed: %s", task.a, task.b, error)
                    continue
                self.results.record_link(GPU_PROBE, task.a, task.b, measurement)
                measured += 1
        finally:
            await self._gpu.close()
        return measured

    def _gpu_tasks(self, topology: NodeTopology) -> list[_Task]:
        tasks = [
            _Task(
                gpus=(a.index, b.index),
                a=gpu(a.index),
                b=gpu(b.index),
                src=a.pci_bus_id,
                dst=b.pci_bus_id,
            )
            for a in topology.gpus
            for b in topology.gpus
            if a.index < b.index and a.pci_bus_id and b.pci_bus_id
        ]
        tasks += [
            _Task(
                gpus=(g.index,),
                a=gpu(g.index),
                b=numa(node.id),
                src=g.pci_bus_id,
                cpus=parse_idlist(node.cpus),
            )
            for g in topology.gpus
            for node in topology.numa_nodes
            if g.pci_bus_id and node.cpus and topology.link(gpu(g.index), numa(node.id)) is not None
        ]
        return tasks

    async def _measure(self, task: _Task) -> Measurement:
        if task.b.kind is DeviceKind.GPU:
            return await self._gpu.peer(task.src, task.dst)
        return await self._gpu.host(task.src, task.cpus)

    def _busy(self, activity: tuple[GpuActivity, ...], indices: Iterable[int]) -> list[bool]:
        by_index = {a.index: a for a in activity}
        found = []
        for i in indices:
            a = by_index.get(i)
            util = a.utilization_percent if a is not None else None
            procs = a.processes if a is not None else None
            found.append((util or 0) >= self.schedule.busy_percent or (procs or 0) > 0)
        return found

    async def peer_round(self, targets: Sequence[tuple[str, str]]) -> dict[str, Measurement]:
        """Probe each named peer once; results by node name."""
        found: dict[str, Measurement] = {}
        self.results.available[TCP_PROBE] = (True, "")
        for node, address in targets:
            try:
                measurement = await self._peer_probe(address)
            except (OSError, TimeoutError, ValueError, ConnectionError) as error:
                self.results.count(TCP_PROBE, ProbeOutcome.FAILED)
                log.warning("network probe to %s (%s) failed: %r", node, address, error)
                continue
            self.results.record_peer(TCP_PROBE, node, measurement)
            found[node] = measurement
        return found
