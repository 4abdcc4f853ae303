"""Kill -9 the binder at random points while it binds 50 gangs: after restarts, no gang stays
partly bound past the repair time and no GPU is booked twice.

The binder runs as the real `gputopo scheduler` process and is SIGKILLed after a random 0.8 to
2.5 s, again and again, so kills land between Place and the records, between records and
binds, between binds, and before Commit. The test plays the pods' controller: a pod an undo
deleted is created again. Counted at the end, after one last binder has run for the repair
time (reservation TTL + a few passes): partially bound gangs (some pods bound, some not), and
GPU indices recorded by two bound pods on one node.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.server import KubeOptions
from gputopo.runtime.kube import ConflictError, KubeClient
from tests.aggregator.kubeutil import (
    aggregator,
    eventually,
    exporters,
    install_crds,
    run,
)
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.kubeutil import PODGROUPS, create, gpu_pod, pod_group, pods_of, ready_nodes

pytestmark = [pytest.mark.slow]

GANGS = 50
PODS = 2  # per gang
GPUS = 2  # per pod
TTL_S = 10.0
REPAIR_S = TTL_S + 10.0
# A pause after each step (place, each record, each bind): a gang takes about 0.8 s, so most
# kills land inside one.
STEP_PAUSE_S = 0.15


# What the binder logs once it serves (scheduler/server.py), before it binds anything.
UP_LINE = "metrics and probes on"


def _binder(kube: KubeApiServer, target: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    args = [
        sys.executable,
        "-m",
        "gputopo",
        "scheduler",
        f"--kubeconfig={kube.kubeconfig_path}",
        f"--aggregator={target}",
        f"--scheduler-name={name}",
        "--no-leader-election",
        "--undo-grace=0",
        f"--reservation-ttl={TTL_S}",
        "--http-port=0",
        "--http-host=127.0.0.1",
        f"--step-pause={STEP_PAUSE_S}",
        "--insecure",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def _gang(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"])


def partial_gangs(pods: list[dict[str, Any]]) -> list[str]:
    """Gangs with some pods bound and some not."""
    bound: dict[str, list[bool]] = {}
    for pod in pods:
        bound.setdefault(_gang(pod), []).append(bool(pod["spec"].get("nodeName")))
    return sorted(g for g, b in bound.items() if any(b) and not all(b))


def double_booked(pods: list[dict[str, Any]], gpus_per_node: int) -> int:
    """GPUs that two bound pods on one node both recorded (or recorded past the node's count)."""
    seen: dict[str, list[int]] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            text = (pod["metadata"].get("annotations") or {}).get("gputopo.io/gpus", "")
            seen.setdefault(node, []).extend(int(g) for g in text.split(",") if g)
    clashes = 0
    for gpus in seen.values():
        clashes += len(gpus) - len(set(gpus)) + sum(1 for g in set(gpus) if g >= gpus_per_node)
    return clashes


def test_partial_gangs_and_double_booked_gpus_after_kill_9_over_50_gang_bindings(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    # 30 nodes x 8 GPUs = 240 GPUs for 50 x 2 x 2 = 200: room for reservations a kill left.
    nodes = fabric_cluster(
        spines=1, leaves_per_spine=3, nodes_per_leaf=10, gpus=8, prefix=kube_scope.name("k")
    )
    ns = kube_scope.namespace
    name = kube_scope.name("killed")
    rng = random.Random(int(os.environ.get("GPUTOPO_KILL_SEED", "11")))
    log = tmp_path / "binder.log"

    async def body() -> None:
        await ready_nodes(kube_apiserver, [n.name for n in nodes])
        kube = KubeClient(kube_apiserver.api_client(), workers=8)
        wanted = {
            f"g{i:02d}-{j}": gpu_pod(
                ns, f"g{i:02d}-{j}", GPUS, scheduler=name, pod_group=f"g{i:02d}"
            )
            for i in range(GANGS)
            for j in range(PODS)
        }

        async def controller() -> None:
            """Create again every pod that an undo deleted (what a Job or JobSet does)."""
            while True:
                have = {p["metadata"]["name"] for p in await pods_of(kube, ns)}
                for pod_name in sorted(created - have):
                    with contextlib.suppress(ConflictError):  # still terminating: next round
                        await create(kube, f"/api/v1/namespaces/{ns}/pods", wanted[pod_name])
                await asyncio.sleep(0.3)

        kills = 0
        created: set[str] = set()
        try:
            options = KubeOptions(publish_labels=False)
            async with aggregator(kube_apiserver, options=options) as agg, exporters(agg, nodes):

                async def submit() -> None:
                    """A gang every 0.4 s, so kills find the binder in the middle of its work."""
                    for i in range(GANGS):
                        gang = f"g{i:02d}"
                        await create(kube, PODGROUPS.format(ns=ns), pod_group(ns, gang, PODS))
                        for j in range(PODS):
                            body = wanted[f"{gang}-{j}"]
                            await create(kube, f"/api/v1/namespaces/{ns}/pods", body)
                            created.add(f"{gang}-{j}")
                        await asyncio.sleep(0.4)

                feeder = asyncio.create_task(submit())
                ctl = asyncio.create_task(controller())
                began = time.monotonic()
                try:
                    # Kill at random points until every gang has been bound once (or 150 s).
                    while time.monotonic() - began < 150:
                        up = log.read_text().count(UP_LINE) if log.exists() else 0
                        proc = _binder(kube_apiserver, agg.grpc_target, name, log)
                        # The random point counts from when this binder serves, not from its
                        # spawn: on a starved machine the start alone took longer than 2.5 s,
                        # so every kill landed before any binding ("no kill landed inside a
                        # gang"). Waiting for the line keeps the kills where they mean something
                        # whatever the machine's speed.
                        started = time.monotonic()
                        while log.read_text().count(UP_LINE) <= up and proc.poll() is None:
                            if time.monotonic() - started > 60:
                                break
                            await asyncio.sleep(0.1)
                        await asyncio.sleep(rng.uniform(0.8, 2.5))
                        proc.send_signal(signal.SIGKILL)
                        await asyncio.to_thread(proc.wait)
                        kills += 1
                        pods = await pods_of(kube, ns)
                        if sum(1 for p in pods if p["spec"].get("nodeName")) == GANGS * PODS:
                            break
                    # One last binder, left alone for the repair time.
                    proc = _binder(kube_apiserver, agg.grpc_target, name, log)
                    try:
                        deadline = time.monotonic() + REPAIR_S + 60
                        while time.monotonic() < deadline:
                            pods = await pods_of(kube, ns)
                            done = sum(1 for p in pods if p["spec"].get("nodeName"))
                            if done == GANGS * PODS:
                                break
                            await asyncio.sleep(0.5)
                        await asyncio.sleep(2.0)
                        pods = await pods_of(kube, ns)
                    finally:
                        proc.send_signal(signal.SIGKILL)
                        await asyncio.to_thread(proc.wait)
                finally:
                    ctl.cancel()
                    feeder.cancel()
                partial = partial_gangs(pods)
                clashes = double_booked(pods, 8)
                bound = sum(1 for p in pods if p["spec"].get("nodeName"))
                text = log.read_text()
                print(
                    f"carried_forward={text.count('carrying forward')}"
                    f" undone={text.count('undoing')}"
                    f" kills={kills} bound_pods={bound}/{GANGS * PODS} partial_gangs={len(partial)}"
                    f" double_booked_gpus={clashes} seconds={time.monotonic() - began:.1f}"
                )
                assert kills >= 5, "the binder was not killed often enough to mean anything"
                assert text.count("carrying forward") >= 3, "no kill landed inside a gang"
                assert partial == [], f"partial gangs past the repair time: {partial}"
                assert clashes == 0
                assert bound == GANGS * PODS, log.read_text()[-3000:]

                # The aggregator agrees, once the reservations that kills orphaned between Place
                # and the first record have expired: each bound GPU is held exactly once.
                async def held_once() -> bool:
                    free = sum(len(agg.state.free_gpus(n.name)) for n in nodes)
                    return free == 8 * len(nodes) - GANGS * PODS * GPUS

                await eventually(held_once, timeout_s=TTL_S + 10, what="orphans expired")
        finally:
            kube.close()

    run(body(), timeout_s=280)


def test_the_counters_see_a_partial_gang_and_a_double_booking() -> None:
    """The two counts the kill test relies on can fail."""

    def pod(gang: str, node: str, gpus: str) -> dict[str, Any]:
        return {
            "metadata": {
                "labels": {"scheduling.x-k8s.io/pod-group": gang},
                "annotations": {"gputopo.io/gpus": gpus},
            },
            "spec": {"nodeName": node},
        }

    pods = [pod("a", "n1", "0,1"), pod("a", "", ""), pod("b", "n1", "1,2"), pod("b", "n2", "0")]
    assert partial_gangs(pods) == ["a"]
    assert double_booked(pods, 8) == 1
    assert double_booked([pod("c", "n1", "8")], 8) == 1
