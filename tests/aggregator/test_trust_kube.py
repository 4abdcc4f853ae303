"""Nothing a client sends changes what gputopo believes unless that client may say it (issue 12),
on the real kube-apiserver with the real `gputopo exporter` command over mutual TLS.

The attack that started it: a process claiming to be node `n2` replaced that node's 8-GPU
NVSwitch topology with a 2-GPU workstation, and the aggregator relabelled the real Node. Here the
same reports come with a valid certificate of another node, with a certificate that names no
node, and in plain text: all are refused and counted, and n2's labels stay what n2's own
exporter says. Then a reservation made by one caller cannot be released by another, not even
after the aggregator restarts (the holder is stored with it).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from aggregator.server import KubeOptions
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from gputopo.runtime.tls import TlsFiles
from tests.aggregator.kubeutil import (
    aggregator,
    create_nodes,
    eventually,
    fast_publisher,
    install_crds,
    read_nodes,
    run,
)
from tests.exporter_process import start_exporter
from tests.harness.certs import TestCA
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

pytestmark = [pytest.mark.kube, pytest.mark.slow]

CRD = Path(__file__).parent.parent.parent / "deploy" / "aggregator" / "crd-gpureservations.yaml"
TP4 = request_from_mapping({"job": "tp4", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 4}]})


def _exporter(
    node: str, profile: str, port: int, tls: TlsFiles | None, log: Path
) -> subprocess.Popen[bytes]:
    return start_exporter(node, f"localhost:{port}", log, tls=tls, profile=profile)


def test_reports_for_another_node_and_a_strangers_release_are_refused(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    install_crds(kube_scope, str(CRD))
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "localhost")
    n1, n2 = kube_scope.name("n1"), kube_scope.name("n2")
    cert = {
        n1: ca.issue(tmp_path / "n1", f"system:node:{n1}"),
        n2: ca.issue(tmp_path / "n2", f"system:node:{n2}"),
        "anonymous": ca.issue(tmp_path / "anon", "exporter"),
        "team-a": ca.issue(tmp_path / "team-a", "team-a"),
        "team-b": ca.issue(tmp_path / "team-b", "team-b"),
    }
    options = KubeOptions(publisher=fast_publisher(), reservations_namespace=kube_scope.namespace)

    async def body() -> None:
        await create_nodes(kube_apiserver, [n1, n2])
        async with aggregator(kube_apiserver, options=options, tls=server) as agg:
            port = agg.grpc_port
            honest = [
                _exporter(n, "dgx-h100", port, cert[n], tmp_path / f"{n}.log") for n in (n1, n2)
            ]
            procs = list(honest)
            try:

                async def labelled() -> bool:
                    nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
                    return all(nodes[n].labels.get("gputopo.io/gpu-count") == "8" for n in (n1, n2))

                await eventually(labelled, timeout_s=120, what="both nodes labelled")
                assert agg.publisher is not None
                await agg.publisher.wait_idle(30)
                before = (await read_nodes(kube_apiserver, kube_scope.prefix))[n2].labels
                # The honest n2 goes quiet, so a forged report would have nobody to lose to.
                honest[1].terminate()
                honest[1].wait(timeout=30)
                forgers = {
                    "n1's certificate": cert[n1],
                    "a certificate without a node": cert["anonymous"],
                    "plain text": None,
                }
                denied = agg.reporter.stats.rejected
                start = denied["node_identity"]
                for i, tls in enumerate(forgers.values()):
                    log = tmp_path / f"forger-{i}.log"
                    procs.append(_exporter(n2, "workstation-2x-rtx5090", port, tls, log))

                async def refused() -> bool:
                    return denied["node_identity"] >= start + 2

                await eventually(refused, timeout_s=120, what="the forged reports refused")
                await asyncio.sleep(3)  # the forgers keep retrying meanwhile
                rec = agg.state.record(n2)
                assert rec is None or rec.topology.gpu_count == 8
                after = (await read_nodes(kube_apiserver, kube_scope.prefix))[n2].labels
                changed = {
                    k: (before.get(k), after.get(k))
                    for k in set(before) | set(after)
                    if before.get(k) != after.get(k) and k != "gputopo.io/stale"
                }
                assert changed == {}, changed
                assert all(p.poll() is None for p in procs[2:]), "forgers must be running, refused"
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(timeout=30)

            target = f"localhost:{port}"
            async with (
                grpcio.channel(target, tls=cert["team-a"]) as a,
                grpcio.channel(target, tls=cert["team-b"]) as b,
            ):
                answer = await PlacementClient(a).place(TP4)
                assert answer.reservation is not None
                rid = answer.reservation.id
                with pytest.raises(PlacementCallError) as err:
                    await PlacementClient(b).release(rid)
                assert err.value.status == "PERMISSION_DENIED"
        # A restart: the reservation and its holder come back from the API server.
        async with aggregator(kube_apiserver, options=options, tls=server) as again:
            await again.placement.ready.wait()
            held = again.state.reservation(rid)
            assert held is not None
            assert held.holder == "team-a"
            target = f"localhost:{again.grpc_port}"
            async with (
                grpcio.channel(target, tls=cert["team-a"]) as a,
                grpcio.channel(target, tls=cert["team-b"]) as b,
            ):
                with pytest.raises(PlacementCallError) as err:
                    await PlacementClient(b).release(rid)
                assert err.value.status == "PERMISSION_DENIED"
                assert await PlacementClient(a).release(rid) == 4

    run(body(), timeout_s=280)
