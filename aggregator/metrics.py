"""The aggregator's Prometheus metrics: every name is defined here, read from live state.

A custom collector (prometheus/client_python's pattern for exporters) computes every figure at
scrape time from the cluster state, the domain index and the counters the parts keep, so
nothing is updated twice and a scrape always sees one consistent moment. Register it into the
registry the server passes in; dashboards must use only the names in `METRIC_NAMES`.

Per-node series are left out on purpose (2,000 nodes would be thousands of series per metric);
domains are reported for NVLink domains, fabric tiers and zones, not single nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from aggregator.indexes import NODE
from aggregator.ingest import FRESHNESS_BUCKETS, IngestStats
from aggregator.leader import LeaderElector
from aggregator.probes import ProbeCoordinator
from aggregator.publisher import LabelPublisher
from aggregator.state import ClusterState

__all__ = ["METRIC_NAMES", "AggregatorCollector", "Sources"]

_P = "gputopo_aggregator_"
METRIC_NAMES = (
    f"{_P}nodes",
    f"{_P}gpus",
    f"{_P}domain_gpus",
    f"{_P}topology_generation",
    f"{_P}reservations",
    f"{_P}reports_total",
    f"{_P}reports_rejected_total",
    f"{_P}report_freshness_seconds",
    f"{_P}streams",
    f"{_P}streams_superseded_total",
    f"{_P}streams_refused_total",
    f"{_P}fabric_source_nodes",
    f"{_P}fabric_conflicts",
    f"{_P}label_patches_total",
    f"{_P}label_conflicts_total",
    f"{_P}label_throttled_total",
    f"{_P}label_errors_total",
    f"{_P}label_foreign_keys_total",
    f"{_P}leader",
    f"{_P}leader_transitions_total",
    f"{_P}probe_results_total",
    f"{_P}probe_pairs",
    f"{_P}probe_levels",
)


@dataclass(slots=True)
class Sources:
    """What the collector reads; parts that are not running are None."""

    state: ClusterState
    ingest: IngestStats
    publisher: LabelPublisher | None = None
    elector: LeaderElector | None = None
    probes: ProbeCoordinator | None = None


class AggregatorCollector(Collector):
    """Metrics over the live aggregator (see the module docstring)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        """One scrape."""
        yield from self._cluster()
        yield from self._ingest()
        yield from self._fabric()
        yield from self._writers()

    def _cluster(self) -> Iterator[Metric]:
        state = self.sources.state
        stale = set(state.stale_nodes())
        nodes = GaugeMetricFamily(f"{_P}nodes", "Nodes known, by status.", labels=["status"])
        counts: Counter[str] = Counter()
        total = free = 0
        held = state.held_gpus()
        for name in state.node_names:
            rec = state.record(name)
            if rec is None:
                continue
            status = (
                "static"
                if rec.source != "exporter"
                else ("stale" if name in stale else "reporting")
            )
            counts[status] += 1
            total += rec.topology.gpu_count
            if name not in stale:
                free += len(state.free_gpus(name))
        for status in ("reporting", "stale", "static"):
            nodes.add_metric([status], counts[status])
        yield nodes
        gpus = GaugeMetricFamily(f"{_P}gpus", "GPUs, by state.", labels=["state"])
        gpus.add_metric(["total"], total)
        gpus.add_metric(["free"], free)
        gpus.add_metric(["held"], sum(len(g) for g in held.values()))
        yield gpus
        domains = GaugeMetricFamily(
            f"{_P}domain_gpus",
            "GPUs per domain (NVLink domain, fabric tier, zone), total and free.",
            labels=["level", "domain", "state"],
        )
        for level in sorted(state.index.levels()):
            if level == NODE:
                continue
            for domain, stats in sorted(state.index.domains(level).items()):
                domains.add_metric([level, domain, "total"], stats.total_gpus)
                domains.add_metric([level, domain, "free"], stats.free_gpus)
        yield domains
        yield GaugeMetricFamily(
            f"{_P}topology_generation",
            "Changes the aggregator accepted since it started.",
            value=state.generation,
        )
        res = GaugeMetricFamily(f"{_P}reservations", "Live reservations.", labels=["state"])
        reservations = state.reservations()
        res.add_metric(["committed"], sum(1 for r in reservations if r.committed))
        res.add_metric(["pending"], sum(1 for r in reservations if not r.committed))
        yield res

    def _ingest(self) -> Iterator[Metric]:
        stats = self.sources.ingest
        reports = CounterMetricFamily(
            f"{_P}reports", "Exporter messages, by kind and outcome.", labels=["kind", "outcome"]
        )
        for (kind, outcome), n in sorted(stats.messages.items()):
            reports.add_metric([kind, outcome], n)
        yield reports
        rejected = CounterMetricFamily(
            f"{_P}reports_rejected", "Invalid exporter messages, by field.", labels=["field"]
        )
        for name, n in sorted(stats.rejected.items()):
            rejected.add_metric([name], n)
        yield rejected
        # IngestStats keeps the buckets cumulative already, as Prometheus wants them.
        buckets = [
            (str(bound), n)
            for bound, n in zip(FRESHNESS_BUCKETS, stats.freshness_buckets, strict=True)
        ]
        buckets.append(("+Inf", stats.freshness_count))
        yield HistogramMetricFamily(
            f"{_P}report_freshness_seconds",
            "From an exporter sending a snapshot or delta to the state having applied it.",
            buckets=buckets,
            sum_value=stats.freshness_sum,
        )
        yield GaugeMetricFamily(f"{_P}streams", "Open report streams.", value=stats.streams)
        yield CounterMetricFamily(
            f"{_P}streams_superseded",
            "Report streams replaced by a newer stream for the same node.",
            value=stats.superseded,
        )
        yield CounterMetricFamily(
            f"{_P}streams_refused",
            "Report streams refused: a newer exporter already reports the node.",
            value=stats.refused,
        )

    def _fabric(self) -> Iterator[Metric]:
        state = self.sources.state
        by_source: Counter[tuple[str, str]] = Counter()
        conflicts: Counter[str] = Counter()
        for name in state.node_names:
            rec = state.record(name)
            if rec is None or rec.resolution is None:
                continue
            for dimension, source in rec.resolution.chosen.items():
                by_source[(dimension, source)] += 1
            for c in rec.resolution.conflicts:
                conflicts[c.dimension] += 1
        sources = GaugeMetricFamily(
            f"{_P}fabric_source_nodes",
            "Nodes whose fabric dimension (tiers, accelerator, zone) came from a source.",
            labels=["dimension", "source"],
        )
        for (dimension, source), n in sorted(by_source.items()):
            sources.add_metric([dimension, source], n)
        yield sources
        conflict = GaugeMetricFamily(
            f"{_P}fabric_conflicts",
            "Disagreements between fabric sources (the higher-precedence one won).",
            labels=["dimension"],
        )
        for dimension, n in sorted(conflicts.items()):
            conflict.add_metric([dimension], n)
        yield conflict
        probes = self.sources.probes
        if probes is not None:
            yield CounterMetricFamily(
                f"{_P}probe_results", "Peer probe results ingested.", value=probes.results
            )
            yield GaugeMetricFamily(
                f"{_P}probe_pairs", "Node pairs with a probe result.", value=probes.book.pair_count
            )
            yield GaugeMetricFamily(
                f"{_P}probe_levels",
                "Latency levels inferred from probes (tiers + 1).",
                value=len(probes.book.inference().levels),
            )

    def _writers(self) -> Iterator[Metric]:
        pub = self.sources.publisher
        if pub is not None:
            s = pub.stats
            for name, value, text in (
                ("label_patches", s.patches, "Node label patches sent."),
                ("label_conflicts", s.conflicts, "Label patches refused with 409 and retried."),
                ("label_throttled", s.throttled, "Label patches throttled by the API server."),
                ("label_errors", s.errors, "Label publishing errors."),
            ):
                yield CounterMetricFamily(f"{_P}{name}", text, value=value)
            foreign = CounterMetricFamily(
                f"{_P}label_foreign_keys",
                "Times a wanted label was left alone because someone else owns it.",
                labels=["key"],
            )
            for key, n in sorted(s.foreign.items()):
                foreign.add_metric([key], n)
            yield foreign
        elector = self.sources.elector
        leading = elector is None or elector.is_leader
        yield GaugeMetricFamily(f"{_P}leader", "1 while this replica leads.", value=int(leading))
        if elector is not None:
            yield CounterMetricFamily(
                f"{_P}leader_transitions",
                "Times this replica became the leader.",
                value=elector.transitions,
            )
