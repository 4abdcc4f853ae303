"""The fuzz suite's counts, printed at the end of every run that includes it (not only -rA):
one `FUZZ-SUMMARY {json}` line per suite, so CI logs show crashes, hangs, 500s, tracebacks and
memory growth as numbers, not just a pass."""

from __future__ import annotations

import json
from typing import Any

import pytest

SUMMARIES: list[dict[str, Any]] = []


def record_summary(summary: dict[str, Any]) -> None:
    """Keep a suite's counts for the terminal summary (and print them for -s/-rA)."""
    SUMMARIES.append(summary)
    print("FUZZ-SUMMARY " + json.dumps(summary, sort_keys=True))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for summary in SUMMARIES:
        terminalreporter.write_line("FUZZ-SUMMARY " + json.dumps(summary, sort_keys=True))
