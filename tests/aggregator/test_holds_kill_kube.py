"""Every source of "held" survives a start and a kill -9 in durable mode (issue 25).

With `--inventory-nodes` and `--reservations-namespace`, the restore at start released every
hold the API server did not return, the inventory's `used` GPUs included: 0 of 12 held after a
start, and placements handed them out. Here one real `gputopo aggregator` process serves the
inventory of `tests/data/inventory_small.yaml` against the real API server, with GPUs held four
ways:

- the inventory's `used` GPUs (h100-01 GPUs 0-3, a100-07 GPU 7);
- a pod bound to h100-02 asking for 2 GPUs (occupancy, from the pod watcher);
- a committed reservation and an uncommitted one (Place, stored as GpuReservations).

After the start and again after kill -9 and a restart, 1-GPU Places are taken until refused:
none may land on a held GPU, and exactly the rest must be handed out.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementClient
from tests.aggregator.kubeutil import install_crds, run
from tests.aggregator.test_promises_kill_kube import CRD, Process
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

ONE = request_from_mapping({"job": "grab", "groups": [{"name": "g", "gpus_per_pod": 1}]})
# 4 dgx-h100 (8 GPUs), 3 hgx-a100-roce (8), 18 gb200-tray (4): the inventory's GPUs
TOTAL = 4 * 8 + 3 * 8 + 18 * 4
USED = {("h100-01", g) for g in range(4)} | {("a100-07", 7)}
POD_GPUS = 2


def _pod(namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "someone-elses", "namespace": namespace},
        "spec": {
            "nodeName": "h100-02",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ],
        },
    }


async def _grab_all(client: PlacementClient) -> tuple[list[str], set[tuple[str, int]]]:
    """1-GPU reservations until refused: their ids and the GPUs they got."""
    ids: list[str] = []
    got: set[tuple[str, int]] = set()
    while len(ids) <= TOTAL:
        answer = await client.place(ONE, ttl_s=600)
        if not answer.result.placed:
            break
        assert answer.reservation is not None
        ids.append(answer.reservation.id)
        got |= {(n, g) for n, gs in answer.result.allocation().items() for g in gs}
    return ids, got


def test_every_hold_survives_a_start_and_a_kill_9(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, str(CRD))
    with kube_apiserver.json_session() as session:
        path = f"/api/v1/namespaces/{kube_scope.namespace}/pods"
        assert session.request("POST", path, body=_pod(kube_scope.namespace)).ok
    process = Process(kube_apiserver, kube_scope.namespace, tmp_path / "aggregator.log")

    async def go() -> None:
        await process.start()
        try:
            async with grpcio.channel(process.target) as channel:
                client = PlacementClient(channel)
                two = request_from_mapping(
                    {"job": "keep", "groups": [{"name": "g", "gpus_per_pod": 2}]}
                )
                committed = await client.place(two, ttl_s=600)
                assert committed.reservation is not None
                await client.commit(committed.reservation.id, owner="keep")
                reserved = await client.place(two, ttl_s=3600)
                assert reserved.reservation is not None
                placed = {
                    (n, g)
                    for a in (committed, reserved)
                    for n, gs in a.result.allocation().items()
                    for g in gs
                }
                assert not placed & USED
                free = TOTAL - len(USED) - POD_GPUS - len(placed)
                ids, got = await _grab_all(client)
                assert not got & (USED | placed), sorted(got & (USED | placed))
                assert len(got) == free, (len(got), free)
                h100_02 = sum(1 for n, _ in got | placed if n == "h100-02")
                assert h100_02 == 8 - POD_GPUS
                for rid in ids:
                    await client.release(rid)
            await process.kill()  # no warning, no graceful shutdown
            await process.start()
            async with grpcio.channel(process.target) as channel:
                client = PlacementClient(channel)
                ids, got = await _grab_all(client)
                assert not got & (USED | placed), sorted(got & (USED | placed))
                assert len(got) == free, (len(got), free)
                assert sum(1 for n, _ in got | placed if n == "h100-02") == 8 - POD_GPUS
        finally:
            with contextlib.suppress(AssertionError, ProcessLookupError):
                await process.kill()

    run(go(), timeout_s=240)


def test_without_a_durable_store_pods_and_the_inventory_hold_from_the_first_place(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    """Memory-only mode keeps no reservation across a restart (by design), but what pods and
    the inventory hold is held from the first Place on: nothing is handed out before the pod
    watcher's first list is in."""
    with kube_apiserver.json_session() as session:
        path = f"/api/v1/namespaces/{kube_scope.namespace}/pods"
        assert session.request("POST", path, body=_pod(kube_scope.namespace)).ok
    process = Process(kube_apiserver, kube_scope.namespace, tmp_path / "aggregator.log")
    at = process.argv.index("--reservations-namespace")
    del process.argv[at : at + 2]

    async def go() -> None:
        await process.start()
        try:
            async with grpcio.channel(process.target) as channel:
                _, got = await _grab_all(PlacementClient(channel))
            assert not got & USED
            assert len(got) == TOTAL - len(USED) - POD_GPUS
        finally:
            with contextlib.suppress(AssertionError, ProcessLookupError):
                await process.kill()

    run(go(), timeout_s=240)
