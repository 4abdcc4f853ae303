"""`gputopo bench exporter` runs and prints its figures (the figures themselves are not judged)."""

from __future__ import annotations

import json

import pytest

from gputopo.app.cli import main


def test_bench_exporter_prints_every_figure_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "exporter", "--json", "--samples", "3", "--idle-seconds", "1"]) == 0
    captured = capsys.readouterr()
    figures = json.loads(captured.out)  # stdout holds the figures alone: progress is on stderr
    assert "bench exporter: 0/2 discovery on the fake machine, 3 passes" in captured.err
    assert "bench exporter: done in" in captured.err
    for name in ("discovery_seconds", "rss_mib", "cpu_percent"):
        assert figures[name] > 0 or name == "cpu_percent"
        assert name in figures["meets_targets"]
    assert figures["gpus"] == 8
    assert figures["agent_reported_to_aggregator"] is True
    assert figures["baseline_python_stack_rss_mib"] > 0


def test_bench_exporter_real_refuses_with_the_reason_without_a_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """This machine has no NVIDIA driver: `--real` says so instead of timing a fake."""
    assert main(["bench", "exporter", "--real", "--samples", "3", "--idle-seconds", "1"]) == 1
    err = capsys.readouterr().err
    assert "NVML is not up on this machine" in err
    assert "libnvidia-ml.so.1" in err
