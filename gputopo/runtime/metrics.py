"""One shape for every metric a gputopo process serves: name, type, help, labels.

Each process declares its families as `MetricSpec`s in one module (`exporter.metric_names`,
`aggregator.metric_names`); its collector builds every family from a spec with `family`, so a
name, its help and its labels cannot drift between the code, the dashboards and the tests.
Names follow Prometheus conventions: the `gputopo_` prefix, base units, and counters named
without `_total` (prometheus_client adds it to the samples; `sample_names` says what is served).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

__all__ = [
    "MetricSpec",
    "counter",
    "family",
    "gauge",
    "histogram",
    "histogram_family",
    "sample_names",
]

MetricType = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()


def gauge(name: str, help_text: str, *labels: str, prefix: str = "gputopo_") -> MetricSpec:
    """A gauge spec named `prefix + name`."""
    return MetricSpec(f"{prefix}{name}", "gauge", help_text, labels)


def counter(name: str, help_text: str, *labels: str, prefix: str = "gputopo_") -> MetricSpec:
    """A counter spec; `name` goes without `_total` (prometheus_client adds it)."""
    return MetricSpec(f"{prefix}{name}", "counter", help_text, labels)


def histogram(name: str, help_text: str, *labels: str, prefix: str = "gputopo_") -> MetricSpec:
    """A histogram spec."""
    return MetricSpec(f"{prefix}{name}", "histogram", help_text, labels)


def family(
    spec: MetricSpec, *, value: float | None = None
) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty gauge or counter family for `spec` (or one with a single unlabelled `value`)."""
    if spec.type == "histogram":
        raise ValueError(f"{spec.name} is a histogram: use histogram_family")
    cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
    if value is not None:
        return cls(spec.name, spec.help, value=value)
    return cls(spec.name, spec.help, labels=spec.labels)


def histogram_family(
    spec: MetricSpec, *, buckets: Sequence[tuple[str, float]], sum_value: float
) -> HistogramMetricFamily:
    """A histogram family for `spec` with cumulative `buckets` (the last one `+Inf`)."""
    if spec.type != "histogram":
        raise ValueError(f"{spec.name} is a {spec.type}, not a histogram")
    return HistogramMetricFamily(spec.name, spec.help, buckets=buckets, sum_value=sum_value)


def sample_names(specs: Iterable[MetricSpec]) -> tuple[str, ...]:
    """The names a scrape shows for these families (counters with `_total`)."""
    return tuple(s.name + ("_total" if s.type == "counter" else "") for s in specs)
