"""Prometheus metrics from a custom collector over the agent's latest state.

Nothing here keeps its own numbers: at every scrape `ExporterCollector` asks the agent for an
`ExporterView` (the latest discovery, the topology with probe results laid over it, probe and
stream counters) and renders it, so metrics can never disagree with what the agent reports to
the aggregator. Every family comes from `exporter.metric_names`; the registry is passed in, so
tests and the agent each use their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from exporter import metric_names as names
from exporter.discovery import DiscoveryResult
from exporter.probes.results import ProbeResults
from exporter.stream import StreamStats
from gputopo.gpu_use import GpuUse
from gputopo.links import LinkHealth
from gputopo.runtime.metrics import MetricSpec
from gputopo.runtime.metrics import family as _family
from gputopo.topology import NodeTopology

if TYPE_CHECKING:
    from exporter.deviceplugin import DevicePluginStats  # loaded only with --device-plugin

__all__ = ["ExporterCollector", "ExporterView", "register"]

_GB = 1e9


@dataclass(frozen=True, slots=True)
class ExporterView:
    """What the collector renders: a consistent picture of the agent at one moment."""

    node_name: str
    version: str
    topology: NodeTopology | None = None
    discovery: DiscoveryResult | None = None
    discovery_runs: int = 0
    discovery_errors: Mapping[str, int] = field(default_factory=dict)
    probes: ProbeResults = field(default_factory=ProbeResults)
    stream: StreamStats | None = None
    gpu_use: GpuUse | None = None  # None: PodResources is not read (or not yet)
    pod_resources: bool = False  # whether it is read at all
    device_plugin: DevicePluginStats | None = None


class _Families:
    """Families by spec, created on first use, yielded in spec order."""

    def __init__(self) -> None:
        self._found: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, spec: MetricSpec, value: float, *labels: str) -> None:
        family = self._found.get(spec.name)
        if family is None:
            family = self._found[spec.name] = _family(spec)
        family.add_metric(list(labels), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._found.values())


class ExporterCollector(Collector):
    """Renders an `ExporterView` (see the module docstring)."""

    def __init__(self, view: Callable[[], ExporterView]) -> None:
        self._view = view

    def describe(self) -> Iterator[Metric]:
        """Every family, empty: lets the registry check names without a scrape."""
        for spec in names.ALL:
            yield _family(spec)

    def collect(self) -> Iterator[Metric]:
        """One scrape."""
        view = self._view()
        out = _Families()
        out.add(names.EXPORTER_INFO, 1, view.version, view.node_name)
        _discovery(out, view)
        if view.topology is not None:
            _topology(out, view.topology)
        if view.discovery is not None:
            _readings(out, view.discovery, view.node_name)
        _probes(out, view.probes)
        _stream(out, view.stream)
        _kubelet(out, view)
        yield from out


def register(registry: CollectorRegistry, view: Callable[[], ExporterView]) -> ExporterCollector:
    """Register a collector over `view` in `registry`."""
    collector = ExporterCollector(view)
    registry.register(collector)
    return collector


def _discovery(out: _Families, view: ExporterView) -> None:
    topology = view.topology
    nvml = topology.nvml if topology is not None else None
    out.add(names.NVML_UP, 1 if nvml is not None and nvml.up else 0)
    if nvml is not None:
        out.add(names.NVML_INFO, 1, nvml.driver_version, nvml.cuda_version, nvml.reason)
    out.add(names.DISCOVERY_RUNS, view.discovery_runs)
    for source in ("nvml", "sysfs", "exception"):
        out.add(names.DISCOVERY_ERRORS, view.discovery_errors.get(source, 0), source)
    if view.discovery is not None:
        out.add(names.DISCOVERY_DURATION, view.discovery.duration_s)
        out.add(names.DISCOVERY_TIMESTAMP, view.discovery.started_at)
    if topology is not None:
        out.add(names.DISCOVERY_PROBLEMS, len(topology.problems))


def _topology(out: _Families, topology: NodeTopology) -> None:
    out.add(names.GPUS, topology.gpu_count)
    out.add(names.NICS, len(topology.nics))
    out.add(names.NUMA_NODES, len(topology.numa_nodes))
    for g in topology.gpus:
        ids = _gpu_labels(g.index, g.uuid, g.pci_bus_id, g.name, topology.name)
        numa = "" if g.numa_node is None else str(g.numa_node)
        out.add(names.GPU_INFO, 1, *ids, g.name, numa)
        out.add(names.GPU_HEALTH, 1, *ids, g.health.name.lower(), g.health_reason)
        out.add(names.GPU_NVLINK_ACTIVE_LANES, g.nvlink_lanes, *ids)
        out.add(names.GPU_NVLINK_MAX_LANES, g.nvlink_max_lanes, *ids)
    for link in topology.links:
        a, b, kind = str(link.a), str(link.b), link.kind.name
        ids = _link_gpu_labels(topology, a, b)
        out.add(names.LINK_NOMINAL, link.nominal_gbps * _GB, *ids, a, b, kind, link.code)
        if link.measured is not None:
            method = link.measured.method
            out.add(names.LINK_MEASURED, link.measured.gbps * _GB, *ids, a, b, kind, method)
        health = link.health.name.lower()
        out.add(names.LINK_HEALTH, 1, *ids, a, b, kind, health, link.health_reason)
    degraded = sum(1 for lk in topology.links if lk.health is not LinkHealth.OK)
    out.add(names.DEGRADED_LINKS, degraded)


def dcgm_bus_id(bus_id: str) -> str:
    """A PCI address as DCGM exporter labels it (NVML's form: `00000000:B1:00.0`, an 8-digit
    domain, upper-case hex); gputopo keeps sysfs's `0000:b1:00.0`. Not an address: unchanged."""
    parts = bus_id.strip().split(":")
    if len(parts) == 3 and "." in parts[2]:
        device, _, function = parts[2].partition(".")
        try:
            return (
                f"{int(parts[0], 16):08X}:{int(parts[1], 16):02X}:{int(device, 16):02X}.{function}"
            )
        except ValueError:
            return bus_id
    return bus_id


def _gpu_labels(index: int, uuid: str, bus_id: str, model: str, node: str) -> tuple[str, ...]:
    """The values of `names.GPU_LABELS` for one GPU (`device` as dcgm-exporter forms it:
    `nvidia` and the index, internal/pkg/collector/base_collector.go)."""
    return str(index), uuid, dcgm_bus_id(bus_id), f"nvidia{index}", model, node, node


_NO_GPU = ("",) * len(names.GPU_LABELS)


def _link_gpu_labels(topology: NodeTopology, a: object, b: object) -> tuple[str, ...]:
    """The GPU labels of a link's first GPU end (`a`, else `b`), empty without one."""
    by_name = {f"gpu{g.index}": g for g in topology.gpus}
    for end in (str(a), str(b)):
        g = by_name.get(end)
        if g is not None:
            return _gpu_labels(g.index, g.uuid, g.pci_bus_id, g.name, topology.name)
    return _NO_GPU


def _readings(out: _Families, result: DiscoveryResult, node: str) -> None:
    uuids = {g.index: g.uuid for g in result.nvml.gpus}
    labels = {
        g.index: _gpu_labels(g.index, g.uuid, g.pci_bus_id, g.name, node) for g in result.nvml.gpus
    }
    for g in result.nvml.gpus:
        ids = labels[g.index]
        for which, gen, width in (
            ("current", g.pcie_generation, g.pcie_width),
            ("max", g.pcie_max_generation, g.pcie_max_width),
        ):
            if gen is not None:
                out.add(names.GPU_PCIE_GENERATION, gen, *ids, which)
            if width is not None:
                out.add(names.GPU_PCIE_WIDTH, width, *ids, which)
        for link in g.nvlinks:
            for counter, value in link.errors.items():
                out.add(names.GPU_NVLINK_ERRORS, value, *ids, str(link.link), counter)
    for pair in result.nvml.pairs:
        if pair.p2p_read is None:
            continue
        for me, peer in ((pair.a, pair.b), (pair.b, pair.a)):
            ids = labels.get(me, (str(me), *_NO_GPU[1:]))
            out.add(names.GPU_P2P_STATUS, 1, *ids, uuids.get(peer, str(peer)), pair.p2p_read.code)


def _probes(out: _Families, probes: ProbeResults) -> None:
    for probe, (ok, reason) in sorted(probes.available.items()):
        out.add(names.PROBE_AVAILABLE, 1 if ok else 0, probe, reason)
    for (probe, outcome), count in sorted(
        probes.outcomes.items(), key=lambda kv: (kv[0][0], kv[0][1].value)
    ):
        out.add(names.PROBE_RUNS, count, probe, outcome.value)
    for record in probes.records():
        m = record.measurement
        out.add(names.PROBE_BANDWIDTH, m.gbps * _GB, record.probe, record.target, m.method)
        for quantile, value in (("0.1", m.low_gbps), ("0.9", m.high_gbps)):
            if value is not None:
                out.add(names.PROBE_SPREAD, value * _GB, record.probe, record.target, quantile)
        if m.samples:
            out.add(names.PROBE_SAMPLES, m.samples, record.probe, record.target)
        if m.latency_us is not None:
            out.add(names.PROBE_LATENCY, m.latency_us / 1e6, record.probe, record.target)
        out.add(names.PROBE_DURATION, m.duration_s, record.probe, record.target)
        out.add(names.PROBE_SIZE, m.size_bytes, record.probe, record.target)
        out.add(names.PROBE_TIMESTAMP, m.measured_at, record.probe, record.target)


def _stream(out: _Families, stats: StreamStats | None) -> None:
    if stats is None:
        return
    out.add(names.STREAM_CONNECTED, 1 if stats.connected else 0)
    out.add(names.STREAM_HEARTBEAT_INTERVAL, stats.heartbeat_interval_s)
    out.add(names.STREAM_FAILURES, stats.failures)
    out.add(names.STREAM_MESSAGES, stats.snapshots_sent, "snapshot")
    out.add(names.STREAM_MESSAGES, stats.deltas_sent, "delta")
    out.add(names.STREAM_MESSAGES, stats.heartbeats_sent, "heartbeat")


def _kubelet(out: _Families, view: ExporterView) -> None:
    if view.pod_resources:
        use = view.gpu_use
        reason = "not read yet" if use is None else use.reason
        out.add(names.POD_RESOURCES_UP, 0 if reason else 1, reason)
    plugin = view.device_plugin
    if plugin is not None:
        out.add(names.DEVICE_PLUGIN_REGISTRATIONS, plugin.registrations, plugin.resource)
        for outcome in ("record", "best", "race"):
            out.add(
                names.DEVICE_PLUGIN_PREFERENCES,
                plugin.preferred.get(outcome, 0),
                plugin.resource,
                outcome,
            )
