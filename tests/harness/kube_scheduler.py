"""A real kube-scheduler for tests, next to the harness's kube-apiserver.

Built by `scripts/build-kube-apiserver.sh` from the same Debian source tree as the API server and
cached beside it (`$GPUTOPO_KUBE_SCHEDULER` points at another binary). One process per profile:
a KubeSchedulerConfiguration (v1beta1, what 1.20 reads) with one `schedulerName`, no leader
election, and optionally gputopo's extender, as the README configures it. Pods choose a
scheduler by `spec.schedulerName`; without a kubelet, a bound pod stays Pending but holds what
it asked for, which is all a test of placement needs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

from gputopo.app.benchmarks._binder_kube import (
    SCHEDULER_ENV,
    KubeSchedulerError,
    find_kube_scheduler,
    scheduler_config,
    start_kube_scheduler,
    stop_process,
)
from tests.harness.kube import (
    BinaryNotFoundError,
    KubeApiServer,
    KubeStartupError,
)

__all__ = ["SCHEDULER_ENV", "KubeScheduler", "find_scheduler"]

_START_TIMEOUT_S = 60.0


def find_scheduler() -> Path:
    """`$GPUTOPO_KUBE_SCHEDULER`, else the build script's cache; says how to get one."""
    try:
        return find_kube_scheduler()
    except FileNotFoundError as err:
        raise BinaryNotFoundError(str(err)) from None


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
        self.log_path = workdir / f"kube-scheduler-{name}.log"
        self.config = scheduler_config(
            str(kube.kubeconfig_path), name=name, extender_url=extender_url
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        """Start and wait until its health endpoint answers."""
        try:
            self.process, self.log_path = start_kube_scheduler(
                find_scheduler(),
                self.config,
                self.workdir,
                name=self.name,
                extra_args=("--v=2",),
                timeout_s=_START_TIMEOUT_S,
            )
        except KubeSchedulerError as err:
            raise KubeStartupError(f"{err}: {self._tail()}") from None
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
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
