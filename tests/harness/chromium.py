"""Headless Chromium for tests: render a page the way a browser does, dump its DOM, screenshot it.

Web pages are tested in a real browser (Debian's `chromium` package), not by reading their
HTML: the topology page builds everything with JavaScript from the aggregator's JSON. The
command line is enough for that (`--dump-dom` prints the DOM once the page's scripts have run
within the virtual time budget; `--screenshot` writes a PNG); no WebDriver, no downloads.
A missing binary is installed once with apt-get (`ensure_chromium`, which runs
scripts/ensure-chromium.sh, as `make test` does first); only when that cannot be done (no apt,
no root, no network) does the browser test skip, saying why.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

__all__ = [
    "ChromiumNotFoundError",
    "dump_dom",
    "ensure_chromium",
    "find_chromium",
    "screenshot",
]

_INSTALL = "apt-get install -y --no-install-recommends chromium"


class ChromiumNotFoundError(RuntimeError):
    """No chromium binary; the message names the command that installs it."""


def find_chromium() -> Path:
    """The chromium binary (`make chromium` installs it: scripts/ensure-chromium.sh)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise ChromiumNotFoundError(f"no chromium on PATH; run make chromium (or {_INSTALL})")


_ENSURE = Path(__file__).resolve().parents[2] / "scripts" / "ensure-chromium.sh"


@functools.cache
def ensure_chromium() -> Path:
    """The chromium binary, installed first (once per process) when it is missing.

    Raises ChromiumNotFoundError with the installer's last words when it cannot be installed.
    """
    try:
        return find_chromium()
    except ChromiumNotFoundError:
        pass
    done = subprocess.run(
        ["bash", str(_ENSURE)], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ChromiumNotFoundError(f"chromium is missing and could not be installed: {why}")
    return find_chromium()


def _run(args: list[str], profile: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [
            str(find_chromium()),
            "--headless",
            "--no-sandbox",  # as root in a container: the sandbox needs user namespaces
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def dump_dom(url: str, *, profile: Path, budget_ms: int = 8000, timeout_s: float = 90) -> str:
    """The page's DOM after its scripts ran (within `budget_ms` of virtual time)."""
    done = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], profile, timeout_s)
    if done.returncode != 0 or not done.stdout:
        raise RuntimeError(
            f"chromium --dump-dom {url}: rc {done.returncode}: {done.stderr[-2000:]}"
        )
    return done.stdout


def screenshot(
    url: str,
    path: Path,
    *,
    profile: Path,
    size: tuple[int, int] = (1400, 1000),
    budget_ms: int = 8000,
    timeout_s: float = 90,
) -> Path:
    """A PNG of the page as rendered at `size`."""
    done = _run(
        [
            f"--virtual-time-budget={budget_ms}",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={path}",
            url,
        ],
        profile,
        timeout_s,
    )
    if not path.exists():
        raise RuntimeError(
            f"chromium --screenshot {url}: rc {done.returncode}: {done.stderr[-2000:]}"
        )
    return path
