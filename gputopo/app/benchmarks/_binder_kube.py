"""Parts of `gputopo bench binder`: a simulated GPU cluster on a real API server, a real
kube-scheduler beside it, and the pods of a queue of gangs.

Nodes are Node objects with the status a kubelet with NVIDIA's device plugin would report
(allocatable `nvidia.com/gpu`, Ready, no taints); no kubelet runs, so a bound pod stays Pending
but holds what it asked for, which is all a comparison of binding needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gputopo.machines import load_machine
from gputopo.runtime.kube import MERGE_PATCH, ConflictError, KubeClient
from gputopo.topology import FabricPosition, NodeTopology

__all__ = [
    "PODGROUP_CRD",
    "GangSpec",
    "KubeSchedulerError",
    "bench_nodes",
    "find_kube_scheduler",
    "kube_scheduler",
    "prepare_nodes",
    "scheduler_config",
    "start_kube_scheduler",
]

KUBE_VERSION = "v1.20.2"
SCHEDULER_ENV = "GPUTOPO_KUBE_SCHEDULER"

# scheduler-plugins' coscheduling PodGroup, as much of it as the binder reads (group, version,
# kind, plural and scope from kubernetes-sigs/scheduler-plugins
# config/crd/bases/scheduling.x-k8s.io_podgroups.yaml), installed when the server lacks it.
PODGROUP_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "scope": "Namespaced",
        "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@dataclass(frozen=True, slots=True)
class GangSpec:
    """One entry of the queue: `pods` x `gpus` GPUs, all-reduce unless an edge joins groups."""

    name: str
    kind: str  # tp8, gang4x8, gang8x8, pd, gang64
    groups: tuple[tuple[str, int, int], ...]  # (request group, pods, gpus per pod)
    edges: tuple[tuple[str, str, float], ...] = ()  # (from, to, min GB/s)

    @property
    def pods(self) -> int:
        return sum(n for _, n, _ in self.groups)

    @property
    def gpus(self) -> int:
        return sum(n * g for _, n, g in self.groups)

    def request(self) -> dict[str, Any]:
        """The `gputopo.io/request` of the gang."""
        data: dict[str, Any] = {
            "groups": [
                {"name": g, "pods": n, "gpus_per_pod": gpus, "pattern": "all_reduce"}
                for g, n, gpus in self.groups
            ]
        }
        if self.edges:
            data["edges"] = [{"from": a, "to": b, "min_gbps": gbps} for a, b, gbps in self.edges]
        return data

    def pod_names(self) -> Iterator[tuple[str, str, int]]:
        """(pod name, request group, GPUs)."""
        for g, n, gpus in self.groups:
            for i in range(n):
                yield f"{self.name}-{g}-{i}", g, gpus


def bench_nodes(prefix: str, count: int, *, per_leaf: int = 4) -> list[NodeTopology]:
    """DGX H100 nodes, `per_leaf` under each leaf, one spine."""
    nodes = []
    for i in range(count):
        topo = load_machine("dgx-h100", node_name=f"{prefix}-{i:02d}")
        fabric = FabricPosition(
            tiers=(f"leaf-{i // per_leaf}", "spine-0", "core"),
            source="inventory",
            confidence="high",
        )
        nodes.append(replace(topo, fabric=fabric))
    return nodes


async def prepare_nodes(kube: KubeClient, nodes: Sequence[NodeTopology]) -> None:
    """Create the Node objects, Ready with allocatable GPUs and without the not-ready taint."""

    async def one(topo: NodeTopology) -> None:
        with contextlib.suppress(ConflictError):
            await kube.create_node(topo.name, labels={"kubernetes.io/hostname": topo.name})
        gpus = str(len(topo.gpus))
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus}
        status = {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        }
        path = f"/api/v1/nodes/{topo.name}"
        await kube.request(
            "PATCH", path + "/status", body={"status": status}, content_type=MERGE_PATCH
        )
        await kube.request("PATCH", path, body={"spec": {"taints": None}}, content_type=MERGE_PATCH)

    await asyncio.gather(*(one(n) for n in nodes))


def find_kube_scheduler(explicit: str = "") -> Path:
    """--kube-scheduler, else $GPUTOPO_KUBE_SCHEDULER, else the build script's cache."""
    cache = Path(os.environ.get("GPUTOPO_CACHE_DIR") or Path.home() / ".cache" / "gputopo")
    path = Path(
        explicit
        or os.environ.get(SCHEDULER_ENV, "")
        or cache / f"kube-apiserver-{KUBE_VERSION}" / "kube-scheduler"
    )
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"no kube-scheduler {KUBE_VERSION} at {path} (scripts/build-kube-apiserver.sh builds"
            f" one; or set {SCHEDULER_ENV})"
        )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scheduler_config(
    kubeconfig: str, *, name: str, extender_url: str = "", qps: int = 0
) -> dict[str, Any]:
    """A v1beta1 KubeSchedulerConfiguration with one profile and, given a URL, gputopo's extender
    configured as the README says (the bench and the tests' harness run the same one)."""
    connection: dict[str, Any] = {"kubeconfig": kubeconfig}
    insecure = _free_port()
    if qps:
        connection |= {"qps": qps, "burst": 2 * qps}
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {"leaderElect": False},
        # A free loopback port for the insecure healthz/metrics listener: kube-scheduler 1.20
        # serves it whatever --port says (neither port 0 nor an empty address turns it off), on
        # 10251 by default, and two of them on one machine fought over that port (the second
        # exited at start).
        "healthzBindAddress": f"127.0.0.1:{insecure}",
        "metricsBindAddress": f"127.0.0.1:{insecure}",
        "profiles": [{"schedulerName": name}],
    }
    if extender_url:
        config["extenders"] = [
            {
                "urlPrefix": extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 5,
                "nodeCacheCapable": True,
                "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
            }
        ]
    return config


class KubeSchedulerError(RuntimeError):
    """kube-scheduler exited or its health endpoint never answered (the message says which)."""


_START_ATTEMPTS = 3


def start_kube_scheduler(
    binary: Path,
    config: dict[str, Any],
    workdir: Path,
    *,
    name: str,
    extra_args: Sequence[str] = (),
    timeout_s: float = 60.0,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start kube-scheduler with `config` on a free loopback port and wait until /healthz
    answers; returns the process and its log. The bench and the tests' harness start it so.

    The port is free when chosen but another process may take it before kube-scheduler binds
    it (seen with several test runs sharing a machine): a start whose log says the address is
    in use is tried again on a new port, at most `_START_ATTEMPTS` times."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            return _start_once(
                binary, config, workdir, name=name, extra_args=extra_args, timeout_s=timeout_s
            )
        except _PortTakenError:
            if attempt == _START_ATTEMPTS:
                raise KubeSchedulerError(
                    f"kube-scheduler found its port taken {attempt} times; see {workdir}"
                ) from None
    raise AssertionError("unreachable")


class _PortTakenError(Exception):
    """kube-scheduler exited at start because its port was taken meanwhile."""


def _start_once(
    binary: Path,
    config: dict[str, Any],
    workdir: Path,
    *,
    name: str,
    extra_args: Sequence[str],
    timeout_s: float,
) -> tuple[subprocess.Popen[bytes], Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"kube-scheduler-{name}.json"  # JSON is YAML
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    port = _free_port()
    log_path = workdir / f"kube-scheduler-{name}.log"
    args = [
        str(binary),
        f"--config={config_path}",
        "--port=0",
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={workdir / ('certs-' + name)}",
        *extra_args,
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if b"address already in use" in log_path.read_bytes():
                raise _PortTakenError
            raise KubeSchedulerError(f"kube-scheduler exited; see {log_path}")
        try:
            url = f"https://127.0.0.1:{port}/healthz"
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                if response.status == 200:
                    return proc, log_path
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    stop_process(proc)
    raise KubeSchedulerError(f"kube-scheduler never became healthy; see {log_path}")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def kube_scheduler(
    binary: Path, kubeconfig: str, workdir: Path, *, name: str, extender_url: str = ""
) -> Iterator[subprocess.Popen[bytes]]:
    """A kube-scheduler process with one profile (and gputopo's extender when given), as the
    README configures it; stopped on exit."""
    config = scheduler_config(kubeconfig, name=name, extender_url=extender_url, qps=200)
    proc, _ = start_kube_scheduler(binary, config, workdir, name=name)
    try:
        yield proc
    finally:
        stop_process(proc)
