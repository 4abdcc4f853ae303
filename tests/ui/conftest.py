"""Browser tests need Debian's chromium: installed once when missing, else skipped with why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.chromium import ChromiumNotFoundError, ensure_chromium


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The chromium binary (installed with apt-get on first use when missing)."""
    try:
        return ensure_chromium()
    except ChromiumNotFoundError as err:
        pytest.skip(str(err))
