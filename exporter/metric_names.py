"""Every metric the exporter serves, in one place: name, type, help and labels.

Dashboards, alerts and tests use only names defined here (the metrics collector builds every
family from these specs, so a name cannot drift between code and dashboard). Names follow
Prometheus conventions (the shape is `gputopo.runtime.metrics.MetricSpec`, the same for
every process): the `gputopo_` prefix, base units (bytes per second, seconds), `_total`
for counters; bandwidth here is bytes/s per direction, where the rest of gputopo says GB/s.

Labels: every per-GPU series carries DCGM exporter's own GPU labels, spelt and formatted as it
does (`GPU_LABELS`: `gpu` the NVML index, `UUID`, `pci_bus_id` as `00000000:18:00.0`, `device`
as `nvidia0`, `modelName` the GPU's name, and the host as both `hostname`, current releases'
spelling, and `Hostname`, that of releases up to 3.x), so `gputopo_gpu_info * on(UUID)
group_left DCGM_FI_DEV_GPU_UTIL` and the like join without relabelling. The host is the node's
name: dcgm-exporter writes `$NODE_NAME` when set (its chart sets it to the pod's node) and the OS
hostname otherwise (internal/pkg/hostname/hostname.go, getLocalHostname), and gputopo's
exporter names its node the same way (`NODE_NAME`, else the hostname). `gpu_p2p_status` carries
them for its GPU (`peer` is the other GPU's UUID); link series carry them for the link's first
GPU end (`a`, or `b` when `a` is not a GPU; empty for a link without one). A link's ends `a` and
`b` are device names such as `gpu0`, `nic3`, `numa1`; `kind` the link kind (NVLINK, PIX, ...
SYS) and `code` nvidia-smi's cell (NV18, PXB); `state` is `ok`, `degraded` or `down`.
"""

from __future__ import annotations

from gputopo.runtime.metrics import MetricSpec, counter, gauge

__all__ = ["ALL", "GPU_LABELS", "MetricSpec"]

# dcgm-exporter's per-GPU labels (internal/pkg/rendermetrics/render_metrics.go, its metrics
# template: gpu, UUID, pci_bus_id, device, modelName, hostname; `Hostname` as its releases up to
# 3.x spelt it), first on every per-GPU family here.
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname")


def _gauge(name: str, help_text: str, *labels: str) -> MetricSpec:
    return gauge(name, help_text, *labels)


def _counter(name: str, help_text: str, *labels: str) -> MetricSpec:
    # prometheus_client adds `_total` to counter samples; the family name goes without it.
    return counter(name, help_text, *labels)


EXPORTER_INFO = _gauge(
    "exporter_info", "Exporter version and node name (always 1).", "version", "node"
)
NVML_UP = _gauge(
    "nvml_up", "1 when NVML answered on the last discovery, 0 when not (no GPU or driver)."
)
NVML_INFO = _gauge(
    "nvml_info",
    "NVML driver and CUDA versions, or why NVML is not up (always 1).",
    "driver_version",
    "cuda_version",
    "reason",
)
GPUS = _gauge("gpus", "GPUs discovered on the node.")
NICS = _gauge("nics", "Network adapters discovered on the node.")
NUMA_NODES = _gauge("numa_nodes", "NUMA nodes discovered on the node.")
GPU_INFO = _gauge(
    "gpu_info",
    "One GPU as discovered (always 1).",
    *GPU_LABELS,
    "name",
    "numa_node",
)
GPU_HEALTH = _gauge(
    "gpu_health", "A GPU's health (1 for its current state).", *GPU_LABELS, "state", "reason"
)
GPU_NVLINK_ACTIVE_LANES = _gauge("gpu_nvlink_active_lanes", "Active NVLinks of a GPU.", *GPU_LABELS)
GPU_NVLINK_MAX_LANES = _gauge("gpu_nvlink_max_lanes", "NVLinks a GPU has, up or down.", *GPU_LABELS)
GPU_NVLINK_ERRORS = _counter(
    "gpu_nvlink_errors",
    "NVLink error counters as NVML reports them (replay, recovery, crc_flit, crc_data).",
    *GPU_LABELS,
    "link",
    "counter",
)
GPU_PCIE_GENERATION = _gauge(
    "gpu_pcie_link_generation",
    "PCIe generation of a GPU's link as NVML reads it now (`current`, low when idle) and at most.",
    *GPU_LABELS,
    "which",
)
GPU_PCIE_WIDTH = _gauge(
    "gpu_pcie_link_width", "PCIe lanes of a GPU's link, now and at most.", *GPU_LABELS, "which"
)
GPU_P2P_STATUS = _gauge(
    "gpu_p2p_status",
    "NVML P2P read status of a GPU pair (1 for its status: OK, CNS, GNS, TNS, DR, NS, U).",
    *GPU_LABELS,
    "peer",
    "status",
)
LINK_NOMINAL = _gauge(
    "link_bandwidth_nominal_bytes_per_second",
    "Facts-table bandwidth of a link as it is now, per direction.",
    *GPU_LABELS,
    "a",
    "b",
    "kind",
    "code",
)
LINK_MEASURED = _gauge(
    "link_bandwidth_measured_bytes_per_second",
    "Last probe measurement of a link, per direction.",
    *GPU_LABELS,
    "a",
    "b",
    "kind",
    "method",
)
LINK_HEALTH = _gauge(
    "link_health",
    "A link's health (1 for its current state).",
    *GPU_LABELS,
    "a",
    "b",
    "kind",
    "state",
    "reason",
)
DEGRADED_LINKS = _gauge("degraded_links", "Links whose health is not ok.")
PROBE_AVAILABLE = _gauge(
    "probe_available", "1 when a probe can run here, 0 with the reason when not.", "probe", "reason"
)
PROBE_RUNS = _counter(
    "probe_runs",
    "Probe attempts by outcome (measured, skipped_busy, unavailable, failed).",
    "probe",
    "outcome",
)
PROBE_BANDWIDTH = _gauge(
    "probe_bandwidth_bytes_per_second",
    "Bandwidth a probe measured, per direction.",
    "probe",
    "target",
    "method",
)
PROBE_SPREAD = _gauge(
    "probe_bandwidth_spread_bytes_per_second",
    "10th and 90th percentile of a probe's samples (the median is probe_bandwidth).",
    "probe",
    "target",
    "quantile",
)
PROBE_SAMPLES = _gauge("probe_samples", "Samples behind a probe's median.", "probe", "target")
PROBE_LATENCY = _gauge("probe_latency_seconds", "Latency a probe measured.", "probe", "target")
PROBE_DURATION = _gauge(
    "probe_duration_seconds", "How long a probe measurement took.", "probe", "target"
)
PROBE_SIZE = _gauge("probe_size_bytes", "Transfer size a probe used.", "probe", "target")
PROBE_TIMESTAMP = _gauge(
    "probe_timestamp_seconds", "When a probe measured (unix time).", "probe", "target"
)
DISCOVERY_RUNS = _counter("discovery_runs", "Discovery passes.")
DISCOVERY_ERRORS = _counter(
    "discovery_errors",
    "Calls that failed during discovery, by source (nvml, sysfs; exception: a pass that crashed).",
    "source",
)
DISCOVERY_PROBLEMS = _gauge(
    "discovery_problems", "Problem lines of the last discovery (facts it could not get)."
)
DISCOVERY_DURATION = _gauge("discovery_duration_seconds", "Duration of the last discovery pass.")
DISCOVERY_TIMESTAMP = _gauge(
    "discovery_timestamp_seconds", "When the last discovery pass started (unix time)."
)
STREAM_CONNECTED = _gauge(
    "report_stream_connected", "1 while the report stream to the aggregator is open."
)
STREAM_HEARTBEAT_INTERVAL = _gauge(
    "report_heartbeat_interval_seconds",
    "Silence after which the report stream sends a heartbeat: the interval the aggregator's"
    " acknowledgements announce (it grows with the cluster), else the agent's own.",
)
STREAM_FAILURES = _counter(
    "report_stream_failures", "Report streams that ended (the agent reconnects)."
)
STREAM_MESSAGES = _counter(
    "report_messages", "Reports sent, by kind (snapshot, delta, heartbeat).", "kind"
)
POD_RESOURCES_UP = _gauge(
    "pod_resources_up",
    "1 when the kubelet's PodResources API answered the last read; 0 with the reason when not"
    " (no socket, no permission to open it, no answer): held GPUs are then not known.",
    "reason",
)
DEVICE_PLUGIN_REGISTRATIONS = _counter(
    "device_plugin_registrations",
    "Registrations of the device plugin with the kubelet (one more after each kubelet restart).",
    "resource",
)
DEVICE_PLUGIN_PREFERENCES = _counter(
    "device_plugin_preferences",
    "GetPreferredAllocation answers: record (the binder's GPUs), best (no record: the"
    " link-graph-best set), race (more than one recorded pod fitted the request).",
    "resource",
    "outcome",
)

ALL: tuple[MetricSpec, ...] = tuple(
    v for v in list(globals().values()) if isinstance(v, MetricSpec)
)
