"""Headless Chromium for tests: render a page the way a browser does, dump its DOM, screenshot it.

Web pages are tested in a real browser (Debian's `chromium` package), not by reading their
HTML: the topology page builds everything with JavaScript from the aggregator's JSON. The
command line is enough for that (`--dump-dom` prints the DOM once the page's scripts have run
within the virtual time budget; `--screenshot` writes a PNG); no WebDriver, no downloads.
A missing binary is installed once with apt-get (`ensure_chromium`, which runs
scripts/ensure-chromium.sh, as `make test` does first); only when that cannot be done (no apt,
no root, no network) do the browser tests fail, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

__all__ = [
    "Browser",
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


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


class Browser:
    """A headless Chromium driven over the DevTools protocol (aiohttp's websocket client).

    For what the command line cannot do: click, then read the page again.

        async with Browser.start(profile=tmp_path / "cdp") as page:
            await page.goto(url)
            await page.wait_for("document.body.dataset.ready === 'true'")
            await page.evaluate("document.querySelector('.node').click()")
    """

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    @staticmethod
    def _command(profile: Path) -> list[str]:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)
        return [
            str(find_chromium()),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-port=0",  # a free port, written to DevToolsActivePort
            f"--user-data-dir={profile}",
            "about:blank",
        ]

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, *, profile: Path, timeout_s: float = 60) -> AsyncIterator[Browser]:
        """Launch chromium on a free port and attach to its first page."""
        process = await asyncio.create_subprocess_exec(
            *cls._command(profile),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        browser = cls(process)
        try:
            await asyncio.wait_for(browser._attach(profile / "DevToolsActivePort"), timeout_s)
            yield browser
        finally:
            if browser._ws is not None:
                await browser._ws.close()
            if browser._session is not None:
                await browser._session.close()
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()

    async def _attach(self, port_file: Path) -> None:
        while not (text := await asyncio.to_thread(_read, port_file)):
            if self._process.returncode is not None:
                raise RuntimeError(f"chromium exited with rc {self._process.returncode}")
            await asyncio.sleep(0.05)
        port = int(text.split()[0])
        self._session = aiohttp.ClientSession()
        while True:
            async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                pages = [t for t in await resp.json() if t.get("type") == "page"]
            if pages:
                break
            await asyncio.sleep(0.05)
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events in between are dropped)."""
        assert self._ws is not None
        ident = next(self._ids)
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        while True:
            msg = await self._ws.receive_json()
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    async def goto(self, url: str) -> None:
        """Navigate (returns once the navigation is committed, not when scripts finish)."""
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        got = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression}: {got['exceptionDetails']}")
        return got.get("result", {}).get("value")

    async def wait_for(self, expression: str, *, timeout_s: float = 20) -> Any:
        """Poll until the expression is truthy; its value.

        An expression that throws counts as false while waiting (a page mid-navigation has no
        body yet); the last error is reported if it never comes true.
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        last: object = None
        while True:
            try:
                last = await self.evaluate(expression)
            except RuntimeError as err:
                last = err
            else:
                if last:
                    return last
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"still false after {timeout_s} s: {expression} ({last})")
            await asyncio.sleep(0.05)
