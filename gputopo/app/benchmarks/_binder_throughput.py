"""`gputopo bench binder --mode throughput`: how many pods a second the gang binder binds,
whole gangs at a time, beside the default kube-scheduler binding the same pods one by one.

One run on one API server, the setups one after the other on the same simulated nodes (Node
objects a kubelet with NVIDIA's device plugin would report; no kubelet runs):

1. a stream of gangs (`--gangs` x `--pods` x `--gpus`), each gang's PodGroup then its pods
   created in order, `--creators` requests at a time, as a job controller would;
2. after the stream has bound, one big gang (`--big-pods` x 1 GPU).

Every pod is pinned to the bench's nodes (a label and a `nodeSelector`), so a server with other
Nodes (a real cluster, another bench) neither receives the bench's pods nor confuses it. A
watch records when each pod is first seen bound. Reported per setup: pods bound per second end
to end (first pod created to last pod bound) for the stream and the big gang, and the p50/p99
time from a gang's last pod created to all its pods bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["POOL_LABEL", "Stream", "measure_throughput", "pinned_pod"]

POOL_LABEL = "gputopo.io/bench-pool"
_PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"


@dataclass(frozen=True, slots=True)
class Stream:
    """The gangs every setup binds."""

    gangs: int = 200
    pods: int = 4
    gpus: int = 2
    big_pods: int = 256
    creators: int = 8  # pod creations in flight at once

    @property
    def gpus_needed(self) -> int:
        return self.gangs * self.pods * self.gpus + self.big_pods


def _progress(text: str) -> None:
    print(f"gputopo bench binder: {text}", file=sys.stderr, flush=True)


def pinned_pod(name: str, *, gang: str, pool: str, scheduler: str, gpus: int) -> dict[str, Any]:
    """A pod of `gang` asking `gpus` GPUs, allowed only on the bench's nodes of `pool`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"scheduling.x-k8s.io/pod-group": gang, POOL_LABEL: pool},
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {POOL_LABEL: pool},
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


class _Bound:
    """When each pod was first seen bound, from a watch on the bench's pods."""

    def __init__(self, kube: Any, ns: str) -> None:
        self.kube = kube
        self.ns = ns
        self.at: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def run(self) -> None:
        path = f"/api/v1/namespaces/{self.ns}/pods"
        version = ""
        while True:
            if not version:
                items, version = await self.kube.list_all(path)
                for pod in items:
                    self._saw(pod)
            try:
                async for kind, pod in self.kube.watch_json(path, version, timeout_s=30):
                    version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        self._saw(pod)
            except Exception:  # an expired version or a dropped watch: list again
                version = ""

    def _saw(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if (pod.get("spec") or {}).get("nodeName") and name not in self.at:
            self.at[name] = time.monotonic()
            self.changed.set()

    async def wait_for(self, names: Sequence[str], *, timeout_s: float, what: str) -> bool:
        deadline = time.monotonic() + timeout_s
        last = -1
        while True:
            bound = sum(1 for n in names if n in self.at)
            if bound != last and (bound == len(names) or bound // 100 != last // 100):
                _progress(f"{what}: {bound}/{len(names)} pods bound")
                last = bound
            if bound == len(names):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                _progress(f"{what}: gave up after {timeout_s:.0f} s with {bound} bound")
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=min(left, 1.0))


async def _create_gangs(
    kube: Any,
    ns: str,
    gangs: Sequence[tuple[str, int, int]],
    *,
    pool: str,
    scheduler: str,
    creators: int,
) -> tuple[dict[str, list[str]], dict[str, float], float]:
    """PodGroups, then pods gang after gang; (gang -> pods, gang -> last pod created, first
    pod created)."""
    limit = asyncio.Semaphore(creators)
    members: dict[str, list[str]] = {}
    last: dict[str, float] = {}
    first: list[float] = []

    async def one(gang: str, name: str, gpus: int) -> None:
        async with limit:
            body = pinned_pod(name, gang=gang, pool=pool, scheduler=scheduler, gpus=gpus)
            if not first:
                first.append(time.monotonic())
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
            last[gang] = max(last.get(gang, 0.0), time.monotonic())

    tasks = []
    for gang, pods, gpus in gangs:
        await kube.request(
            "POST",
            _PODGROUPS.format(ns=ns),
            body={
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": gang},
                "spec": {"minMember": pods},
            },
        )
        members[gang] = [f"{gang}-{i}" for i in range(pods)]
        tasks += [asyncio.create_task(one(gang, n, gpus)) for n in members[gang]]
        await asyncio.sleep(0)  # let creations start while the next gang's PodGroup is made
    await asyncio.gather(*tasks)
    return members, last, first[0] if first else time.monotonic()


def _figures(
    bound: _Bound, members: dict[str, list[str]], last: dict[str, float], began: float
) -> dict[str, Any]:
    names = [n for pods in members.values() for n in pods]
    times = [bound.at[n] for n in names if n in bound.at]
    lags = sorted(
        max(bound.at[n] for n in pods) - last[g]
        for g, pods in members.items()
        if all(n in bound.at for n in pods)
    )
    end = max(times) if times else began
    out: dict[str, Any] = {
        "pods": len(names),
        "pods_bound": len(times),
        "seconds": round(end - began, 3),
        "pods_per_second": round(len(times) / (end - began), 2) if end > began else None,
        "gangs_whole": len(lags),
    }
    if lags:
        out["last_pod_to_all_bound_p50_s"] = round(statistics.median(lags), 3)
        out["last_pod_to_all_bound_p99_s"] = round(
            lags[min(len(lags) - 1, math.ceil(0.99 * len(lags)) - 1)], 3
        )
    return out


async def _one_setup(
    kube: Any,
    setup: str,
    *,
    ns: str,
    pool: str,
    scheduler: str,
    stream: Stream,
    timeout_s: float,
) -> dict[str, Any]:
    await kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    bound = _Bound(kube, ns)
    watcher = asyncio.create_task(bound.run())
    try:
        gangs = [(f"g{i:04d}", stream.pods, stream.gpus) for i in range(stream.gangs)]
        _progress(f"{setup}: creating {len(gangs)} gangs of {stream.pods} x {stream.gpus} GPUs")
        members, last, began = await _create_gangs(
            kube, ns, gangs, pool=pool, scheduler=scheduler, creators=stream.creators
        )
        names = [n for pods in members.values() for n in pods]
        await bound.wait_for(names, timeout_s=timeout_s, what=f"{setup} stream")
        figures = {"stream": _figures(bound, members, last, began)}
        if stream.big_pods:
            _progress(f"{setup}: creating one gang of {stream.big_pods} x 1 GPU")
            big, big_last, big_began = await _create_gangs(
                kube,
                ns,
                [("big", stream.big_pods, 1)],
                pool=pool,
                scheduler=scheduler,
                creators=stream.creators,
            )
            await bound.wait_for(big["big"], timeout_s=timeout_s, what=f"{setup} big gang")
            figures["big_gang"] = _figures(bound, big, big_last, big_began)
        _progress(f"{setup}: {figures}")
        return figures
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        await _clear(kube, ns)


async def _clear(kube: Any, ns: str) -> None:
    """Delete the setup's pods and namespace and wait until its pods are gone, so the next
    setup finds the nodes empty."""
    from gputopo.runtime.kube import KubeError

    with contextlib.suppress(KubeError):
        await kube.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods", body={"gracePeriodSeconds": 0}
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods", query={"limit": "1"})
        if not page.get("items"):
            break
        await asyncio.sleep(0.5)
    with contextlib.suppress(KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}")


@contextlib.asynccontextmanager
async def _simulated_nodes(kube: Any, kubeconfig: str, nodes: Sequence[Any]) -> AsyncIterator[Any]:
    """An aggregator with the nodes' simulated exporters: the placement service the binder asks
    (it runs through every setup, so each finds the same process load beside it)."""
    from aggregator.server import Aggregator, AggregatorConfig, KubeOptions
    from exporter.simulate import SimulatedExporters

    agg_kube = type(kube).from_kubeconfig(kubeconfig)
    agg = Aggregator(
        AggregatorConfig(
            heartbeat_interval_s=1.0,
            housekeeping_interval_s=0.5,
            http_port=0,
            kube=KubeOptions(publish_labels=False),
        ),
        kube=agg_kube,
    )
    await agg.start()
    try:
        async with SimulatedExporters(
            nodes, target=agg.grpc_target, heartbeat_interval_s=1.0
        ) as sim:
            await sim.wait_acked(timeout_s=120)
            if agg.pods is not None:
                await agg.pods.synced.wait()
            yield agg
    finally:
        await agg.stop(grace_s=0.1)
        agg_kube.close()


@contextlib.asynccontextmanager
async def _binder_process(
    kubeconfig: str, target: str, *, name: str, workdir: Path
) -> AsyncIterator[None]:
    """`gputopo scheduler` in its own process, as it runs in a cluster (kube-scheduler runs in
    its own too), ready (its pod cache synced) before the stream starts."""
    import subprocess
    import urllib.request

    from gputopo.app.benchmarks._binder_kube import _free_port, stop_process

    port = _free_port()
    args = [
        sys.executable,
        "-m",
        "gputopo",
        "scheduler",
        f"--kubeconfig={kubeconfig}",
        f"--aggregator={target}",
        f"--scheduler-name={name}",
        "--no-leader-election",
        "--undo-grace=0",
        "--http-host=127.0.0.1",
        f"--http-port={port}",
        "--insecure",
    ]
    log_path = workdir / f"binder-{name}.log"

    def start() -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    proc = await asyncio.to_thread(start)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gputopo scheduler exited; see {log_path}")
            try:
                url = f"http://127.0.0.1:{port}/readyz"
                with await asyncio.to_thread(urllib.request.urlopen, url, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gputopo scheduler never became ready; see {log_path}")
            await asyncio.sleep(0.2)
        yield
    finally:
        await asyncio.to_thread(stop_process, proc)
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        trouble = [line for line in lines if " WARNING " in line or " ERROR " in line]
        if trouble:
            _progress(f"binder: {len(trouble)} warning(s); the last ones:")
            for line in [*trouble[:5], *trouble[-5:]] if len(trouble) > 10 else trouble:
                _progress(f"  {line[:300]}")


async def measure_throughput(
    kubeconfig: str,
    binary: Path | None,
    *,
    stream: Stream,
    setups: Sequence[str],
    prefix: str,
    timeout_s: float,
) -> dict[str, Any]:
    """Every setup in turn on the same nodes of one server; the figures."""
    import secrets
    import tempfile

    from gputopo.app.benchmarks._binder_kube import bench_nodes, kube_scheduler, prepare_nodes
    from gputopo.runtime.kube import MERGE_PATCH, KubeClient

    kube = KubeClient.from_kubeconfig(kubeconfig, workers=16)
    run_id = secrets.token_hex(3)
    pool = f"{prefix}-{run_id}"
    count = math.ceil(stream.gpus_needed / 8)
    nodes = bench_nodes(f"{pool}-n", count, per_leaf=8)
    out: dict[str, Any] = {
        "mode": "throughput",
        "nodes": count,
        "gpus_per_node": 8,
        "stream": {"gangs": stream.gangs, "pods": stream.pods, "gpus": stream.gpus},
        "big_gang_pods": stream.big_pods,
        "setups": {},
    }
    try:
        from gputopo.app.benchmarks.binder import _ensure_crd

        await _ensure_crd(kube)
        _progress(f"preparing {count} nodes (pool {pool})")
        await prepare_nodes(kube, nodes)
        await asyncio.gather(
            *(
                kube.request(
                    "PATCH",
                    f"/api/v1/nodes/{n.name}",
                    body={"metadata": {"labels": {POOL_LABEL: pool}}},
                    content_type=MERGE_PATCH,
                )
                for n in nodes
            )
        )
        with tempfile.TemporaryDirectory(prefix="gputopo-bench-throughput-") as tmp:
            async with _simulated_nodes(kube, kubeconfig, nodes) as agg:
                for setup in setups:
                    name = f"{pool}-{setup[:3]}"
                    run = _one_setup(
                        kube,
                        setup,
                        ns=name,
                        pool=pool,
                        scheduler=name,
                        stream=stream,
                        timeout_s=timeout_s,
                    )
                    if setup == "binder":
                        target = agg.grpc_target
                        async with _binder_process(
                            kubeconfig, target, name=name, workdir=Path(tmp)
                        ):
                            out["setups"][setup] = await run
                    else:
                        assert binary is not None
                        with kube_scheduler(binary, kubeconfig, Path(tmp), name=name):
                            out["setups"][setup] = await run
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                await kube.delete_node(node.name)
        kube.close()
    return out
