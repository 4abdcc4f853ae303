"""What an operator reads from a replay: one summary per policy, as plain JSON-ready data.

Definitions (the README repeats them):

- JCT = finish - arrival; queueing delay = start - arrival; both over the jobs that ran.
- makespan = last finish - first arrival.
- allocation = GPUs in use / GPUs in the cluster, time-weighted over the arrival window (first to
  last arrival: while the trace keeps offering work; after it the cluster only drains). For
  arrive-all traces it is the allocation when every job has been tried, and when the GPUs asked
  for first reached the cluster's capacity (FGD's "arrived 100 %" column).
- fragmentation: FGD's amount (see `gputopo.sim.replay`), time-weighted, and as a share of the
  free GPUs.
- free nodes / free NVLink domains: nodes, and multi-node NVLink domains (NVL72 racks), with
  every GPU free; time-weighted mean and minimum.
- communication slowdown: modelled communication time on the placement over that on the best
  placement the cluster allows (`gputopo.sim.jobtime`), over jobs with more than one GPU.
- TP across nodes: training gangs with TP > 1 with at least one TP group on two or more nodes.
- KV pairs: prefill-to-decode engine pairs whose KV path crosses a PCI root (PCIe path through a
  host bridge or the CPU interconnect), a node, or a leaf.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gputopo.sim.replay import ReplayResult, Sample

__all__ = ["percentile", "series", "summarise"]

_SERIES_POINTS = 400


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _dist(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": sum(values) / len(values) if values else math.nan,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
    }


def _weighted(samples: Sequence[Sample], start: float, end: float, pick: str) -> float:
    """Time-weighted mean of a sample field over [start, end]; each value holds until the next."""
    if not samples or end <= start:
        return float(getattr(samples[-1], pick)) if samples else math.nan
    total = 0.0
    for k, s in enumerate(samples):
        t0 = max(s.time, start)
        t1 = min(samples[k + 1].time if k + 1 < len(samples) else end, end)
        if t1 > t0:
            total += float(getattr(s, pick)) * (t1 - t0)
    return total / (end - start)


def series(result: ReplayResult, points: int = _SERIES_POINTS) -> dict[str, list[float]]:
    """Occupancy over time, at most `points` evenly spaced samples (the last one at each time)."""
    samples = result.samples
    if not samples:
        return {"time_s": [], "allocation": [], "free_nodes": [], "free_domains": []}
    t0, t1 = samples[0].time, samples[-1].time
    picked: list[Sample] = []
    if t1 <= t0:
        picked = [samples[-1]]
    else:
        step = (t1 - t0) / points
        k = 0
        for p in range(points + 1):
            at = t0 + p * step
            while k + 1 < len(samples) and samples[k + 1].time <= at:
                k += 1
            picked.append(samples[k])
    total = result.total_gpus or 1
    return {
        "time_s": [s.time for s in picked],
        "allocation": [s.used_gpus / total for s in picked],
        "free_nodes": [float(s.free_nodes) for s in picked],
        "free_domains": [float(s.free_domains) for s in picked],
        "fragmentation": [s.fragmentation for s in picked],
        "queued": [float(s.queued) for s in picked],
    }


def summarise(result: ReplayResult) -> dict[str, Any]:
    """Every metric of the module docstring for one policy's replay."""
    recs = result.records
    ran = [r for r in recs if r.started]
    done = [r for r in ran if not math.isinf(r.finish)]
    jct = [r.finish - r.arrival for r in done]
    wait = [r.start - r.arrival for r in ran]
    multi = [r.slowdown for r in ran if r.gpus > 1]
    arrivals = [r.arrival for r in recs]
    first, last = (min(arrivals), max(arrivals)) if arrivals else (0.0, 0.0)
    samples = result.samples
    total = result.total_gpus or 1
    if result.arrive_all:
        allocation = samples[-1].used_gpus / total if samples else math.nan
    else:
        allocation = _weighted(samples, first, last, "used_gpus") / total
    used_mean = _weighted(samples, first, last, "used_gpus")
    free_gpus = total - used_mean if not math.isnan(used_mean) else math.nan
    if result.arrive_all:
        # FGD's columns: the state once the GPUs asked for reached the cluster's capacity.
        frag = result.extra.get("fragmentation_at_full_demand", math.nan)
        free_gpus = result.extra.get("free_gpus_at_full_demand", math.nan)
    else:
        frag = _weighted(samples, first, last, "fragmentation")
    tp_gangs = [r for r in ran if r.tp_groups > 0]
    kv = [r for r in ran if r.kv_pairs]
    dropped = Counter(r.dropped for r in recs if r.dropped)
    return {
        "policy": result.policy,
        "jobs": {
            "total": len(recs),
            "ran": len(ran),
            "finished": len(done),
            "dropped": dict(sorted(dropped.items())),
        },
        "jct_s": _dist(jct),
        "queueing_s": _dist(wait),
        "makespan_s": (max(r.finish for r in done) - first) if done else math.nan,
        "allocation": allocation,
        "allocation_at_full_demand": result.allocation_at_full_demand,
        "fragmentation_at_full_demand": result.extra.get("fragmentation_at_full_demand", math.nan),
        "free_gpus_at_full_demand": result.extra.get("free_gpus_at_full_demand", math.nan),
        "gpu_hours_run": sum(r.gpus * (r.finish - r.start) for r in done) / 3600.0,
        "fragmentation": {
            "gpus": frag,
            "share_of_free": frag / free_gpus if free_gpus > 0 else math.nan,
        },
        "free_nodes": {
            "mean": _weighted(samples, first, last, "free_nodes"),
            "min": min((s.free_nodes for s in samples), default=0),
            "of": result.total_nodes,
        },
        "free_nvlink_domains": {
            "mean": _weighted(samples, first, last, "free_domains"),
            "min": min((s.free_domains for s in samples), default=0),
            "of": result.total_domains,
        },
        "comm_slowdown": {
            **_dist(multi),
            "share_above_1_05": (
                sum(1 for s in multi if s > 1.05) / len(multi) if multi else math.nan
            ),
        },
        "tp_gangs": {
            "with_tp": len(tp_gangs),
            "tp_across_nodes": sum(1 for r in tp_gangs if r.tp_groups_across_nodes),
        },
        "kv_pairs": {
            "total": sum(r.kv_pairs for r in kv),
            "across_pci_root": sum(r.kv_across_pci_root for r in kv),
            "across_node": sum(r.kv_across_node for r in kv),
            "across_leaf": sum(r.kv_across_leaf for r in kv),
        },
        "multi_node_jobs": {
            "ran": sum(1 for r in ran if r.nodes > 1),
            "mean_nodes": (
                sum(r.nodes for r in ran if r.nodes > 1)
                / max(1, sum(1 for r in ran if r.nodes > 1))
            ),
            "across_leaves": sum(1 for r in ran if r.leaves > 1),
        },
        "decisions": result.decisions,
        "wall_s": result.wall_seconds,
    }
