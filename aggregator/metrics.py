"""The aggregator's Prometheus metrics: every name is defined here, read from live state.

A custom collector (prometheus/client_python's pattern for exporters) computes every figure at
scrape time from the cluster state, the domain index and the counters the parts keep, so
nothing is updated twice and a scrape always sees one consistent moment. Register it into the
registry the server passes in. Every family is built from its spec in `aggregator.metric_names`;
dashboards must use only the names in `METRIC_NAMES`.

Per-node series are left out on purpose (2,000 nodes would be thousands of series per metric);
domains are reported for NVLink domains, fabric tiers and zones, not single nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from aggregator import metric_names as names
from aggregator.ingest import FRESHNESS_BUCKETS, IngestStats
from aggregator.metric_names import METRIC_NAMES
from aggregator.probes import ProbeCoordinator
from aggregator.publisher import LabelPublisher
from aggregator.state import ClusterState
from gputopo.core import PLACEMENT_BUCKETS, PlacementStats
from gputopo.domains import NODE
from gputopo.runtime.leader import LeaderElector
from gputopo.runtime.metrics import family, histogram_family

__all__ = ["METRIC_NAMES", "AggregatorCollector", "Sources"]


@dataclass(slots=True)
class Sources:
    """What the collector reads; parts that are not running are None."""

    state: ClusterState
    ingest: IngestStats
    publisher: LabelPublisher | None = None
    elector: LeaderElector | None = None
    probes: ProbeCoordinator | None = None
    placement: PlacementStats | None = None


class AggregatorCollector(Collector):
    """Metrics over the live aggregator (see the module docstring)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        """One scrape."""
        yield from self._cluster()
        yield from self._placement()
        yield from self._ingest()
        yield from self._fabric()
        yield from self._writers()

    def _cluster(self) -> Iterator[Metric]:
        state = self.sources.state
        stale = set(state.stale_nodes())
        nodes = family(names.NODES)
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
        gpus = family(names.GPUS)
        gpus.add_metric(["total"], total)
        gpus.add_metric(["free"], free)
        gpus.add_metric(["held"], sum(len(g) for g in held.values()))
        yield gpus
        domains = family(names.DOMAIN_GPUS)
        for level in sorted(state.index.levels()):
            if level == NODE:
                continue
            for domain, stats in sorted(state.index.domains(level).items()):
                domains.add_metric([level, domain, "total"], stats.total_gpus)
                domains.add_metric([level, domain, "free"], stats.free_gpus)
        yield domains
        yield family(names.TOPOLOGY_GENERATION, value=state.generation)
        res = family(names.RESERVATIONS)
        reservations = state.reservations()
        res.add_metric(["committed"], sum(1 for r in reservations if r.committed))
        res.add_metric(["pending"], sum(1 for r in reservations if not r.committed))
        yield res
        choices = family(names.GPU_CHOICE_MISMATCHES)
        for node, n in sorted(state.choices.counts.items()):
            choices.add_metric([node], n)
        yield choices

    def _placement(self) -> Iterator[Metric]:
        stats = self.sources.placement
        if stats is None:
            return
        decisions = family(names.PLACEMENTS)
        for (outcome, policy), n in sorted(stats.decisions.items()):
            decisions.add_metric([outcome, policy], n)
        yield decisions
        # cumulative already: PlacementStats counts a decision in every bucket it fits
        buckets = [(str(b), n) for b, n in zip(PLACEMENT_BUCKETS, stats.buckets, strict=True)]
        buckets.append(("+Inf", stats.count))
        yield histogram_family(names.PLACEMENT_SECONDS, buckets=buckets, sum_value=stats.total_s)
        rejections = family(names.PLACEMENT_REJECTIONS)
        for code, n in sorted(stats.rejections.items()):
            rejections.add_metric([code], n)
        yield rejections

    def _ingest(self) -> Iterator[Metric]:
        stats = self.sources.ingest
        reports = family(names.REPORTS)
        for (kind, outcome), n in sorted(stats.messages.items()):
            reports.add_metric([kind, outcome], n)
        yield reports
        rejected = family(names.REPORTS_REJECTED)
        for name, n in sorted(stats.rejected.items()):
            rejected.add_metric([name], n)
        yield rejected
        # IngestStats keeps the buckets cumulative already, as Prometheus wants them.
        buckets = [
            (str(bound), n)
            for bound, n in zip(FRESHNESS_BUCKETS, stats.freshness_buckets, strict=True)
        ]
        buckets.append(("+Inf", stats.freshness_count))
        yield histogram_family(
            names.REPORT_FRESHNESS, buckets=buckets, sum_value=stats.freshness_sum
        )
        yield family(names.STREAMS, value=stats.streams)
        yield family(names.HEARTBEAT_INTERVAL, value=stats.heartbeat_interval_s)
        yield family(names.STALE_AFTER, value=self.sources.state.stale_after_s)
        yield family(names.STREAMS_SUPERSEDED, value=stats.superseded)
        yield family(names.STREAMS_REFUSED, value=stats.refused)
        yield family(names.NODES_FORGOTTEN, value=stats.ghosts)

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
        sources = family(names.FABRIC_SOURCE_NODES)
        for (dimension, source), n in sorted(by_source.items()):
            sources.add_metric([dimension, source], n)
        yield sources
        conflict = family(names.FABRIC_CONFLICTS)
        for dimension, n in sorted(conflicts.items()):
            conflict.add_metric([dimension], n)
        yield conflict
        probes = self.sources.probes
        if probes is not None:
            yield family(names.PROBE_RESULTS, value=probes.results)
            yield family(names.PROBE_PAIRS, value=probes.book.pair_count)
            yield family(names.PROBE_LEVELS, value=len(probes.book.inference().levels))

    def _writers(self) -> Iterator[Metric]:
        pub = self.sources.publisher
        if pub is not None:
            s = pub.stats
            for spec, value in (
                (names.LABEL_PATCHES, s.patches),
                (names.LABEL_CONFLICTS, s.conflicts),
                (names.LABEL_THROTTLED, s.throttled),
                (names.LABEL_ERRORS, s.errors),
            ):
                yield family(spec, value=value)
            foreign = family(names.LABEL_FOREIGN_KEYS)
            for key, n in sorted(s.foreign.items()):
                foreign.add_metric([key], n)
            yield foreign
        elector = self.sources.elector
        leading = elector is None or elector.is_leader
        yield family(names.LEADER, value=int(leading))
        if elector is not None:
            yield family(names.LEADER_TRANSITIONS, value=elector.transitions)
