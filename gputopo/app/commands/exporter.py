"""`gputopo exporter`: run the node agent until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

HELP = "run the node exporter: discover and probe this node's GPU topology, serve metrics, report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command; the environment supplies defaults in a DaemonSet."""
    from gputopo.runtime.tls import add_health_port_flag, add_tls_flags

    env = os.environ.get
    parser.add_argument(
        "--aggregator",
        default=env("GPUTOPO_AGGREGATOR", ""),
        metavar="HOST:PORT",
        help="the aggregator's gRPC address (env GPUTOPO_AGGREGATOR); empty: metrics only",
    )
    parser.add_argument(
        "--identity-token",
        type=Path,
        default=None,
        metavar="PATH",
        help="the pod's projected ServiceAccount token (audience gputopo-aggregator), sent so"
        " the aggregator can tell which node this pod runs on; re-read at every connection",
    )
    parser.add_argument(
        "--node-name",
        default=env("NODE_NAME", ""),
        help="this node's Kubernetes name (env NODE_NAME, downward API; else the hostname)",
    )
    parser.add_argument("--http-host", default="0.0.0.0", help="address for /metrics, /healthz")
    parser.add_argument("--http-port", type=int, default=9402, help="0 for any free port")
    parser.add_argument("--probe-host", default="0.0.0.0", help="address of the TCP probe endpoint")
    parser.add_argument("--probe-port", type=int, default=9403, help="0 for any free port")
    parser.add_argument(
        "--probe-address",
        default=env("GPUTOPO_PROBE_ADDRESS", ""),
        metavar="HOST:PORT",
        help="where peers reach the probe endpoint (env GPUTOPO_PROBE_ADDRESS; default: hostname)",
    )
    parser.add_argument(
        "--sysfs-root", default="/sys", help="where sysfs is mounted (default %(default)s)"
    )
    parser.add_argument(
        "--pod-resources-socket",
        default=None,
        metavar="PATH",
        help="the kubelet's PodResources socket, read for which GPUs pods hold (default "
        "/var/lib/kubelet/pod-resources/kubelet.sock; with --simulate none; '' turns it off)",
    )
    parser.add_argument(
        "--discovery-interval", type=float, default=60.0, metavar="SECONDS", help="default 60"
    )
    parser.add_argument(
        "--probe-interval",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="seconds between probe rounds, and at most this long before the first (default 900;"
        " the first round comes after 120 s or this, whichever is sooner)",
    )
    parser.add_argument("--no-gpu-probes", action="store_true", help="never run GPU copy probes")
    parser.add_argument("--no-peer-probes", action="store_true", help="never probe peer nodes")
    parser.add_argument(
        "--simulate",
        metavar="PROFILE",
        default="",
        help="answer from a fake machine instead of NVML and /sys (see `gputopo machines`)",
    )

    plugin = parser.add_argument_group(
        "device plugin", "serve the kubelet so that pods get the GPUs gputopo recorded"
    )
    plugin.add_argument(
        "--device-plugin",
        default="",
        metavar="RESOURCE",
        help="serve the kubelet's device-plugin API for this resource: nvidia.com/gpu in place"
        " of NVIDIA's plugin (turn that one off: GPU operator devicePlugin.enabled=false), or a"
        " name of its own; empty (default): off. Lists this node's pods with the pod's"
        " ServiceAccount (RBAC: list pods)",
    )
    plugin.add_argument(
        "--device-plugin-dir",
        default="/var/lib/kubelet/device-plugins",
        metavar="DIR",
        help="the kubelet's device-plugin directory (default %(default)s)",
    )
    plugin.add_argument(
        "--device-id-strategy",
        choices=("uuid", "index"),
        default="uuid",
        help="name GPUs by UUID or NVML index, as NVIDIA's deviceIDStrategy (default uuid)",
    )
    plugin.add_argument(
        "--device-list-strategy",
        default="envvar",
        metavar="LIST",
        help="how Allocate names the GPUs: envvar (NVIDIA_VISIBLE_DEVICES), cdi-cri (CDI device"
        " names), or both comma-separated (default envvar)",
    )
    plugin.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=None,
        help="where the device plugin lists pods from (default: the pod's ServiceAccount)",
    )
    plugin.add_argument(
        "--pass-device-specs",
        action="store_true",
        help="also hand the device nodes (/dev/nvidia<minor>, nvidiactl, nvidia-uvm*)",
    )

    add_tls_flags(parser, client=True)
    add_health_port_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; shut down gracefully."""
    import asyncio
    import logging
    import signal
    import socket
    import sys
    import tempfile
    from contextlib import ExitStack

    from exporter.agent import Agent, AgentConfig
    from exporter.nvml import Nvml
    from exporter.probes.runner import ProbeSchedule
    from gputopo.runtime.kube_errors import KubeError
    from gputopo.runtime.supervisor import RootTaskDiedError
    from gputopo.runtime.tls import TlsUsageError, tls_from_args

    root = logging.getLogger()
    root.setLevel(min(root.level, logging.INFO))
    log = logging.getLogger("gputopo.exporter")
    node_name = args.node_name
    if not node_name:
        node_name = socket.gethostname()
        log.warning("NODE_NAME is not set; reporting as %s (the hostname)", node_name)
    with ExitStack() as stack:
        nvml = None
        sysfs_root = Path(args.sysfs_root)
        machine = ""
        if args.simulate:
            from exporter.fake_machine import FakeMachine
            from exporter.fake_nvml import FakeNvml
            from exporter.fake_sysfs import write_sysfs

            try:
                fake = FakeMachine.from_profile(args.simulate, node_name=node_name)
            except ValueError as error:
                print(f"gputopo exporter: {error}", file=sys.stderr)
                return 2
            nvml = Nvml(FakeNvml(fake).library)
            sysfs_root = write_sysfs(fake, Path(stack.enter_context(tempfile.TemporaryDirectory())))
            machine = fake.topology.machine
        try:
            tls = tls_from_args(args, component="exporter", dials=True)
        except TlsUsageError as err:
            print(f"gputopo exporter: {err}", file=sys.stderr)
            return 2
        config = AgentConfig(
            tls=tls,
            tls_check_s=args.tls_check_interval,
            health_port=args.health_port,
            identity_token=args.identity_token,
            node_name=node_name,
            aggregator=args.aggregator,
            http_host=args.http_host,
            http_port=args.http_port,
            probe_host=args.probe_host,
            probe_port=args.probe_port,
            probe_advertise=args.probe_address,
            sysfs_root=sysfs_root,
            pod_resources_socket=_pod_resources_socket(args.pod_resources_socket, args.simulate),
            machine=machine,
            simulated=args.simulate or "",
            discovery_interval_s=args.discovery_interval,
            gpu_probes=not args.no_gpu_probes and not args.simulate,
            peer_probes=not args.no_peer_probes,
            probe_schedule=ProbeSchedule.every(args.probe_interval),
        )

        async def serve() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            agent = Agent(config, nvml=nvml)
            if args.device_plugin:
                agent.device_plugin = _device_plugin(args, node_name, agent)
            async with agent:
                print(
                    f"exporter {node_name}: metrics on {config.http_host}:{agent.http_port}, "
                    f"probes on {config.probe_host}:{agent.probe_port}",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    await agent.tasks.wait(stop)  # a root task that dies ends the process
                finally:
                    print("exporter: shutting down", file=sys.stderr, flush=True)

        try:
            asyncio.run(serve())
        except OSError as error:
            print(f"gputopo exporter: {error}", file=sys.stderr)
            return 1
        except (ValueError, KubeError) as error:  # a bad device-plugin option, no API access
            print(f"gputopo exporter: {error}", file=sys.stderr)
            return 2
        except RootTaskDiedError as err:
            print(f"gputopo {err}", file=sys.stderr)
            return 1
    return 0


def _device_plugin(args: argparse.Namespace, node_name: str, agent: Any) -> Any:
    """The device plugin over the agent's topology; pods from the API server (in-cluster)."""
    from exporter.deviceplugin import (
        DevicePlugin,
        DevicePluginConfig,
        kubelet_allocations,
        node_pods,
    )
    from exporter.podresources import DEFAULT_SOCKET
    from gputopo.runtime.kube import KubeClient

    config = DevicePluginConfig(
        node_name=node_name,
        resource_name=args.device_plugin,
        directory=Path(args.device_plugin_dir),
        id_strategy=args.device_id_strategy,
        list_strategies=tuple(s.strip() for s in args.device_list_strategy.split(",") if s),
        pass_device_specs=args.pass_device_specs,
    )
    socket = _pod_resources_socket(args.pod_resources_socket, args.simulate) or DEFAULT_SOCKET
    return DevicePlugin(
        config,
        lambda: agent.topology,
        pods=node_pods(
            KubeClient.from_kubeconfig(args.kubeconfig)
            if args.kubeconfig
            else KubeClient.in_cluster(),
            node_name,
        ),
        allocated=kubelet_allocations(socket, config.resource_name),
    )


def _pod_resources_socket(given: str | None, simulate: str) -> Path | None:
    """The kubelet socket to read: the one given ('' for none), else the kubelet's default
    unless the machine is simulated (a simulated node has no kubelet of its own)."""
    from exporter.podresources import DEFAULT_SOCKET

    if given is not None:
        return Path(given) if given else None
    return None if simulate else DEFAULT_SOCKET
