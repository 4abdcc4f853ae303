"""`gputopo bench ingest` runs end to end at a tiny size, with its figures alone on stdout and
its progress on stderr (the figures themselves are the benchmark's, not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_ingest_prints_json_on_stdout_and_progress_on_stderr() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputopo",
            "bench",
            "ingest",
            "--nodes=20",
            "--workers=2",
            "--nodes-per-connection=5",
            "--delta-interval=1",
            "--duration=2",
            "--memory-nodes=0",
            "--no-baseline",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["nodes"] == 20
    assert figures["errors"] == 0
    assert figures["streams_failed"] == 0
    assert figures["aggregator"]["snapshots_not_acked"] == 0
    assert figures["generator_cpu_percent"] > 0
    # 10 nodes per process in connections of 5: the streams really spread over connections
    assert figures["aggregator"]["channels"] == 4
    assert figures["aggregator"]["seconds_until_all_snapshots_acked"] is not None
    # deltas sent as pre-encoded messages are applied and acknowledged; half, not all: under
    # load a node's sleeps drift and its second delta can fall outside a 2 s window
    assert figures["aggregator"]["delta_fraction_acked"] >= 0.5
    assert "bench ingest: 0/1 the aggregator under 20 nodes for 2.0 s" in out.stderr
    assert "bench ingest: done in" in out.stderr
