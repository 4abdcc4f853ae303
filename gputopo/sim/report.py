"""A replay's summaries as a table for people, and as PNG plots (matplotlib, the `sim` extra).

Plots are optional: matplotlib is imported only when plots are asked for, so the simulator runs
without it; asking for plots without it is an error that says which extra to install.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PlotsUnavailableError", "table", "write_plots"]


class PlotsUnavailableError(RuntimeError):
    """--plots without matplotlib installed."""


def _h(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds / 3600:.2f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def _f(x: float, digits: int = 2) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


_COLUMNS = (
    ("policy", 13),
    ("ran", 6),
    ("JCT mean h", 10),
    ("p50", 7),
    ("p95", 7),
    ("p99", 7),
    ("wait mean h", 11),
    ("p95", 7),
    ("makespan d", 10),
    ("alloc %", 7),
    ("@100%", 6),
    ("frag %free", 10),
    ("free nodes", 10),
    ("free NVLd", 9),
    ("slow mean", 9),
    ("p95", 6),
    ("TPxnode", 8),
    ("KVxroot/node/leaf", 17),
    ("wall s", 7),
)


def table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """One row per policy, then mean JCT of gputopo against each baseline."""
    head = " ".join(name.rjust(width) for name, width in _COLUMNS)
    lines = [head, "-" * len(head)]
    for s in summaries:
        jct, wait = s["jct_s"], s["queueing_s"]
        alloc = s["allocation"]
        kv = s["kv_pairs"]
        cells = (
            s["policy"],
            str(s["jobs"]["ran"]),
            _h(jct["mean"]),
            _h(jct["p50"]),
            _h(jct["p95"]),
            _h(jct["p99"]),
            _h(wait["mean"]),
            _h(wait["p95"]),
            _f(s["makespan_s"] / 86400),
            _pct(alloc),
            _pct(s["allocation_at_full_demand"]),
            _pct(s["fragmentation"]["share_of_free"]),
            _f(s["free_nodes"]["mean"], 1),
            _f(s["free_nvlink_domains"]["mean"], 1),
            _f(s["comm_slowdown"]["mean"], 3),
            _f(s["comm_slowdown"]["p95"]),
            f"{s['tp_gangs']['tp_across_nodes']}/{s['tp_gangs']['with_tp']}",
            f"{kv['across_pci_root']}/{kv['across_node']}/{kv['across_leaf']} of {kv['total']}",
            _f(s["wall_s"], 1),
        )
        lines.append(" ".join(c.rjust(w) for c, (_, w) in zip(cells, _COLUMNS, strict=True)))
    by = {s["policy"]: s for s in summaries}
    mine = by.get("gputopo")
    if mine is not None and len(by) > 1:
        lines.append("")
        lines.append("gputopo against each baseline (ratio of means; alloc in points):")
        for name, other in by.items():
            if name == "gputopo":
                continue
            jct = (
                mine["jct_s"]["mean"] / other["jct_s"]["mean"]
                if other["jct_s"]["mean"]
                else math.nan
            )
            wait_o = other["queueing_s"]["mean"]
            wait = mine["queueing_s"]["mean"] / wait_o if wait_o else math.nan
            points = 100 * (mine["allocation"] - other["allocation"])
            dom = mine["free_nvlink_domains"]["mean"] - other["free_nvlink_domains"]["mean"]
            lines.append(
                f"  vs {name:13} JCT x{_f(jct, 3)}  wait x{_f(wait, 3)}  "
                f"alloc {points:+.1f} pt  free NVLink domains {dom:+.1f}"
            )
    return "\n".join(lines)


def write_plots(
    out: Path,
    series: Mapping[str, Mapping[str, Sequence[float]]],
    jcts: Mapping[str, Sequence[float]],
) -> list[Path]:
    """allocation.png (over time, per policy), jct_cdf.png, and free_domains.png when any."""
    # matplotlib is an optional extra, imported only when plots are asked for.
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise PlotsUnavailableError(
            "--plots needs matplotlib: pip install 'gputopo[sim]'"
        ) from None
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for policy, s in series.items():
        ax.plot([t / 3600 for t in s["time_s"]], [100 * a for a in s["allocation"]], label=policy)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "allocation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    if not any(jcts.values()):  # arrive-all traces: nobody completes
        ax.text(0.5, 0.5, "no job completed (arrive-all trace)", ha="center", va="center")
    for policy, values in jcts.items():
        if not values:
            continue
        ordered = sorted(v / 3600 for v in values)
        n = len(ordered)
        ax.step(ordered, [(k + 1) / n for k in range(n)], where="post", label=policy)
    if any(jcts.values()):
        ax.set_xscale("log")
        ax.legend(fontsize="small")
    ax.set_xlabel("job completion time (h, log)")
    ax.set_ylabel("share of jobs")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "jct_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    if any(max(s.get("free_domains", [0.0]) or [0.0]) > 0 for s in series.values()):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for policy, s in series.items():
            ax.plot([t / 3600 for t in s["time_s"]], s["free_domains"], label=policy)
        ax.set_xlabel("time (h)")
        ax.set_ylabel("fully free NVLink domains")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / "free_domains.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
