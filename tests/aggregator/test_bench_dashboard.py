"""`gputopo bench dashboard` runs end to end and prints its figures side by side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_dashboard_prints_three_phases_and_their_ratios() -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "gputopo", "bench", "dashboard"),
            *("--nodes=40", "--phase=1.5", "--rate=20", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    for phase in ("quiet", "dashboard_5s", "dashboard_0_5s"):
        assert figures[phase]["calls"] >= 10, figures
        assert figures[phase]["errors"] == 0, figures
    assert figures["dashboard_0_5s"]["dashboard_gets"] >= 2
    assert figures["p99_ratio_dashboard_5s"] > 0
    assert figures["first_get_ms"] > 0
    assert "bench dashboard" in out.stderr  # progress on stderr, figures alone on stdout
