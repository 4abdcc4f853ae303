"""The exporter agent: discovery, probes, metrics and the report stream in one asyncio loop.

1. `start()` binds the HTTP endpoints (`/metrics`, `/healthz`, `/readyz`; port 0 picks a free
   one) and the TCP probe endpoint, runs a first discovery, then starts the loops:
   - discovery every `discovery_interval_s` (jittered), in a worker thread (NVML and sysfs
     calls block); a change wakes the report stream at once;
   - GPU probe rounds and peer probe rounds (`exporter.probes.runner`), jittered;
   - the report stream to the aggregator, which reconnects forever with jittered backoff.
2. What is reported is the last discovery with the probe results laid over it.
3. Nothing the node lacks stops it: with no GPU or no driver, NVML is down, the node reports no
   GPUs and `gputopo_nvml_up 0`, and the reason is in the log (once per change), in
   `gputopo_nvml_info{reason=...}` and in the report. A discovery pass that crashes is logged
   and counted, and the last good topology stays.
4. `/healthz` fails only when the discovery loop has stopped passing (the loop is stuck), so
   the kubelet restarts a wedged agent but never one that merely lacks a GPU; `/readyz` waits
   for the first discovery.
5. `stop()` cancels the loops, closes the stream and the servers, and shuts NVML down.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry

from exporter.discovery import Discovery, DiscoveryResult
from exporter.health import HealthPolicy
from exporter.metrics import ExporterView, register
from exporter.nvml import Nvml, XidEvents
from exporter.podresources import PodResourcesReader
from exporter.probes.results import ProbeResults
from exporter.probes.runner import (
    GPU_PROBE,
    TCP_PROBE,
    GpuProbeClient,
    ProbeRunner,
    ProbeSchedule,
    WorkerGpuProbe,
)
from exporter.probes.tcp import TcpProbeServer
from exporter.stream import REPORT_BACKOFF, ProbeTarget, ReportStream, report_channel
from exporter.sysfs import Sysfs
from gputopo import __version__
from gputopo.gpu_use import GpuUse
from gputopo.runtime.backoff import Backoff
from gputopo.runtime.http import HttpServer, ProbeResult
from gputopo.runtime.supervisor import Supervisor
from gputopo.runtime.tls import ROTATION_CHECK_S, TlsFiles, follow_rotation, ssl_server_context
from gputopo.topology import NodeTopology, NvmlStatus

if TYPE_CHECKING:
    # Made and set by the command only with --device-plugin: an agent without it does not load
    # the plugin's modules and protos.
    from exporter.deviceplugin import DevicePlugin

__all__ = ["Agent", "AgentConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Where the agent serves and reports, and how often it looks.

    `aggregator` is `host:port` of the aggregator's gRPC endpoint; empty runs without
    reporting (metrics only). `simulated` names the machine profile a fake NVML answers from
    (`--simulate`): the logs then say so, since a fake's driver version reads as a real one.
    `probe_advertise` is the `host:port` peers should probe; empty means this host's address and
    the bound probe port.
    """

    node_name: str
    aggregator: str = ""
    http_host: str = "0.0.0.0"
    http_port: int = 9402
    probe_host: str = "0.0.0.0"
    probe_port: int = 9403
    probe_advertise: str = ""
    sysfs_root: Path = Path("/sys")
    machine: str = ""
    simulated: str = ""
    discovery_interval_s: float = 60.0
    discovery_jitter: float = 0.1
    heartbeat_interval_s: float = 5.0
    backoff: Backoff = REPORT_BACKOFF  # capped at a few seconds: see exporter.stream
    gpu_probes: bool = True
    peer_probes: bool = True
    # Mutual TLS to the aggregator and on /metrics (`gputopo.runtime.tls`); None is plain text.
    tls: TlsFiles | None = None
    tls_check_s: float = ROTATION_CHECK_S  # how often the client certificate is looked at
    # /healthz and /readyz alone in plain text (kubelet probes); None: not served.
    health_port: int | None = None
    # A projected ServiceAccount token file proving this pod's node to the aggregator.
    identity_token: Path | None = None
    probe_schedule: ProbeSchedule = field(default_factory=ProbeSchedule)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    # The kubelet's pod-resources socket; None: do not ask the kubelet what is held.
    pod_resources_socket: Path | None = None
    pod_resources_interval_s: float = 10.0


@dataclass(slots=True)
class _State:
    discovery: DiscoveryResult | None = None
    runs: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    last_pass: float = 0.0
    targets: tuple[ProbeTarget, ...] = ()


class Agent:
    """One node's exporter (see the module docstring). Use `async with` or start/stop."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        nvml: Nvml | None = None,
        gpu_probe: GpuProbeClient | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.nvml = nvml or Nvml()
        self.discovery = Discovery(
            node_name=config.node_name,
            nvml=self.nvml,
            sysfs=Sysfs(config.sysfs_root),
            policy=config.health,
            machine=config.machine,
            clock=clock,
        )
        self.probes = ProbeResults()
        self._mig_parents: dict[str, int] = {}  # MIG device UUID -> GPU, from discovery
        self.pod_resources = (
            PodResourcesReader(config.pod_resources_socket, mig_parents=lambda: self._mig_parents)
            if config.pod_resources_socket is not None
            else None
        )
        self.gpu_use: GpuUse | None = None
        # The kubelet device plugin (`gputopo exporter --device-plugin`), set before `start`.
        self.device_plugin: DevicePlugin | None = None
        self._rng = rng or random.Random()
        self.runner = ProbeRunner(
            results=self.probes,
            gpu_probe=gpu_probe or WorkerGpuProbe(),
            activity=lambda: asyncio.to_thread(self.nvml.activity),
            schedule=config.probe_schedule,
            rng=self._rng,
        )
        self.registry = CollectorRegistry(auto_describe=True)
        register(self.registry, self.view)
        self._clock = clock
        self._state = _State()
        self._probe_server = TcpProbeServer(host=config.probe_host, port=config.probe_port)
        self._http: HttpServer | None = None
        self._channel: grpc.aio.Channel | None = None
        self.stream: ReportStream | None = None
        # Root tasks: one that ends on its own ends the process (`gputopo exporter`).
        self.tasks = Supervisor("exporter")
        self._discovered = asyncio.Event()
        self.http_port = 0
        self.health_port = 0
        self.probe_port = 0

    # --- what the agent knows --------------------------------------------------------------

    @property
    def topology(self) -> NodeTopology:
        """The node as reported: the last discovery with probe results laid over it."""
        result = self._state.discovery
        if result is None:
            return NodeTopology(
                name=self.config.node_name,
                nvml=NvmlStatus(up=False, reason="not discovered yet"),
            )
        return self.probes.apply(result.topology)

    def view(self) -> ExporterView:
        """What metrics render."""
        return ExporterView(
            node_name=self.config.node_name,
            version=__version__,
            topology=self.topology if self._state.discovery is not None else None,
            discovery=self._state.discovery,
            discovery_runs=self._state.runs,
            discovery_errors=dict(self._state.errors),
            probes=self.probes,
            stream=self.stream.stats if self.stream is not None else None,
            gpu_use=self.gpu_use,
            pod_resources=self.pod_resources is not None,
            device_plugin=self.device_plugin.stats if self.device_plugin is not None else None,
        )

    # --- life -------------------------------------------------------------------------------

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve, discover once, and start the loops."""
        await self._start_http()
        await self._probe_server.start()
        self.probe_port = self._probe_server.port
        await self.discover()
        self._spawn(self._discovery_loop(), "discovery")
        if self.config.gpu_probes:
            self._spawn(self._gpu_probe_loop(), "gpu-probes")
        else:  # every exporter says per probe whether it runs, and why not
            self.runner.off(
                GPU_PROBE,
                "simulated machine: no GPU or CUDA here is real (--simulate)"
                if self.config.simulated
                else "turned off (--no-gpu-probes)",
            )
        if self.pod_resources is not None:
            self._spawn(self._gpu_use_loop(), "pod-resources")
        if self.device_plugin is not None:
            self._spawn(self.device_plugin.run(), "device-plugin")
            self._spawn(self._xid_loop(self.device_plugin), "xid-events")
        if self.config.aggregator:
            self._channel = report_channel(
                self.config.aggregator, self.config.backoff, tls=self.config.tls
            )
            self.stream = ReportStream(
                node_name=self.config.node_name,
                source=lambda: self.topology,
                channel=self._channel,
                heartbeat_interval_s=self.config.heartbeat_interval_s,
                backoff=self.config.backoff,
                probe_address=self._advertised_probe_address(),
                rng=self._rng,
                on_probe_targets=self._set_targets,
                gpu_use=lambda: self.gpu_use,
                identity_token=self._identity_token if self.config.identity_token else None,
            )
            self._spawn(self.stream.run(), "report-stream")
            if self.config.tls is not None:
                rotation = follow_rotation(
                    self.config.tls, self._renew_channel, interval_s=self.config.tls_check_s
                )
                self._spawn(rotation, "tls-rotation")
            if self.config.peer_probes:
                self._spawn(self._peer_probe_loop(), "peer-probes")
            else:
                self.runner.off(TCP_PROBE, "turned off (--no-peer-probes)")
        else:
            self.runner.off(TCP_PROBE, "no aggregator to name peers (--aggregator)")
        log.info(
            "exporter for %s: metrics on %s:%d, probes on %s:%d, reporting to %s",
            self.config.node_name,
            self.config.http_host,
            self.http_port,
            self.config.probe_host,
            self.probe_port,
            self.config.aggregator or "(nobody)",
        )

    def _identity_token(self) -> str:
        """The token as the kubelet last wrote it (it refreshes the file before expiry); an
        unreadable file sends nothing, and the aggregator says what is missing."""
        assert self.config.identity_token is not None
        try:
            return self.config.identity_token.read_text(encoding="utf-8").strip()
        except OSError as err:
            log.warning("identity token %s: %s", self.config.identity_token, err)
            return ""

    async def _renew_channel(self) -> None:
        """A new channel with the renewed certificate; the old one closes, ending its call."""
        assert self.stream is not None
        old, self._channel = (
            self._channel,
            report_channel(self.config.aggregator, self.config.backoff, tls=self.config.tls),
        )
        self.stream.use_channel(self._channel)
        if old is not None:
            await old.close(grace=1.0)

    async def stop(self) -> None:
        """Stop everything started, in reverse order."""
        await self.tasks.cancel()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await self._probe_server.stop()
        if self._http is not None:
            await self._http.stop()
            self._http = None
        await asyncio.to_thread(self.nvml.close)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.tasks.spawn(coro, name=f"exporter-{name}")

    # --- discovery --------------------------------------------------------------------------

    async def discover(self) -> DiscoveryResult | None:
        """One discovery pass now; the stream hears of any change."""
        before = self._state.discovery
        try:
            result = await asyncio.to_thread(self.discovery.run)
        except Exception:  # a bug or an odd machine must not stop the agent
            log.exception(
                "discovery of %s failed; keeping the last topology", self.config.node_name
            )
            self._state.errors["exception"] += 1
            return None
        self._state.runs += 1
        self._state.last_pass = self._clock()
        for source, count in result.errors.items():
            self._state.errors[source] += count
        self._state.discovery = result
        if self.pod_resources is not None and result.topology.nvml.up:
            self._mig_parents = await asyncio.to_thread(self.nvml.mig_parents)
        self._log_nvml(before.topology.nvml if before else None, result.topology.nvml)
        changed = before is None or before.topology != result.topology
        if changed and self.stream is not None:
            self.stream.changed()
        if changed and self.device_plugin is not None:
            await self.device_plugin.devices_changed()
        self._discovered.set()
        return result

    def _log_nvml(self, before: NvmlStatus | None, now: NvmlStatus) -> None:
        if before == now:
            return
        if now.up and self.config.simulated:
            log.info(
                "NVML simulated: fake machine %s (no GPU, driver or CUDA is real)",
                self.config.simulated,
            )
        elif now.up:
            log.info("NVML up: driver %s, CUDA %s", now.driver_version, now.cuda_version)
        else:
            log.warning("NVML is not available (%s): reporting a node without GPUs", now.reason)

    async def _discovery_loop(self) -> None:
        interval, jitter = self.config.discovery_interval_s, self.config.discovery_jitter
        while True:
            await asyncio.sleep(interval * self._rng.uniform(1 - jitter, 1 + jitter))
            await self.discover()

    # --- what the kubelet says is held -------------------------------------------------------

    async def read_gpu_use(self) -> None:
        """Ask the kubelet which GPUs it has handed out; report it when that changed."""
        if self.pod_resources is None:
            return
        use = await self.pod_resources.read(self.topology)
        if use != self.gpu_use:
            if self.gpu_use is None or use.known != self.gpu_use.known:
                log.info(
                    "kubelet pod resources: %s",
                    f"{len(use.held)} GPUs held" if use.known else use.reason,
                )
            self.gpu_use = use
            if self.stream is not None:
                self.stream.changed()

    async def _gpu_use_loop(self) -> None:
        # First read at once, but in the loop: a kubelet that does not answer must not hold up
        # the agent's start (serving, discovery, the stream) for the call's timeout.
        while True:
            try:
                await self.read_gpu_use()
            except Exception:
                log.exception("reading the kubelet's pod resources failed")
            await asyncio.sleep(self.config.pod_resources_interval_s)

    # --- XID errors: a GPU that had one is not handed out ---------------------------------------

    async def _xid_loop(self, plugin: DevicePlugin, *, timeout_ms: int = 1000) -> None:
        events = XidEvents(self.nvml)
        reason = await asyncio.to_thread(events.open)
        if reason:
            log.warning("device plugin: XID errors are not watched (%s)", reason)
            return
        try:
            while True:
                for gpu, xid in await asyncio.to_thread(events.wait, timeout_ms):
                    await plugin.mark_unhealthy(gpu, f"XID {xid}")
        finally:
            await asyncio.to_thread(events.close)

    # --- probes -----------------------------------------------------------------------------

    async def _gpu_probe_loop(self) -> None:
        self.runner.not_yet(GPU_PROBE)
        await asyncio.sleep(self.runner.wait_s(first=True))
        while True:
            try:
                measured = await self.runner.gpu_round(self.topology)
            except Exception:
                log.exception("GPU probe round failed")
                measured = 0
            if measured and self.stream is not None:
                self.stream.changed()
            await asyncio.sleep(self.runner.wait_s())

    def _set_targets(self, targets: tuple[ProbeTarget, ...]) -> None:
        self._state.targets = tuple(t for t in targets if t.node_name != self.config.node_name)

    async def _peer_probe_loop(self) -> None:
        self.runner.not_yet(TCP_PROBE)
        await asyncio.sleep(self.runner.wait_s(first=True))
        while True:
            targets = [(t.node_name, t.address) for t in self._state.targets]
            if targets and self.stream is not None:
                self.stream.add_peer_probes(await self.runner.peer_round(targets))
            await asyncio.sleep(self.runner.wait_s())

    def _advertised_probe_address(self) -> str:
        if self.config.probe_advertise:
            return self.config.probe_advertise
        host = self.config.probe_host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        return f"{host}:{self.probe_port}"

    # --- HTTP -------------------------------------------------------------------------------

    async def _start_http(self) -> None:
        self._http = HttpServer(
            registry=self.registry,
            healthz=self._healthz,
            readyz=self._readyz,
            ssl_context=ssl_server_context(self.config.tls) if self.config.tls else None,
        )
        self.http_port = await self._http.start(self.config.http_host, self.config.http_port)
        if self.config.health_port is not None:
            self.health_port = await self._http.start_health(
                self.config.http_host, self.config.health_port
            )

    def _stalled_s(self) -> float:
        """How long the discovery loop is overdue (0 while it keeps up)."""
        if not self._state.last_pass:
            return 0.0
        allowed = 3 * self.config.discovery_interval_s + 60
        return max(0.0, self._clock() - self._state.last_pass - allowed)

    def _healthz(self) -> ProbeResult:
        stalled = self._stalled_s()
        nvml = self.topology.nvml
        body = {
            "status": "ok" if not stalled else "discovery stalled",
            "nvml_up": nvml.up,
            "nvml_reason": nvml.reason,
            "discovery_runs": self._state.runs,
        }
        return ProbeResult(not stalled, body)

    def _readyz(self) -> ProbeResult:
        ready = self._discovered.is_set()
        body: dict[str, object] = {"ready": ready}
        if self.pod_resources is not None:
            # Not a readiness condition (metrics and topology still flow), but the one place
            # an operator sees why held GPUs are not known: e.g. the socket's directory is
            # root-only and the exporter does not run as root.
            use = self.gpu_use
            body["pod_resources"] = (
                "not read yet" if use is None else "ok" if use.known else use.reason
            )
        return ProbeResult(ready, body)
