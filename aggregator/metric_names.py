"""Every metric the aggregator serves, in one place: name, type, help and labels.

The shape is the exporter's (`gputopo.runtime.metrics.MetricSpec`); the collector
(`aggregator.metrics`) builds every family from these specs, and dashboards use only these
names. The `level` label of `domain_gpus` is spelt by `gputopo.domains` (`nvlink`, `tier-N`,
`zone`), the same words as GetTopology's domain levels and the rejections' domain names.
"""

from __future__ import annotations

from gputopo.runtime.metrics import MetricSpec, counter, gauge, histogram, sample_names

__all__ = ["ALL", "METRIC_NAMES", "MetricSpec"]

_P = "gputopo_aggregator_"

NODES = gauge("nodes", "Nodes known, by status.", "status", prefix=_P)
GPUS = gauge("gpus", "GPUs, by state.", "state", prefix=_P)
DOMAIN_GPUS = gauge(
    "domain_gpus",
    "GPUs per domain (NVLink domain, fabric tier, zone), total and free.",
    "level",
    "domain",
    "state",
    prefix=_P,
)
TOPOLOGY_GENERATION = gauge(
    "topology_generation", "Changes the aggregator accepted since it started.", prefix=_P
)
RESERVATIONS = gauge("reservations", "Live reservations.", "state", prefix=_P)
PLACEMENTS = counter(
    "placements",
    "Placement searches, by outcome (placed, unplaced, dry_run) and policy.",
    "outcome",
    "policy",
    prefix=_P,
)
PLACEMENT_SECONDS = histogram(
    "placement_seconds", "How long a placement search took to decide.", prefix=_P
)
PLACEMENT_REJECTIONS = counter(
    "placement_rejections",
    "Place, Commit and Release calls refused, by gRPC status (INVALID_ARGUMENT, ...).",
    "code",
    prefix=_P,
)
REPORTS = counter(
    "reports", "Exporter messages, by kind and outcome.", "kind", "outcome", prefix=_P
)
REPORTS_REJECTED = counter(
    "reports_rejected", "Invalid exporter messages, by field.", "field", prefix=_P
)
REPORT_FRESHNESS = histogram(
    "report_freshness_seconds",
    "From an exporter sending a snapshot or delta to the state having applied it.",
    prefix=_P,
)
STREAMS = gauge("streams", "Open report streams.", prefix=_P)
HEARTBEAT_INTERVAL = gauge(
    "heartbeat_interval_seconds",
    "The heartbeat interval acknowledgements announce now: the configured one, or longer with"
    " many report streams (--max-heartbeats-per-second).",
    prefix=_P,
)
STALE_AFTER = gauge(
    "stale_after_seconds",
    "Seconds of silence after which a node is stale now (follows the heartbeat interval).",
    prefix=_P,
)
STREAMS_SUPERSEDED = counter(
    "streams_superseded",
    "Report streams replaced by a newer stream for the same node.",
    prefix=_P,
)
NODES_FORGOTTEN = counter(
    "nodes_forgotten",
    "Nodes forgotten after --ghost-ttl with no report stream and no Kubernetes Node object.",
    prefix=_P,
)
STREAMS_REFUSED = counter(
    "streams_refused",
    "Report streams refused: a newer exporter already reports the node.",
    prefix=_P,
)
FABRIC_SOURCE_NODES = gauge(
    "fabric_source_nodes",
    "Nodes whose fabric dimension (tiers, accelerator, zone) came from a source.",
    "dimension",
    "source",
    prefix=_P,
)
FABRIC_CONFLICTS = gauge(
    "fabric_conflicts",
    "Disagreements between fabric sources (the higher-precedence one won).",
    "dimension",
    prefix=_P,
)
LABEL_PATCHES = counter("label_patches", "Node label patches sent.", prefix=_P)
LABEL_CONFLICTS = counter(
    "label_conflicts", "Label patches refused with 409 and retried.", prefix=_P
)
LABEL_THROTTLED = counter(
    "label_throttled", "Label patches throttled by the API server.", prefix=_P
)
LABEL_ERRORS = counter("label_errors", "Label publishing errors.", prefix=_P)
LABEL_FOREIGN_KEYS = counter(
    "label_foreign_keys",
    "Times a wanted label was left alone because someone else owns it.",
    "key",
    prefix=_P,
)
LEADER = gauge("leader", "1 while this replica leads.", prefix=_P)
LEADER_TRANSITIONS = counter(
    "leader_transitions", "Times this replica became the leader.", prefix=_P
)
PROBE_RESULTS = counter("probe_results", "Peer probe results ingested.", prefix=_P)
PROBE_PAIRS = gauge("probe_pairs", "Node pairs with a probe result.", prefix=_P)
PROBE_LEVELS = gauge("probe_levels", "Latency levels inferred from probes (tiers + 1).", prefix=_P)
GPU_CHOICE_MISMATCHES = counter(
    "gpu_choice_mismatches",
    "Pods the kubelet gave a GPU outside gputopo's record for them, by node (PodResources;"
    " each also gets an Event). Per node on purpose: few series, and the node is the lead."
    " Named as the node's own metrics (gputopo_, not gputopo_aggregator_): it is about the node.",
    "node",
)

ALL: tuple[MetricSpec, ...] = tuple(
    v for v in list(globals().values()) if isinstance(v, MetricSpec)
)
# What a scrape shows (counters with `_total`), for dashboards and tests.
METRIC_NAMES = sample_names(ALL)
