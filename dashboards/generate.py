"""The Grafana dashboards of gputopo, as code: `python dashboards/generate.py` (`make dashboards`).

Built with Grafana's own grafana-foundation-sdk from the metric specs the processes serve
(`aggregator.metric_names`, `exporter.metric_names`, `scheduler.metrics`), so a renamed metric
breaks the generator, not a dashboard in production. The JSON files beside this script are its
output, committed so that Grafana provisioning (or an import) needs no Python; a test regenerates
them and fails when they are stale, and a Prometheus test proves every panel's query returns data
from a running aggregator, exporters and binder.

Per-node views use the exporters' labels: per-GPU series carry `hostname` (dcgm-exporter's
current spelling), link series are joined to their node through `gputopo_exporter_info` on the
scrape's `instance`. Counters are plotted as `rate()`/`increase()` over the panel's rate
interval, never raw (a raw counter only ever climbs and resets on restart). Measured and nominal
bandwidth are compared over the same links: the nominal sum keeps only links that have a
measurement (`and on(instance, a, b)`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueGraphMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from aggregator import metric_names as agg
from exporter import metric_names as exp
from gputopo.runtime.metrics import MetricSpec
from scheduler import metrics as sched

HERE = Path(__file__).resolve().parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


def sample(spec: MetricSpec) -> str:
    """The sample name a scrape shows (counters end in `_total`)."""
    return spec.name + ("_total" if spec.type == "counter" else "")


def bucket(spec: MetricSpec) -> str:
    """A histogram's bucket series."""
    assert spec.type == "histogram", spec.name
    return spec.name + "_bucket"


def on_node(expr: str) -> str:
    """An exporter series joined to its node's name (the exporter's info carries it)."""
    return f'{expr} * on(instance) group_left(node) {sample(exp.EXPORTER_INFO)}{{node="$node"}}'


def query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend or "__auto")
        .ref_id(ref)
        .datasource(DATASOURCE)
    )


def series(
    title: str, targets: Sequence[tuple[str, str]], *, unit: str = "", description: str = ""
) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).datasource(DATASOURCE).height(8).span(12)
    if unit:
        panel = panel.unit(unit)
    if description:
        panel = panel.description(description)
    for i, (expr, legend) in enumerate(targets):
        panel = panel.with_target(query(expr, legend, chr(ord("A") + i)))
    return panel


def figure(title: str, expr: str, legend: str = "", *, unit: str = "") -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .height(5)
        .span(6)
        .graph_mode(BigValueGraphMode.AREA)
        .with_target(query(expr, legend))
    )
    return panel.unit(unit) if unit else panel


def grid(title: str, expr: str) -> table.Panel:
    return (
        table.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .height(10)
        .span(24)
        .with_target(query(expr).format(PromQueryFormat.TABLE).instant())
    )


def base(uid: str, title: str, description: str) -> dashboard.Dashboard:
    source = dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["gputopo"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(source)
    )


def cluster() -> dashboard.Dashboard:
    nodes, gpus = sample(agg.NODES), sample(agg.GPUS)
    health, degraded = sample(exp.LINK_HEALTH), sample(exp.DEGRADED_LINKS)
    measured, nominal = sample(exp.LINK_MEASURED), sample(exp.LINK_NOMINAL)
    return (
        base(
            "gputopo-cluster",
            "gputopo / Cluster topology health",
            "Nodes and GPUs the aggregator knows, stale nodes, degraded links, bandwidth.",
        )
        .with_row(dashboard.Row("Nodes and GPUs"))
        .with_panel(figure("Nodes reporting", f'sum({nodes}{{status="reporting"}})'))
        .with_panel(figure("Nodes stale", f'sum({nodes}{{status="stale"}})'))
        .with_panel(figure("GPUs free", f'sum({gpus}{{state="free"}})'))
        .with_panel(figure("GPUs held", f'sum({gpus}{{state="held"}})'))
        .with_panel(series("Nodes by status", [(f"sum by (status) ({nodes})", "{{status}}")]))
        .with_panel(
            series(
                "Free GPUs by domain level",
                [(f'sum by (level) ({sample(agg.DOMAIN_GPUS)}{{state="free"}})', "{{level}}")],
            )
        )
        .with_row(dashboard.Row("Links"))
        .with_panel(
            series(
                "Degraded links per node",
                [
                    (
                        f"sum by (node) ({degraded} * on(instance) group_left(node) "
                        f"{sample(exp.EXPORTER_INFO)})",
                        "{{node}}",
                    )
                ],
            )
        )
        .with_panel(
            series(
                "Links by health and reason",
                [(f"count by (state, reason) ({health})", "{{state}} {{reason}}")],
            )
        )
        .with_panel(
            series(
                "Measured vs nominal bandwidth, by link kind",
                [
                    (f"sum by (kind) ({measured})", "measured {{kind}}"),
                    (
                        f"sum by (kind) ({nominal} and on(instance, a, b) {measured})",
                        "nominal {{kind}}",
                    ),
                ],
                unit="Bps",
                description=(
                    "Both sums over the same links, those with a measurement, per direction."
                ),
            )
        )
        .with_panel(
            series(
                "Report freshness (p99)",
                [
                    (
                        f"histogram_quantile(0.99, sum by (le) "
                        f"(rate({bucket(agg.REPORT_FRESHNESS)}[{RATE}])))",
                        "p99",
                    )
                ],
                unit="s",
            )
        )
    )


def node() -> dashboard.Dashboard:
    choose = (
        dashboard.QueryVariable("node")
        .label("Node")
        .datasource(DATASOURCE)
        .query(f"label_values({sample(exp.EXPORTER_INFO)}, node)")
    )
    return (
        base("gputopo-node", "gputopo / Node GPU links", "One node's GPUs and links.")
        .with_variable(choose)
        .with_panel(grid("GPUs", f'{sample(exp.GPU_INFO)}{{hostname="$node"}}'))
        .with_panel(
            series(
                "NVLink lanes active per GPU",
                [(f'{sample(exp.GPU_NVLINK_ACTIVE_LANES)}{{hostname="$node"}}', "GPU {{gpu}}")],
            )
        )
        .with_panel(
            series(
                "Link bandwidth, nominal, by pair",
                [(on_node(sample(exp.LINK_NOMINAL)), "{{a}}-{{b}} {{code}}")],
                unit="Bps",
            )
        )
        .with_panel(
            series(
                "Link bandwidth, measured, by pair",
                [(on_node(sample(exp.LINK_MEASURED)), "{{a}}-{{b}} {{method}}")],
                unit="Bps",
            )
        )
        .with_panel(grid("Link health", on_node(sample(exp.LINK_HEALTH))))
    )


def placement() -> dashboard.Dashboard:
    decisions, seconds = sample(agg.PLACEMENTS), agg.PLACEMENT_SECONDS
    return (
        base(
            "gputopo-placement",
            "gputopo / Placement",
            "Placement decisions, their latency, refusals and the reservations they hold.",
        )
        .with_panel(
            series(
                "Decisions by outcome and policy",
                [
                    (
                        f"sum by (outcome, policy) (rate({decisions}[{RATE}]))",
                        "{{outcome}} {{policy}}",
                    )
                ],
                unit="ops",
            )
        )
        .with_panel(
            series(
                "Decision latency",
                [
                    (
                        f"histogram_quantile({q}, sum by (le) (rate({bucket(seconds)}[{RATE}])))",
                        f"p{int(q * 100)}",
                    )
                    for q in (0.5, 0.9, 0.99)
                ],
                unit="s",
            )
        )
        .with_panel(
            series(
                "Refusals by status",
                [
                    (
                        f"sum by (code) (increase({sample(agg.PLACEMENT_REJECTIONS)}[{RATE}]))",
                        "{{code}}",
                    )
                ],
            )
        )
        .with_panel(
            series(
                "Reservations held",
                [(f"sum by (state) ({sample(agg.RESERVATIONS)})", "{{state}}")],
            )
        )
    )


def binder() -> dashboard.Dashboard:
    return (
        base(
            "gputopo-binder",
            "gputopo / Gang binder",
            "Gangs waiting, how long binding takes, and what the binder decided.",
        )
        .with_panel(figure("Gangs pending", f"sum({sample(sched.GROUPS_PENDING)})"))
        .with_panel(
            series(
                "Time to bind",
                [
                    (
                        f"histogram_quantile({q}, sum by (le) "
                        f"(rate({bucket(sched.TIME_TO_BIND)}[{RATE}])))",
                        f"p{int(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ],
                unit="s",
            )
        )
        .with_panel(
            series(
                "Decisions by outcome",
                [
                    (
                        f"sum by (outcome) (increase({sample(sched.DECISIONS)}[{RATE}]))",
                        "{{outcome}}",
                    )
                ],
            )
        )
        .with_panel(
            series(
                "Bind calls and repairs",
                [
                    (f"sum(increase({sample(sched.BIND_ATTEMPTS)}[{RATE}]))", "bind calls"),
                    (f"sum(increase({sample(sched.REPAIRS)}[{RATE}]))", "repairs"),
                ],
            )
        )
    )


DASHBOARDS = {
    "gputopo-cluster.json": cluster,
    "gputopo-node.json": node,
    "gputopo-placement.json": placement,
    "gputopo-binder.json": binder,
}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    encoder = JSONEncoder(sort_keys=True, indent=2)
    return {name: encoder.encode(build().build()) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: Sequence[str]) -> int:
    """Write the JSON files beside this script (`--check`: only say whether they are fresh)."""
    stale = []
    for name, text in render().items():
        path = HERE / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if "--check" not in argv:
            path.write_text(text, encoding="utf-8")
    if stale and "--check" in argv:
        print(f"stale: {', '.join(stale)}; run make dashboards", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
