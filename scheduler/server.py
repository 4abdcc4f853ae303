"""The scheduler process: one elected binder, its metrics, and its probes.

Only the replica holding the `gputopo-scheduler` Lease binds: two binders placing the same
gang would each hold a reservation and bind pods to different nodes. A replica that loses the
lease cancels its binder at once; the successor reads back what is recorded on the pods and
finishes or undoes each group in flight (see `scheduler.binder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gputopo.runtime import grpcio
from gputopo.runtime.http import HttpServer, ProbeResult
from gputopo.runtime.kube import KubeClient
from gputopo.runtime.leader import LeaderElector, LeaseConfig
from gputopo.runtime.placement_client import PlacementClient
from gputopo.runtime.supervisor import Supervisor
from gputopo.runtime.tls import ROTATION_CHECK_S, TlsFiles, follow_rotation, ssl_server_context
from scheduler.binder import Binder, BinderConfig
from scheduler.metrics import SchedulerCollector, SchedulerStats

__all__ = ["SchedulerProcess", "SchedulerProcessConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerProcessConfig:
    """Where the process talks and listens."""

    aggregator: str
    binder: BinderConfig = field(default_factory=BinderConfig)
    lease: LeaseConfig | None = None  # None: no election (a single replica, tests)
    identity: str = "scheduler"
    http_host: str = "0.0.0.0"
    http_port: int | None = None
    health_port: int | None = None  # /healthz and /readyz alone in plain text (kubelet probes)
    tls: TlsFiles | None = None  # mutual TLS to the aggregator and on /metrics; None: plain text
    tls_check_s: float = ROTATION_CHECK_S  # how often the client certificate is looked at


class SchedulerProcess:
    """Runs until cancelled: campaign, bind while leading, serve /metrics and probes."""

    def __init__(self, config: SchedulerProcessConfig, kube: KubeClient) -> None:
        self.config = config
        self.kube = kube
        self.stats = SchedulerStats()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SchedulerCollector(self.stats))
        self.binder: Binder | None = None
        self._task: asyncio.Task[None] | None = None
        # Root tasks: a binder that dies ends the process, and so its Lease.
        self.tasks = Supervisor("scheduler")
        self.http: HttpServer | None = None

    async def run(self) -> None:
        """Serve until cancelled."""
        cfg = self.config
        if cfg.http_port is not None:
            self.http = HttpServer(
                registry=self.registry,
                readyz=self._ready,
                ssl_context=ssl_server_context(cfg.tls) if cfg.tls is not None else None,
            )
            port = await self.http.start(cfg.http_host, cfg.http_port)
            log.info("metrics and probes on %s:%d", cfg.http_host, port)
            if cfg.health_port is not None:
                port = await self.http.start_health(cfg.http_host, cfg.health_port)
                log.info("probes alone, in plain text, on %s:%d", cfg.http_host, port)
        channels = [grpcio.channel(cfg.aggregator, tls=cfg.tls)]
        placement = PlacementClient(channels[0])

        async def renew() -> None:
            """A renewed client certificate: later calls use a new channel; calls in flight
            finish on the old one, which then closes."""
            channels.append(grpcio.channel(cfg.aggregator, tls=cfg.tls))
            placement.use_channel(channels[-1])
            old = channels.pop(0)
            await old.close(grace=30.0)

        rotation = (
            asyncio.create_task(follow_rotation(cfg.tls, renew, interval_s=cfg.tls_check_s))
            if cfg.tls is not None
            else None
        )
        try:

            async def started() -> None:
                log.info("%s leads: binding", cfg.identity)
                self.binder = Binder(self.kube, placement, cfg.binder, stats=self.stats)
                self._task = self.tasks.spawn(self.binder.run(), name="binder")

            async def stopped() -> None:
                log.warning("%s stopped leading: binder stopped", cfg.identity)
                await self._stop_binder()

            try:
                if cfg.lease is None:
                    await started()
                    assert self._task is not None
                    await self.tasks.wait()  # raises RootTaskDiedError when the binder dies
                else:
                    elector = LeaderElector(
                        self.kube,
                        cfg.lease,
                        identity=cfg.identity,
                        on_started=started,
                        on_stopped=stopped,
                    )
                    try:
                        await self.tasks.watch(elector.run())
                    finally:
                        with contextlib.suppress(Exception):
                            await asyncio.shield(elector.release())
            finally:
                await self._stop_binder()
                if self.http is not None:
                    await self.http.stop()
        finally:
            if rotation is not None:
                rotation.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await rotation
            for channel in channels:
                await channel.close()

    def _ready(self) -> ProbeResult:
        leading = self.binder is not None
        return ProbeResult(True, {"status": "ok", "leading": leading})

    async def _stop_binder(self) -> None:
        task, self._task = self._task, None
        self.binder = None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # a death is reported already
