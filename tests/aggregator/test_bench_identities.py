"""scripts/bench_identities.py end to end at a tiny size: the aggregator in its own process over
mutual TLS, one certificate per node, clients in other processes; certificates made once and
reused by the next run, the report made anew (the lead runs it at 1,000 identities)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "bench_identities.py"


def _bench(certs: Path, *flags: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--certs", str(certs), "--workers", "2", "--settle", "0",
         *flags],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    figures: dict[str, Any] = json.loads(out.stdout)
    return figures


@pytest.mark.slow
def test_every_identity_is_accepted_and_certificates_are_reused(tmp_path: Path) -> None:
    first = _bench(tmp_path, "--identities", "2")
    assert first["accepted"] == 2
    assert first["answers"] == {"STATUS_ACCEPTED": 2}
    assert first["place_after_reports"] == "placed"
    assert first["report_bytes"] > 400_000  # the largest accepted report, not a small node
    assert first["documented_budget_mib"] == 2 * 16 + 128
    assert first["under_documented_budget"] is True  # judged by the peak, VmHWM
    assert first["aggregator_peak_rss_mib"] >= first["aggregator_rss_mib_after_place"]
    ca = (tmp_path / "ca.crt").read_bytes()
    node = (tmp_path / "big-0000" / "tls.crt").read_bytes()

    (tmp_path / "dgx-h100-report.bin").write_bytes(b"left by an older run")  # made afresh
    second = _bench(tmp_path, "--identities", "3", "--report", "dgx-h100")
    assert second["answers"] == {"STATUS_ACCEPTED": 3}
    assert (tmp_path / "ca.crt").read_bytes() == ca
    assert (tmp_path / "big-0000" / "tls.crt").read_bytes() == node
    assert (tmp_path / "big-0002" / "tls.key").exists()
