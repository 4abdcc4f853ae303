"""Browser tests need Debian's chromium: installed once when missing (`make test` does it
first), else the tests fail saying why, as the Prometheus tests do: a browser test that
silently skipped would leave the page untested while the suite looked green."""

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
        pytest.fail(str(err))
