"""Exporter, aggregator and scheduler over mutual TLS on loopback, beside a real API server.

The real `gputopo exporter` and `gputopo scheduler` commands run with the manifests' TLS flags
against an aggregator that requires client certificates; a pod is bound only through that
chain. A scheduler speaking plain text to the same aggregator binds nothing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.server import Aggregator, AggregatorConfig, KubeOptions
from gputopo.runtime.kube import KubeClient
from gputopo.runtime.tls import TlsFiles
from tests.aggregator.kubeutil import eventually, run
from tests.harness.certs import TestCA
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.kubeutil import create, gpu_pod, pods_of, ready_nodes

pytestmark = [pytest.mark.kube, pytest.mark.slow]


def _flags(tls: TlsFiles | None) -> list[str]:
    if tls is None:
        return ["--insecure"]
    return [f"--tls-cert={tls.cert}", f"--tls-key={tls.key}", f"--tls-ca={tls.ca}"]


def _gputopo(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gputopo", *args], stdout=out, stderr=subprocess.STDOUT
        )


def test_exporter_aggregator_and_scheduler_bind_a_pod_over_mutual_tls(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "localhost")
    node = kube_scope.name("tls")
    exporter_cert = ca.issue(tmp_path / "exporter", f"system:node:{node}")
    scheduler_cert = ca.issue(tmp_path / "scheduler", "gputopo-scheduler")
    ns = kube_scope.namespace
    secure, plain = kube_scope.name("mtls"), kube_scope.name("plain")

    async def body() -> None:
        await ready_nodes(kube_apiserver, [node])
        kube = KubeClient(kube_apiserver.api_client())
        agg = Aggregator(
            AggregatorConfig(
                heartbeat_interval_s=0.2,
                tls=server,
                require_node_identity=True,
                kube=KubeOptions(publish_labels=False),
            ),
            kube=kube,
        )
        await agg.start()
        target = f"localhost:{agg.grpc_port}"
        common = [f"--kubeconfig={kube_apiserver.kubeconfig_path}", f"--aggregator={target}"]
        procs = [
            _gputopo(
                "exporter",
                "--simulate=dgx-h100",
                f"--node-name={node}",
                f"--aggregator={target}",
                "--http-port=0",
                "--probe-port=0",
                "--no-peer-probes",
                *_flags(exporter_cert),
                log=tmp_path / "exporter.log",
            ),
            _gputopo(
                "scheduler",
                *common,
                f"--scheduler-name={secure}",
                "--no-leader-election",
                "--http-port=0",
                "--http-host=127.0.0.1",
                *_flags(scheduler_cert),
                log=tmp_path / "scheduler.log",
            ),
            _gputopo(
                "scheduler",
                *common,
                f"--scheduler-name={plain}",
                "--no-leader-election",
                "--http-port=0",
                "--http-host=127.0.0.1",
                *_flags(None),
                log=tmp_path / "plain-scheduler.log",
            ),
        ]
        try:

            async def known() -> bool:
                return agg.state.record(node) is not None

            await eventually(known, timeout_s=120, what="the exporter's node over mTLS")
            path = f"/api/v1/namespaces/{ns}/pods"
            await create(kube, path, gpu_pod(ns, "secure", 4, scheduler=secure))
            await create(kube, path, gpu_pod(ns, "plain", 4, scheduler=plain))

            async def secure_bound() -> bool:
                pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
                return pods["secure"]["spec"].get("nodeName") == node

            what = "the pod bound by the mTLS scheduler"
            await eventually(secure_bound, timeout_s=120, what=what)
            # The plain-text scheduler has had as long, and keeps retrying: it bound nothing.
            await asyncio.sleep(3)
            pods = {p["metadata"]["name"]: p for p in await pods_of(kube, ns)}
            assert not pods["plain"]["spec"].get("nodeName")
            assert procs[2].poll() is None, "the plain-text scheduler must be running, refused"
            assert pods["secure"]["metadata"]["annotations"]["gputopo.io/gpus"].count(",") == 3
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
            await agg.stop(grace_s=0.1)
            kube.close()

    run(body(), timeout_s=240)
