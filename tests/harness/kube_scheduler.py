"""A real kube-scheduler for tests, next to the harness's kube-apiserver.

Built by `scripts/build-kube-apiserver.sh` from the same Debian source tree as the API server and
cached beside it (`$GPUTOPO_KUBE_SCHEDULER` points at another binary). One process per profile:
a KubeSchedulerConfiguration (v1beta1, what 1.20 reads) with one `schedulerName`, no leader
election, and optionally gputopo's extender, as the README configures it. Pods choose a
scheduler by `spec.schedulerName`; without a kubelet, a bound pod stays Pending but holds what
it asked for, which is all a test of placement needs.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from gputopo.app.benchmarks._binder_kube import scheduler_config
from tests.harness.kube import (
    KUBE_VERSION,
    BinaryNotFoundError,
    KubeApiServer,
    KubeStartupError,
    _spawn,
    _terminate,
    cache_dir,
)

__all__ = ["SCHEDULER_ENV", "KubeScheduler", "find_scheduler"]

SCHEDULER_ENV = "GPUTOPO_KUBE_SCHEDULER"
_START_TIMEOUT_S = 60.0


def find_scheduler() -> Path:
    """`$GPUTOPO_KUBE_SCHEDULER`, else the build script's cache; says how to get one."""
    override = os.environ.get(SCHEDULER_ENV)
    path = (
        Path(override)
        if override
        else cache_dir() / f"kube-apiserver-{KUBE_VERSION}" / "kube-scheduler"
    )
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinaryNotFoundError(
            f"kube-scheduler {KUBE_VERSION} is not there (looked for {path}). Run "
            f"scripts/build-kube-apiserver.sh (it builds both), or set {SCHEDULER_ENV}."
        )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class KubeScheduler:
    """One kube-scheduler process (see the module docstring). Use `with`."""

    def __init__(
        self,
        kube: KubeApiServer,
        workdir: Path,
        *,
        name: str,
        extender_url: str = "",
    ) -> None:
        self.name = name
        self.workdir = workdir
        self.port = _free_port()
        self.log_path = workdir / f"kube-scheduler-{name}.log"
        config = scheduler_config(str(kube.kubeconfig_path), name=name, extender_url=extender_url)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"kube-scheduler-{name}.json"  # JSON is YAML
        self.config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        """Start and wait until its health endpoint answers."""
        args = [
            str(find_scheduler()),
            f"--config={self.config_path}",
            "--port=0",
            f"--secure-port={self.port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={self.workdir / ('certs-' + self.name)}",
            "--v=2",
        ]
        self.process = _spawn(args, self.log_path)
        deadline = time.monotonic() + _START_TIMEOUT_S
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KubeStartupError(f"kube-scheduler exited: {self._tail()}")
            try:
                url = f"https://127.0.0.1:{self.port}/healthz"
                with urllib.request.urlopen(url, timeout=1, context=context) as response:
                    if response.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        self.stop()
        raise KubeStartupError(f"kube-scheduler did not become healthy: {self._tail()}")

    def stop(self) -> None:
        if self.process is not None:
            _terminate(self.process, 10.0)
            self.process = None

    def _tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-30:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
