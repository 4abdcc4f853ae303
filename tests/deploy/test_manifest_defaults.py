"""The aggregator started with its Deployment's own arguments refuses plain-text clients.

Only what cannot run outside a cluster is changed: the Secret's mount point becomes a directory
of test certificates, the ports free ones, and the flags that need the API server
(`--in-cluster`, `--leader-elect`, `--reservations-namespace`, `--lease-name`) are dropped.
Everything else, TLS included, is exactly what the manifest says.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest

from gputopo.runtime import grpcio
from gputopo.runtime.tls import ssl_client_context
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc
from tests.aggregator.kubeutil import run
from tests.deploy.manifests import render
from tests.harness.certs import TestCA

CLUSTER_ONLY = ("--in-cluster", "--leader-elect", "--reservations-namespace", "--lease-name")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(tls_dir: Path, ports: dict[str, int]) -> list[str]:
    (deployment,) = [d for d in render("aggregator") if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    out = []
    for given in container["args"]:
        flag = given.split("=", 1)[0]
        if flag in CLUSTER_ONLY:
            continue
        arg = f"{flag}={ports[flag]}" if flag in ports else given
        out.append(arg.replace("/etc/gputopo/tls", str(tls_dir)).replace("0.0.0.0", "127.0.0.1"))
    return out


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gputopo", *args], stdout=out, stderr=subprocess.STDOUT
        )


def test_with_the_manifests_flags_plain_text_is_refused_and_mutual_tls_served(
    tmp_path: Path,
) -> None:
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "tls", "localhost")
    client = ca.issue(tmp_path / "client", "gputopo-scheduler")
    ports = {f: _free_port() for f in ("--grpc-port", "--http-port", "--health-port")}
    args = _args(server.cert.parent, ports)
    assert "--insecure" not in args
    assert any(a.startswith("--tls-cert=") for a in args)
    proc = _start(args, tmp_path / "aggregator.log")

    async def body() -> None:
        health = f"http://127.0.0.1:{ports['--health-port']}/healthz"
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(health) as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert proc.poll() is None, (tmp_path / "aggregator.log").read_text()
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the aggregator never answered its health port")
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{ports['--http-port']}/readyz"):
                    pass
            url = f"https://localhost:{ports['--http-port']}/readyz"
            async with session.get(url, ssl=ssl_client_context(client)) as resp:
                assert resp.status == 200
        request = ppb.GetTopologyRequest()
        async with grpcio.channel(f"127.0.0.1:{ports['--grpc-port']}") as plain:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pgrpc.PlacementStub(plain).GetTopology(request, timeout=5)
            assert err.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        target = f"localhost:{ports['--grpc-port']}"
        async with grpcio.channel(target, tls=client) as secure:
            await pgrpc.PlacementStub(secure).GetTopology(request, timeout=10)

    try:
        run(body(), timeout_s=120)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
