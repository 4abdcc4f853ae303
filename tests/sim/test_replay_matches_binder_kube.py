"""The replay is the real system: the same trace through the real gang binder and aggregator on
the real API server, with a Python fake kubelet, gives the simulator's placements and completion
order.

The fake kubelet moves a bound pod to Running and, once the trace's logical clock passes its start
plus its duration, to Succeeded; the binder then releases the gang's reservation and the
aggregator frees its GPUs. The driver advances that clock event by event (completions, then
arrivals, as the replay orders them) and waits for the binder to settle after each, so wall-clock
jitter on a loaded machine cannot reorder anything: what is compared is decisions, not timing.
"Settled" is the binder's own word (`Binder.idle`: nothing in flight, every pod event looked at,
every waiting group tried since GPUs were last freed), asked once the binder's pod cache holds
every change the driver made and the aggregator's pod watch every phase it set (under load that
watch lagged the binder's, and a gang arriving next was placed around a finished one whose GPUs
the aggregator still counted); it used to be "nothing bound for 1 s", which a slow machine could
satisfy while the binder was still at work.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from aggregator.server import Aggregator
from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.request import Group, Pattern, PlacementRequest
from gputopo.runtime.kube import KubeClient
from gputopo.sim.engine import Engine
from gputopo.sim.jobtime import JobTimeModel
from gputopo.sim.replay import ReplayOptions, replay
from gputopo.sim.traces import JobClass, SimJob
from scheduler.binder import Binder, BinderConfig
from tests.aggregator.kubeutil import install_crds, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.kubeutil import PODGROUPS, binder_stack, create, gpu_pod, pod_group, pods_of

pytestmark = [pytest.mark.kube, pytest.mark.slow]

# (pods, GPUs per pod) of the jobs, cycled; arrivals come in batches so the queue fills.
_SHAPES = ((1, 8), (1, 1), (1, 2), (2, 8), (1, 4), (2, 4), (1, 1), (3, 8), (1, 2), (1, 4))


def _trace(count: int) -> list[SimJob]:
    jobs = []
    for i in range(count):
        pods, per = _SHAPES[i % len(_SHAPES)]
        group = Group("train", pods=pods, gpus_per_pod=per, pattern=Pattern.ALL_REDUCE)
        name = f"j{i:02}"
        # Batches of 5 every 10 time units; durations 5..45, distinct per batch member.
        arrival = float(10 * (i // 5))
        duration = float(5 + (i * 7) % 41)
        request = PlacementRequest(groups=(group,), job=name)
        jobs.append(SimJob(name, arrival, duration, JobClass.TRAIN, request, tp=per))
    return jobs


def _simulate(nodes: list, jobs: list[SimJob]) -> dict[str, Any]:
    snap = ClusterSnapshot(NodeState(n, frozenset(range(n.gpu_count))) for n in nodes)
    engine = Engine(snap, "gputopo")
    placements: dict[str, dict[str, list[int]]] = {}
    inner = engine.place

    def place(request: PlacementRequest) -> Any:
        result = inner(request)
        if result.placed:
            placements[request.job] = {n: sorted(g) for n, g in result.allocation().items()}
        return result

    engine.place = place  # type: ignore[method-assign]
    model = JobTimeModel({n.name: n for n in nodes}, comm_share=dict.fromkeys(JobClass, 0.0))
    result = replay(jobs, engine, model, options=ReplayOptions(backfill=True, backfill_window=64))
    done = sorted((r for r in result.records if r.started), key=lambda r: (r.finish, r.order))
    return {
        "placements": placements,
        "order": [r.name for r in done],
        "waited": sum(1 for r in result.records if r.started and r.start > r.arrival),
    }


def test_simulator_and_real_binder_place_and_finish_the_same(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=2, nodes_per_leaf=3, gpus=8, prefix=kube_scope.name("s")
    )
    jobs = _trace(50)
    want = _simulate(nodes, jobs)
    assert want["waited"] >= 5  # the queue was exercised: the check has something to check
    ns = kube_scope.namespace
    name = kube_scope.name("sim")
    # One group at a time: the replay serves its queue first come, first served, while the
    # binder by default works on up to 16 groups at once, and two waiting gangs that race for
    # GPUs just freed may then be placed in either order.
    config = BinderConfig(
        scheduler_name=name,
        undo_grace_s=0,
        retry_unplaced_s=0.2,
        resync_s=0.5,
        parallel_groups=1,
    )
    by_name = {j.name: j for j in jobs}

    async def body() -> dict[str, Any]:
        async with binder_stack(kube_apiserver, nodes, config) as (kube, agg, b):
            return await drive(kube, agg, b)

    async def drive(kube: KubeClient, agg: Aggregator, b: Binder) -> dict[str, Any]:
        started: dict[str, float] = {}
        finished: list[str] = []
        placements: dict[str, dict[str, list[int]]] = {}
        reservations: dict[str, str] = {}
        pending = list(jobs)
        written: dict[str, int] = {}  # pod -> resource version of the driver's last write
        phased: set[str] = set()  # pods whose phase the fake kubelet set

        def wrote(pod: Mapping[str, Any]) -> None:
            meta = pod["metadata"]
            written[meta["name"]] = int(meta["resourceVersion"])

        async def binder_saw_every_write() -> bool:
            seen = {
                p["metadata"]["name"]: int(p["metadata"]["resourceVersion"])
                for p in b.pods.cache.values()
                if p["metadata"]["namespace"] == ns
            }
            return all(seen.get(pod, -1) >= rv for pod, rv in written.items())

        async def aggregator_saw_every_phase() -> bool:
            # Its watch holds bound pods only: every pod the fake kubelet moved is bound.
            assert agg.pods is not None
            cache = agg.pods.informer.cache
            return all(
                int(cache[key]["metadata"]["resourceVersion"]) >= written[pod]
                if (key := f"{ns}/{pod}") in cache
                else False
                for pod in phased
            )

        async def bound() -> dict[str, dict[str, list[int]]]:
            out: dict[str, dict[str, list[int]]] = {}
            counts: dict[str, int] = {}
            for pod in await pods_of(kube, ns):
                node = pod["spec"].get("nodeName")
                if not node:
                    continue
                job = pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"]
                ann = pod["metadata"]["annotations"]
                reservations[job] = ann["gputopo.io/reservation"]
                gpus = ann["gputopo.io/gpus"].split(",")
                out.setdefault(job, {}).setdefault(node, []).extend(int(g) for g in gpus)
                counts[job] = counts.get(job, 0) + 1
            return {
                j: {n: sorted(g) for n, g in a.items()}
                for j, a in out.items()
                if counts[j] == by_name[j].request.groups[0].pods
            }

        async def settle(now: float) -> None:
            """Wait until the binder has received every change made so far and acted on
            everything it can (its own signal, `Binder.idle`)."""
            await _eventually(binder_saw_every_write, "the binder's cache holds every write")
            # And the aggregator's: its pod watch decides what a finished pod still holds, and
            # lags the binder's under load (a gang placed next must see what the binder saw).
            await _eventually(
                aggregator_saw_every_phase, "the aggregator's watch holds every phase"
            )
            # 30 s: only a binder that never settles comes near it (it takes under 1 s)
            try:
                await asyncio.wait_for(b.idle(), timeout=30)
            except TimeoutError:
                raise AssertionError(
                    f"the binder did not go idle within 30 s at replay time {now:g}"
                    f" ({b.stats.groups_pending} groups waiting)"
                ) from None
            for job, alloc in (await bound()).items():
                if job not in started:
                    started[job] = now
                    placements[job] = alloc
                    for pod in range(by_name[job].request.groups[0].pods):
                        wrote(await _phase(kube, ns, f"{job}-{pod}", "Running"))
                        phased.add(f"{job}-{pod}")

        while pending or len(finished) < len(started):
            next_arrival = pending[0].arrival if pending else math.inf
            ends = [(started[j] + by_name[j].duration, j) for j in started if j not in finished]
            next_end = min(ends)[0] if ends else math.inf
            now = min(next_arrival, next_end)
            if math.isinf(now):
                break
            for end, job in sorted(ends):
                if end <= now:
                    for pod in range(by_name[job].request.groups[0].pods):
                        wrote(await _phase(kube, ns, f"{job}-{pod}", "Succeeded"))
                    finished.append(job)

                    async def released(rid: str = reservations[job]) -> bool:
                        return agg.state.reservation(rid) is None

                    await _eventually(released, f"the reservation of {job} released")
            if len(started) < len(jobs) - len(pending):
                # Jobs wait: let the binder retry them on the freed GPUs before new arrivals
                # compete (the replay's queue is first come, first served).
                await settle(now)
            while pending and pending[0].arrival <= now:
                job = pending.pop(0)
                group = job.request.groups[0]
                request = {
                    "groups": [
                        {
                            "name": "train",
                            "pods": group.pods,
                            "gpus_per_pod": group.gpus_per_pod,
                            "pattern": "all_reduce",
                        }
                    ]
                }
                await create(
                    kube, PODGROUPS.format(ns=ns), pod_group(ns, job.name, group.pods, request)
                )
                for pod in range(group.pods):
                    body = gpu_pod(
                        ns,
                        f"{job.name}-{pod}",
                        group.gpus_per_pod,
                        scheduler=name,
                        pod_group=job.name,
                    )
                    wrote(await create(kube, f"/api/v1/namespaces/{ns}/pods", body))
            await settle(now)
        return {"placements": placements, "order": finished}

    got = run(body(), timeout_s=280)
    assert got["placements"] == want["placements"]
    assert got["order"] == want["order"]


async def _phase(kube: Any, ns: str, pod: str, phase: str) -> dict[str, Any]:
    """The fake kubelet's one act: set a pod's phase; the pod as written."""
    return await kube.request(  # type: ignore[no-any-return]
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod}/status",
        body={"status": {"phase": phase}},
        content_type="application/strategic-merge-patch+json",
    )


async def _eventually(check: Any, what: str, timeout_s: float = 20.0) -> None:
    began = time.monotonic()
    while not await check():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(0.05)
