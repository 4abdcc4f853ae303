"""One discovery pass: read NVML and sysfs, assemble the topology, judge its health.

`Discovery.run()` blocks (NVML and sysfs calls); the agent runs it in a worker thread. It keeps
what health needs between passes (NVLink error counters), so one `Discovery` serves one node for
the life of the agent. Probe results are not its business: the agent lays them over the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from exporter.assemble import assemble
from exporter.health import ErrorCounterWatch, HealthPolicy, assess
from exporter.nvml import Nvml
from exporter.readings import NvmlReading, SysfsReading
from exporter.sysfs import Sysfs
from gputopo.topology import NodeTopology

__all__ = ["Discovery", "DiscoveryResult"]


@dataclass(frozen=True, slots=True)
class DiscoveryResult:
    """A pass's topology and the raw readings it came from (metrics show both)."""

    topology: NodeTopology
    nvml: NvmlReading
    sysfs: SysfsReading
    started_at: float
    duration_s: float

    @property
    def errors(self) -> dict[str, int]:
        """Calls that failed unexpectedly in this pass, by source."""
        return {"nvml": self.nvml.errors, "sysfs": self.sysfs.errors}


class Discovery:
    """Discovers one node (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        nvml: Nvml,
        sysfs: Sysfs,
        policy: HealthPolicy | None = None,
        machine: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self.nvml = nvml
        self.sysfs = sysfs
        self.policy = policy or HealthPolicy()
        self.machine = machine
        self._clock = clock
        self._counters = ErrorCounterWatch(self.policy)

    def run(self) -> DiscoveryResult:
        """One pass; never raises for what the hardware says, only for bugs."""
        started = self._clock()
        began = time.perf_counter()
        nvml = self.nvml.read()
        sysfs = self.sysfs.read(bus_ids=[g.pci_bus_id for g in nvml.gpus if g.pci_bus_id])
        assembled = assemble(node_name=self.node_name, nvml=nvml, sysfs=sysfs)
        topology = assess(
            assembled.topology,
            nvml,
            pcie_kinds=assembled.pcie_kinds,
            climbing=self._counters.update(nvml),
            policy=self.policy,
        )
        if self.machine:
            topology = replace(topology, machine=self.machine)
        return DiscoveryResult(
            topology=topology,
            nvml=nvml,
            sysfs=sysfs,
            started_at=started,
            duration_s=time.perf_counter() - began,
        )
