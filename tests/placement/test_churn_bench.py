"""The occupancy-churn part of `gputopo bench placement` runs and reports both sides."""

from __future__ import annotations

from gputopo.app.benchmarks._churn import occupancy_churn


def test_churn_reports_decisions_with_and_without_pod_events() -> None:
    figures = occupancy_churn(layout="dgx-h100", gpus=256, samples=20, events=5, seed=3)
    assert figures["static"]["pod_events_per_decision"] == 0
    assert figures["churn"]["pod_events_per_decision"] == 5
    for side in ("static", "churn"):
        assert figures[side]["p50_ms"] > 0
        assert figures[side]["placed"] > 0  # half the nodes are free enough for a TP-8
    assert figures["churn_over_static_p50"] > 0
