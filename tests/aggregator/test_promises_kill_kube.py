"""kill -9 of the aggregator process in the middle of Place/Commit/Release: nothing is lost, no GPU
is handed out twice (real kube-apiserver, real `gputopo aggregator` processes).

A seeded random walk of 200 steps over a cluster served from an inventory: Place (reserve),
Commit, Release, and now and then SIGKILL of the process and a restart on the same port. The
test keeps its own ledger of what was answered and counts, over the whole walk:

- double-booked GPUs: a GPU an answer named while another live reservation held it;
- lost reservations: an id the aggregator answered (and that was not released) that a restarted
  aggregator does not know (Commit, Release or Explain says NOT_FOUND).

Both must be 0. The counts are printed as one JSON line. The walk's choices are seeded;
reservation ids are random, so the counts vary a little from run to run. Run without
`--reservations-namespace` (memory only), the same walk loses about half its reservations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import socket
import sys
from collections import Counter
from pathlib import Path

from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from tests.aggregator.kubeutil import install_crds, run
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

ROOT = Path(__file__).parent.parent.parent
CRD = ROOT / "deploy" / "aggregator" / "crd-gpureservations.yaml"
INVENTORY = ROOT / "tests" / "data" / "inventory_small.yaml"
STEPS = 200
SEED = 20261124


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Process:
    """One `gputopo aggregator` process at a time, on a fixed port."""

    def __init__(self, kube: KubeApiServer, namespace: str, log: Path) -> None:
        self.port = _free_port()
        self.argv = [
            sys.executable,
            "-m",
            "gputopo",
            "aggregator",
            "--grpc-port",
            str(self.port),
            "--kubeconfig",
            str(kube.kubeconfig_path),
            "--no-labels",
            "--inventory",
            str(INVENTORY),
            "--inventory-nodes",
            "--reservations-namespace",
            namespace,
            "--insecure",
        ]
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=out, stderr=asyncio.subprocess.STDOUT
            )
        self.starts += 1
        for _ in range(300):
            assert self.proc.returncode is None, f"aggregator exited: see {self.log}"
            try:
                async with grpcio.channel(self.target) as channel:
                    await asyncio.wait_for(channel.channel_ready(), 0.2)
                    return
            except TimeoutError:
                await asyncio.sleep(0.05)
        raise AssertionError(f"the aggregator did not come up: see {self.log}")

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def test_kill_9_loses_no_reservation_and_never_double_books(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, str(CRD))
    rng = random.Random(SEED)
    process = Process(kube_apiserver, kube_scope.namespace, tmp_path / "aggregator.log")
    ledger: dict[str, set[tuple[str, int]]] = {}
    # Lost ids: their callers still believe they hold these GPUs, so handing any out again
    # counts as double-booked too.
    orphans: dict[str, set[tuple[str, int]]] = {}
    counts: Counter[str] = Counter()

    async def known(client: PlacementClient, rid: str) -> bool:
        try:
            await client.explain(rid)
        except PlacementCallError as err:
            if err.status == "NOT_FOUND":
                return False
            raise
        return True

    async def step(client: PlacementClient) -> None:
        op = rng.choices(["place", "commit", "release"], weights=[5, 2, 2])[0]
        if op == "place" or not ledger:
            gpus = rng.choice([1, 2, 4, 8])
            request = request_from_mapping(
                {"job": "walk", "groups": [{"name": "g", "pods": 1, "gpus_per_pod": gpus}]}
            )
            answer = await client.place(request, ttl_s=3600)  # type: ignore[arg-type]
            if not answer.result.placed:
                counts["place_refused"] += 1
                return
            assert answer.reservation is not None
            held = {(n, g) for n, gs in answer.result.allocation().items() for g in gs}
            promised = [*ledger.values(), *orphans.values()]
            counts["double_booked"] += sum(len(held & other) for other in promised)
            ledger[answer.reservation.id] = held
            counts["placed"] += 1
            return
        rid = rng.choice(sorted(ledger))
        try:
            if op == "commit":
                await client.commit(rid, owner="walk")
                counts["committed"] += 1
            else:
                await client.release(rid)
                del ledger[rid]
                counts["released"] += 1
        except PlacementCallError as err:
            if err.status != "NOT_FOUND":
                raise
            counts["lost"] += 1
            orphans[rid] = ledger.pop(rid)

    async def walk() -> None:
        await process.start()
        try:
            done = 0
            while done < STEPS:
                async with grpcio.channel(process.target) as channel:
                    client = PlacementClient(channel)
                    for rid in sorted(ledger):  # after every (re)start: is every promise kept?
                        if not await known(client, rid):
                            counts["lost"] += 1
                            orphans[rid] = ledger.pop(rid)
                    run_for = rng.randint(5, 15)
                    for _ in range(min(run_for, STEPS - done)):
                        await step(client)
                        done += 1
                await process.kill()  # mid-walk, no warning, no graceful shutdown
                counts["kills"] += 1
                await process.start()
        finally:
            with contextlib.suppress(AssertionError, ProcessLookupError):
                await process.kill()

    run(walk(), timeout_s=600)
    report = {"steps": STEPS, "seed": SEED, "live_at_end": len(ledger), **counts}
    print(json.dumps(report, sort_keys=True))
    assert counts["kills"] >= 10
    assert counts["placed"] >= 50
    assert counts["double_booked"] == 0, report
    assert counts["lost"] == 0, report
