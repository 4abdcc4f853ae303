"""`gputopo bench binder`: the same queue of gangs bound by (a) gputopo's gang binder, (b) a real
kube-scheduler with gputopo's extender, (c) a real default kube-scheduler, side by side.

    gputopo bench binder --kubeconfig K [--queue small|full] [--kube-scheduler PATH] [--json]
    gputopo bench binder --kubeconfig K --mode throughput [--gangs 200 --pods 4 --gpus 2
        --big-pods 256] [--json]

`--mode throughput` measures pods bound per second instead (`_binder_throughput.py`).

K names a real API server that the bench may fill with Node objects (the test harness's is
one; `scripts/build-kube-apiserver.sh` builds kube-apiserver and kube-scheduler v1.20.2). Each
setup gets its own simulated DGX H100 nodes (`--nodes`, 8 GPUs each), its own aggregator with
simulated exporters, its own namespace, and the same queue, submitted pod by pod, round robin
over the gangs (as a controller creating several jobs at once would): TP-8 singles, 4x8 and 8x8
gangs, prefill/decode pairs with a KV-transfer edge. The queue asks for more GPUs than there are,
so gangs compete. Sampled every 0.2 s for `--seconds`, reported per setup:

- `groups_fully_bound`: gangs with every pod bound;
- `partial_gpus_peak` / `partial_gpus_end`: GPUs held by pods of gangs not fully bound (GPUs
  nobody can use: the job cannot start), at the worst sample and at the end;
- `partial_groups_end`: gangs partly bound at the end;
- `predicted_comm_seconds`: gputopo's prediction of each fully bound gang's communication time
  where it was bound (median and per kind), from the nodes its pods ended on;
- `gang64_bind_seconds`: on empty nodes, a 64-pod x 1-GPU gang, from its last pod's creation
  to all 64 bound (None when it never bound whole within `--seconds`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

HELP = "gang binding side by side: gputopo's binder, kube-scheduler + extender, default"

SETUPS = ("binder", "extender", "default")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--kubeconfig", required=True, help="a real API server the bench may use")
    parser.add_argument(
        "--kube-scheduler", default="", metavar="PATH", help="kube-scheduler binary"
    )
    parser.add_argument("--queue", choices=("small", "full"), default="small", help="default small")
    parser.add_argument("--nodes", type=int, default=0, help="nodes per setup (default by queue)")
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="how long each setup runs (default by queue)"
    )
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated subset")
    parser.add_argument(
        "--prefix", default="bb", help="name prefix of the bench's nodes and namespaces"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--mode",
        choices=("queue", "throughput"),
        default="queue",
        help="queue: gangs competing for too few GPUs (default); throughput: pods bound a second",
    )
    parser.add_argument("--gangs", type=int, default=200, help="throughput: gangs in the stream")
    parser.add_argument("--pods", type=int, default=4, help="throughput: pods per gang")
    parser.add_argument("--gpus", type=int, default=2, help="throughput: GPUs per pod")
    parser.add_argument(
        "--big-pods", type=int, default=256, help="throughput: pods of the big 1-GPU gang (0: none)"
    )


def queue(kind: str) -> list[Any]:
    """The mixed queue: small (176 GPUs asked) or full (twice as many gangs)."""
    from gputopo.app.benchmarks._binder_kube import GangSpec

    repeat = 1 if kind == "small" else 2
    out: list[GangSpec] = []
    for r in range(repeat):
        out += [GangSpec(f"tp8-{r}{i}", "tp8", (("tp", 1, 8),)) for i in range(4)]
        out += [GangSpec(f"g4x8-{r}{i}", "gang4x8", (("train", 4, 8),)) for i in range(2)]
        out += [GangSpec(f"g8x8-{r}", "gang8x8", (("train", 8, 8),))]
        out += [
            GangSpec(
                f"pd-{r}{i}",
                "pd",
                (("prefill", 1, 4), ("decode", 1, 4)),
                (("prefill", "decode", 50.0),),
            )
            for i in range(2)
        ]
    return out


def run(args: argparse.Namespace) -> int:
    """Measure and print."""
    from gputopo.app.benchmarks._binder_kube import find_kube_scheduler

    setups = [s for s in args.setups.split(",") if s]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        print(f"gputopo bench binder: --setups: unknown {unknown}; of {SETUPS}", file=sys.stderr)
        return 2
    try:
        binary = find_kube_scheduler(args.kube_scheduler) if set(setups) - {"binder"} else None
    except FileNotFoundError as err:
        print(f"gputopo bench binder: --kube-scheduler: {err}", file=sys.stderr)
        return 2
    if args.mode == "throughput":
        return _run_throughput(args, binary, setups)
    nodes = args.nodes or (12 if args.queue == "small" else 24)
    seconds = args.seconds or (15.0 if args.queue == "small" else 30.0)
    figures = asyncio.run(
        measure(
            args.kubeconfig,
            binary,
            queue(args.queue),
            setups=setups,
            nodes=nodes,
            seconds=seconds,
            prefix=args.prefix,
        )
    )
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(table(figures))
    return 0


def _run_throughput(args: argparse.Namespace, binary: Path | None, setups: list[str]) -> int:
    from gputopo.app.benchmarks._binder_throughput import Stream, measure_throughput

    wanted = [s for s in setups if s != "extender"]  # the extender setup binds as default does
    stream = Stream(gangs=args.gangs, pods=args.pods, gpus=args.gpus, big_pods=args.big_pods)
    figures = asyncio.run(
        measure_throughput(
            args.kubeconfig,
            binary,
            stream=stream,
            setups=wanted,
            prefix=args.prefix,
            timeout_s=args.seconds or 600.0,
        )
    )
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(throughput_table(figures))
    return 0


def throughput_table(figures: dict[str, Any]) -> str:
    """Pods a second and gang latencies, one column per setup."""
    setups = list(figures["setups"])
    rows = [
        ("stream pods/s", "stream", "pods_per_second"),
        ("stream pods bound", "stream", "pods_bound"),
        ("stream last pod -> gang bound p50 s", "stream", "last_pod_to_all_bound_p50_s"),
        ("stream last pod -> gang bound p99 s", "stream", "last_pod_to_all_bound_p99_s"),
        ("big gang pods/s", "big_gang", "pods_per_second"),
        ("big gang last pod -> all bound s", "big_gang", "last_pod_to_all_bound_p50_s"),
    ]
    lines = [f"{'':40}" + "".join(f"{s:>12}" for s in setups)]
    for label, part, key in rows:
        cells = [str((figures["setups"][s].get(part) or {}).get(key, "-")) for s in setups]
        lines.append(f"{label:40}" + "".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def table(figures: dict[str, Any]) -> str:
    """The side-by-side table."""
    rows = [
        ("gangs fully bound", "groups_fully_bound"),
        ("gangs partly bound at end", "partial_groups_end"),
        ("GPUs held by partial gangs, peak", "partial_gpus_peak"),
        ("GPUs held by partial gangs, end", "partial_gpus_end"),
        ("predicted comm. s, median", "predicted_comm_seconds_median"),
        ("64-pod gang bound in s", "gang64_bind_seconds"),
    ]
    setups = list(figures["setups"])
    head = f"{'':36}" + "".join(f"{s:>12}" for s in setups)
    lines = [
        f"{figures['gangs']} gangs, {figures['gpus_asked']} GPUs asked, "
        f"{figures['gpus_per_setup']} GPUs per setup",
        head,
    ]
    for label, key in rows:
        cells = []
        for s in setups:
            value = figures["setups"][s].get(key)
            cells.append(f"{'-' if value is None else value:>12}")
        lines.append(f"{label:36}" + "".join(cells))
    return "\n".join(lines)


async def measure(
    kubeconfig: str,
    binary: Path | None,
    gangs: Sequence[Any],
    *,
    setups: Sequence[str],
    nodes: int,
    seconds: float,
    prefix: str = "bb",
) -> dict[str, Any]:
    """Every setup in turn on the same server; the figures."""
    from gputopo.runtime.kube import KubeClient

    kube = KubeClient.from_kubeconfig(kubeconfig)
    run_id = secrets.token_hex(3)
    out: dict[str, Any] = {
        "queue": [g.name for g in gangs],
        "gangs": len(gangs),
        "gpus_asked": sum(g.gpus for g in gangs),
        "gpus_per_setup": nodes * 8,
        "seconds_per_setup": seconds,
        "setups": {},
    }
    try:
        await _ensure_crd(kube)
        with tempfile.TemporaryDirectory(prefix="gputopo-bench-binder-") as tmp:
            for setup in setups:
                base = f"{prefix}-{run_id}-{setup[:3]}"
                figures = await _one_setup(
                    kube,
                    kubeconfig=kubeconfig,
                    binary=binary,
                    workdir=Path(tmp),
                    setup=setup,
                    prefix=base,
                    gangs=gangs,
                    nodes_count=nodes,
                    seconds=seconds,
                )
                gang64 = await _one_setup(
                    kube,
                    kubeconfig=kubeconfig,
                    binary=binary,
                    workdir=Path(tmp),
                    setup=setup,
                    prefix=base + "-64",
                    gangs=[_gang64()],
                    nodes_count=nodes,
                    seconds=seconds,
                )
                figures["gang64_bind_seconds"] = gang64["whole_after_seconds"].get("gang64-0")
                out["setups"][setup] = figures
    finally:
        kube.close()
    return out


def _gang64() -> Any:
    from gputopo.app.benchmarks._binder_kube import GangSpec

    return GangSpec("gang64-0", "gang64", (("train", 64, 1),))


async def _ensure_crd(kube: Any) -> None:
    from gputopo.app.benchmarks._binder_kube import PODGROUP_CRD
    from gputopo.runtime.kube import ConflictError

    with contextlib.suppress(ConflictError):
        await kube.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=PODGROUP_CRD
        )
    deadline = time.monotonic() + 30
    while True:
        try:
            await kube.request("GET", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def _scheduler(
    setup: str,
    kube: Any,
    *,
    kubeconfig: str,
    binary: Path | None,
    workdir: Path,
    name: str,
    agg: Any,
) -> AsyncIterator[None]:
    from gputopo.app.benchmarks._binder_kube import kube_scheduler
    from gputopo.runtime import grpcio
    from gputopo.runtime.placement_client import PlacementClient
    from scheduler.binder import Binder, BinderConfig

    if setup == "binder":
        async with grpcio.channel(agg.grpc_target) as channel:
            config = BinderConfig(scheduler_name=name, undo_grace_s=0, retry_unplaced_s=1.0)
            binder = Binder(kube, PlacementClient(channel), config)
            task = asyncio.create_task(binder.run())
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return
    assert binary is not None
    url = f"http://127.0.0.1:{agg.http_port}/scheduler" if setup == "extender" else ""
    with kube_scheduler(binary, kubeconfig, workdir, name=name, extender_url=url):
        yield


async def _one_setup(
    kube: Any,
    *,
    kubeconfig: str,
    binary: Path | None,
    workdir: Path,
    setup: str,
    prefix: str,
    gangs: Sequence[Any],
    nodes_count: int,
    seconds: float,
) -> dict[str, Any]:
    from aggregator.server import Aggregator, AggregatorConfig, KubeOptions
    from exporter.simulate import SimulatedExporters
    from gputopo.app.benchmarks._binder_kube import bench_nodes, prepare_nodes

    nodes = bench_nodes(prefix, nodes_count)
    ns = prefix
    name = f"{prefix}-sched"
    await kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    await prepare_nodes(kube, nodes)
    agg_kube = type(kube).from_kubeconfig(kubeconfig)
    agg = Aggregator(
        AggregatorConfig(
            heartbeat_interval_s=0.2,
            housekeeping_interval_s=0.1,
            http_port=0,
            kube=KubeOptions(publish_labels=False),
        ),
        kube=agg_kube,
    )
    await agg.start()
    try:
        async with SimulatedExporters(
            nodes, target=agg.grpc_target, heartbeat_interval_s=0.2
        ) as sim:
            await sim.wait_acked(timeout_s=60)
            if agg.pods is not None:
                await agg.pods.synced.wait()
            async with _scheduler(
                setup,
                kube,
                kubeconfig=kubeconfig,
                binary=binary,
                workdir=workdir,
                name=name,
                agg=agg,
            ):
                return await _submit_and_watch(
                    kube, ns, name=name, gangs=gangs, nodes=nodes, seconds=seconds
                )
    finally:
        await agg.stop(grace_s=0.1)
        agg_kube.close()
        await _cleanup(kube, ns, [n.name for n in nodes])


def _round_robin(gangs: Sequence[Any]) -> Iterator[tuple[Any, str, str, int]]:
    lists = [[(g, *p) for p in g.pod_names()] for g in gangs]
    for i in range(max(len(x) for x in lists)):
        for pods in lists:
            if i < len(pods):
                yield pods[i]


async def _submit_and_watch(
    kube: Any, ns: str, *, name: str, gangs: Sequence[Any], nodes: Sequence[Any], seconds: float
) -> dict[str, Any]:
    for gang in gangs:
        await kube.request(
            "POST",
            f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
            body={
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {
                    "name": gang.name,
                    "annotations": {"gputopo.io/request": json.dumps(gang.request())},
                },
                "spec": {"minMember": gang.pods},
            },
        )
    last_created: dict[str, float] = {}
    for gang, pod, group, gpus in _round_robin(gangs):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "labels": {"scheduling.x-k8s.io/pod-group": gang.name, "gputopo.io/group": group},
            },
            "spec": {
                "schedulerName": name,
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        }
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
        last_created[gang.name] = time.monotonic()
    by_name = {g.name: g for g in gangs}
    peak = 0
    whole_at: dict[str, float] = {}
    began = time.monotonic()
    pods: list[dict[str, Any]] = []
    while time.monotonic() - began < seconds:
        page = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
        pods = list(page.get("items") or [])
        bound = _bound_by_gang(pods)
        partial = _partial_gpus(bound, by_name)
        peak = max(peak, partial)
        now = time.monotonic()
        for g, members in bound.items():
            if g not in whole_at and len(members) == by_name[g].pods:
                whole_at[g] = now - last_created[g]
        if len(whole_at) == len(gangs) and len(gangs) == 1:
            break
        await asyncio.sleep(0.2)
    bound = _bound_by_gang(pods)
    whole = [g for g, m in bound.items() if len(m) == by_name[g].pods]
    partial_groups = [g for g, m in bound.items() if 0 < len(m) < by_name[g].pods]
    predicted = _predicted(nodes, {g: bound[g] for g in whole}, by_name)
    values = list(predicted.values())
    return {
        "groups_fully_bound": len(whole),
        "partial_groups_end": len(partial_groups),
        "partial_gpus_peak": peak,
        "partial_gpus_end": _partial_gpus(bound, by_name),
        "predicted_comm_seconds_median": round(statistics.median(values), 6) if values else None,
        "predicted_comm_seconds": {g: round(v, 6) for g, v in sorted(predicted.items())},
        "whole_after_seconds": {g: round(v, 3) for g, v in sorted(whole_at.items())},
    }


def _bound_by_gang(pods: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            gang = pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"]
            out.setdefault(gang, []).append(pod)
    return out


def _partial_gpus(bound: dict[str, list[dict[str, Any]]], by_name: dict[str, Any]) -> int:
    total = 0
    for g, members in bound.items():
        if len(members) < by_name[g].pods:
            for pod in members:
                limits = pod["spec"]["containers"][0]["resources"]["limits"]
                total += int(limits["nvidia.com/gpu"])
    return total


def _predicted(
    nodes: Sequence[Any], whole: dict[str, list[dict[str, Any]]], by_name: dict[str, Any]
) -> dict[str, float]:
    """gputopo's predicted communication seconds of each whole gang where its pods ended: the
    GPU indices the binder recorded, else the lowest free ones per node in bind order (what a
    device plugin hands out first)."""
    from gputopo.cluster import ClusterSnapshot, NodeState
    from gputopo.placement.predict import predict
    from gputopo.placement.result import PodPlacement
    from gputopo.request import request_from_mapping

    snapshot = ClusterSnapshot(NodeState(t, frozenset(range(t.gpu_count)), {}) for t in nodes)
    taken: dict[str, int] = {}
    out: dict[str, float] = {}
    for g in sorted(whole):
        gang = by_name[g]
        request = request_from_mapping(gang.request())
        placements = []
        counters: dict[str, int] = {}
        for pod in sorted(whole[g], key=lambda p: p["metadata"]["name"]):
            node = pod["spec"]["nodeName"]
            group = pod["metadata"]["labels"]["gputopo.io/group"]
            gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            recorded = (pod["metadata"].get("annotations") or {}).get("gputopo.io/gpus")
            if recorded:
                indices = tuple(int(x) for x in recorded.split(","))
            else:
                start = taken.get(node, 0)
                indices = tuple(range(start, min(start + gpus, 8)))
                taken[node] = start + gpus
            i = counters.get(group, 0)
            counters[group] = i + 1
            placements.append(PodPlacement(group, 0, i, i, node, indices))
        out[g] = predict(snapshot, request, placements).communication_seconds
    return out


async def _cleanup(kube: Any, ns: str, nodes: Sequence[str]) -> None:
    from gputopo.runtime.kube import KubeError

    with contextlib.suppress(KubeError):
        page = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
        for pod in page.get("items") or []:
            await kube.delete_pod(ns, pod["metadata"]["name"], grace_s=0)
    with contextlib.suppress(KubeError):
        await kube.request(
            "DELETE", f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
        )
    for node in nodes:
        await kube.delete_node(node)
    with contextlib.suppress(KubeError):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}")
