"""The upstream-shape part of `gputopo bench placement` runs at a tiny size and reports both
policies on the same sequence (the figures themselves are the benchmark's)."""

from __future__ import annotations

import io

from gputopo.app.benchmarks._upstream import upstream_shape


def test_upstream_shape_reports_rates_and_quality_beside_kueue() -> None:
    rows = upstream_shape(
        nodes=200, racks=4, kueue_gangs=5, log=io.StringIO(), small=(20,), large=(1,)
    )
    by = {(r["shape"], r["policy"]): r for r in rows}
    ours, kueue = by[("20x4", "gputopo")], by[("20x4", "kueue-bestfit")]
    assert ours["gangs_placed"] == 20  # 20 gangs of 4 one-GPU pods fit one rack of 50 nodes
    assert kueue["gangs_decided"] == 5
    assert ours["gangs_compared"] == kueue["gangs_compared"] == 5
    assert ours["racks_mean"] == 1.0  # a gang of 4 must stay in its rack
    assert ours["pods_decided_per_s"] > 0
    assert ours["gangs_slower_than_kueue"] == 0
    big = by[("1x1000", "gputopo")]
    assert big["gangs_placed"] == 1
    assert big["racks_mean"] > 1  # 1,000 GPUs do not fit a rack of 400
