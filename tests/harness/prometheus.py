"""A real Prometheus server for tests: scrape a local endpoint, then ask it what it saw.

Metrics tests check what Prometheus itself makes of the exporter's `/metrics` (names, types,
label sets, values, that a scrape succeeds), not what a parser in the test thinks. The server is
Debian's `prometheus` package (`make prometheus` installs it); a missing binary fails the test
with that command, never skips it.

    with Prometheus.start(workdir=tmp_path, targets=["127.0.0.1:9402"]) as prom:
        prom.wait_for_scrape()
        prom.query('gputopo_nvml_up')  # -> [{"metric": {...}, "value": [ts, "0"]}]

Each server gets a free loopback port (retried when another process takes it first), its own
TSDB directory under `workdir`, a 1 s scrape interval, and dies with the test process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .kube import _die_with_parent, _terminate

__all__ = ["Prometheus", "PrometheusError", "PrometheusNotFoundError", "find_prometheus"]

_LOOPBACK = "127.0.0.1"
_DEBIAN_BINARY = Path("/usr/bin/prometheus")
_START_TIMEOUT_S = 30.0
_PORT_ATTEMPTS = 3


class PrometheusError(RuntimeError):
    """The server did not start or did not answer; the message says what to look at."""


class PrometheusNotFoundError(PrometheusError):
    """No prometheus binary; the message names the command that installs it."""


def find_prometheus() -> Path:
    """`$GPUTOPO_PROMETHEUS`, Debian's `/usr/bin/prometheus`, or `prometheus` on PATH."""
    override = os.environ.get("GPUTOPO_PROMETHEUS")
    candidates = [Path(override)] if override else []
    candidates.append(_DEBIAN_BINARY)
    found = shutil.which("prometheus")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise PrometheusNotFoundError(
        "no prometheus binary (looked at $GPUTOPO_PROMETHEUS, /usr/bin/prometheus and PATH): "
        "run `make prometheus` (or `sudo apt-get install prometheus`)"
    )


class Prometheus:
    """One running Prometheus server (see the module docstring)."""

    def __init__(self, *, binary: Path, workdir: Path, job: str, targets: int = 0) -> None:
        self.binary = binary
        self.target_count = targets
        self.workdir = workdir
        self.job = job
        self.port = 0
        self.log_path = workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        *,
        workdir: Path,
        targets: Sequence[str],
        job: str = "gputopo-exporter",
        scrape_interval_s: float = 1.0,
        scrape_configs: Sequence[dict[str, Any]] = (),
    ) -> Prometheus:
        """Start a server scraping `targets` (host:port, path /metrics) and wait until ready.

        `scrape_configs` are further jobs as given (Prometheus's own `scrape_configs` entries,
        TLS settings and all), for tests of a shipped scrape configuration.
        """
        server = cls(binary=find_prometheus(), workdir=workdir, job=job, targets=len(targets))
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        interval = f"{max(int(scrape_interval_s * 1000), 100)}ms"
        jobs = (
            [{"job_name": job, "static_configs": [{"targets": list(targets)}]}] if targets else []
        )
        config.write_text(
            json.dumps(  # JSON is YAML; no YAML writer needed
                {
                    "global": {"scrape_interval": interval, "scrape_timeout": interval},
                    "scrape_configs": [*jobs, *scrape_configs],
                }
            )
        )
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                server._launch(config, _free_port())
                return server
            except PrometheusError:
                in_use = "address already in use" in server._log_tail().lower()
                server.stop()
                if not in_use or attempt == _PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _launch(self, config: Path, port: int) -> None:
        self.port = port
        storage = self.workdir / f"data-{port}"
        args = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={storage}",
            f"--web.listen-address={_LOOPBACK}:{port}",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [*_die_with_parent(), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {self._process.returncode}: {self._log_tail()}"
                )
            with contextlib.suppress(OSError):
                if self._get("/-/ready").startswith(b"Prometheus"):
                    return
            time.sleep(0.1)
        raise PrometheusError(
            f"prometheus not ready in {_START_TIMEOUT_S:.0f} s: {self._log_tail()}"
        )

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{_LOOPBACK}:{self.port}"

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            body: bytes = response.read()
            return body

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query through the HTTP API; the result vector."""
        body = json.loads(self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, with their health and last error."""
        body = json.loads(self._get("/api/v1/targets"))
        found: list[dict[str, Any]] = body["data"]["activeTargets"]
        return found

    def wait_for(self, promql: str, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll a query until it returns a non-empty vector; PrometheusError on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.query(promql)
            if found:
                return found
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"{promql!r} stayed empty for {timeout_s:.0f} s; targets: {self.targets()}"
                )
            time.sleep(0.2)

    def wait_for_scrape(self, *, timeout_s: float = 30.0) -> None:
        """Wait until every target of the job was scraped successfully."""
        every = f'count(up{{job="{self.job}"}} == 1) == {self.target_count}'
        self.wait_for(every, timeout_s=timeout_s)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        if self._process is not None:
            _terminate(self._process, 10.0)
            self._process = None

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((_LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port
