"""`gputopo bench ingest` runs end to end at a tiny size, with its figures alone on stdout and
its progress on stderr (the figures themselves are the benchmark's, not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _bench(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
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
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _not_json(constant: str) -> float:
    raise AssertionError(f"{constant} is not JSON: a figure not measured is null")


def test_bench_ingest_prints_json_on_stdout_and_progress_on_stderr() -> None:
    out = _bench()
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout, parse_constant=_not_json)
    assert figures["nodes"] == 20
    assert figures["settled"] is True
    assert figures["errors"] == 0
    assert figures["streams_failed"] == 0
    assert figures["aggregator"]["snapshots_not_acked"] == 0
    assert figures["generator_cpu_percent"] > 0
    # the loop thread's shares (schedstat): numbers that can be read beside the CPU figure
    running = figures["aggregator_loop_running_percent"]
    waiting = figures["aggregator_loop_waiting_for_cpu_percent"]
    # read just outside the window's ends (a pipe round trip each), so a little over 100 % fits
    assert 0 < running <= 105
    assert waiting >= 0
    # 10 nodes per process in connections of 5: the streams really spread over connections
    assert figures["aggregator"]["channels"] == 4
    assert figures["aggregator"]["seconds_until_all_snapshots_acked"] is not None
    # every message acked in the window was sent in it
    assert figures["aggregator"]["reports_sent_in_window"] >= figures["reports_per_second"] * 2 > 0
    # deltas sent as pre-encoded messages are applied and acknowledged; half, not all: under
    # load a node's sleeps drift and its second delta can fall outside a 2 s window
    assert figures["aggregator"]["delta_fraction_acked"] >= 0.5
    # 20 streams are far below the default heartbeat budget: the 5 s base is announced, and
    # with a delta every second no node is ever silent that long
    assert figures["heartbeat_interval_announced_seconds"] == 5.0
    assert figures["heartbeats_per_second"] == 0
    assert figures["aggregator"]["sent_per_second"]["delta"] > 0
    assert "bench ingest: 0/1 the aggregator under 20 nodes for 2.0 s" in out.stderr
    assert "bench ingest: done in" in out.stderr


def test_a_settle_timeout_that_passes_is_said_and_the_window_measured_anyway() -> None:
    # 1 ms: over before a load process has started, so no node connects in time (at 20,000
    # nodes the timeout passed with 1,531 nodes not connected and the figures did not say so)
    out = _bench("--settle-timeout=0.001")
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout, parse_constant=_not_json)
    assert figures["settled"] is False
    main = figures["aggregator"]
    assert main["settled"] is False
    assert main["settle_timeout_seconds"] == 0.001
    assert main["snapshots_not_acked"] == 20
    assert main["seconds_until_all_snapshots_acked"] is None
    assert figures["errors"] >= 20
    assert main["reports_sent_in_window"] == 0  # the ramp stopped: no node has a stream
    # nothing was measured: null, not a 0 s (nor NaN) that reads as a figure
    assert main["p50_freshness_seconds"] is None
    assert main["max_freshness_seconds"] is None
    assert figures["p99_freshness_seconds"] is None
    assert figures["targets"]["p99_freshness_at_most_1s"] is False
    assert figures["targets"]["zero_streams_failed"] is False


def test_an_option_that_must_be_positive_is_refused_on_stderr_leaving_stdout_to_figures() -> None:
    out = _bench("--ramp=0")
    assert out.returncode == 2
    assert out.stdout == ""
    assert "--ramp must be positive, not 0.0" in out.stderr
