"""kill -9 of the leading aggregator: a Place succeeds within 10 s, every exporter reports again
within 15 s, with the shipped Lease flags (issue 25).

A follower used to lead 17 s after the leader died (a 15 s Lease, no flag), and real exporters
came back 36 s after the kill, their backoff grown to 30 s while no replica led. Here two real
`gputopo aggregator` processes run with the defaults the manifests ship (`--lease-duration 5
--renew-deadline 3 --retry-period 1`), three real `gputopo exporter` processes report through a
stand-in for the Service: a TCP proxy to the replica whose Pod carries the leader label, read
from the API server as kube-proxy's endpoints would be (no endpoint: connections are refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import grpc

from aggregator.server import LEADER_POD_LABEL
from gputopo.request import request_from_mapping
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc
from tests.aggregator.kubeutil import create_nodes, create_pods, run
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

ONE = request_from_mapping({"job": "after", "groups": [{"name": "g", "gpus_per_pod": 1}]})
EXPORTERS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Service:
    """The aggregator Service as exporters see it: connections go to the labelled leader."""

    def __init__(self, kube: KubeApiServer, namespace: str, ports: dict[str, int]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.ports = ports  # pod name -> its replica's gRPC port
        self.leader: str | None = None
        self.port = _free_port()

    async def follow(self) -> None:
        """Re-read which pod is labelled leader, as the endpoints controller would."""
        loop = asyncio.get_running_loop()
        while True:
            self.leader = await loop.run_in_executor(None, self._read_leader)
            await asyncio.sleep(0.2)

    def _read_leader(self) -> str | None:
        with self.kube.json_session() as session:
            path = f"/api/v1/namespaces/{self.namespace}/pods"
            pods = session.request("GET", path).body["items"]
        for pod in pods:
            if (pod["metadata"].get("labels") or {}).get(LEADER_POD_LABEL) == "leader":
                name = str(pod["metadata"]["name"])
                if name in self.ports:
                    return name
        return None

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._connect, "127.0.0.1", self.port)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        leader = self.leader
        try:
            if leader is None:
                return  # no endpoint
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.ports[leader])
        except OSError:
            writer.close()
            return
        finally:
            if leader is None:
                writer.close()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def _spawn(args: list[str], log: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gputopo", *args, stdout=out, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
        )  # fmt: skip


def test_after_kill_9_of_the_leader_place_and_reports_resume_quickly(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    ns = kube_scope.namespace
    pods = [kube_scope.name("agg-a"), kube_scope.name("agg-b")]
    nodes = [kube_scope.name(f"gpu{i}") for i in range(EXPORTERS)]
    create_pods(kube_apiserver, kube_scope, pods)
    ports = {pod: _free_port() for pod in pods}
    service = Service(kube_apiserver, ns, ports)

    async def go() -> None:
        await create_nodes(kube_apiserver, nodes)
        procs: dict[str, asyncio.subprocess.Process] = {}
        exporters: list[asyncio.subprocess.Process] = []
        follower = asyncio.create_task(service.follow())
        server = await service.serve()
        try:
            for pod in pods:  # the shipped Lease flags are the defaults
                procs[pod] = await _spawn(
                    [
                        "aggregator", "--grpc-port", str(ports[pod]),
                        "--kubeconfig", str(kube_apiserver.kubeconfig_path),
                        "--leader-elect", "--lease-name", kube_scope.name("lease"),
                        "--lease-namespace", ns, "--no-labels", "--insecure", "--http-port", "0",
                    ],
                    tmp_path / f"{pod}.log",
                    {"POD_NAME": pod, "POD_NAMESPACE": ns},
                )  # fmt: skip
            for node in nodes:
                exporters.append(
                    await _spawn(
                        [
                            "exporter", "--simulate=dgx-h100", f"--node-name={node}",
                            f"--aggregator=127.0.0.1:{service.port}", "--http-port=0",
                            "--probe-port=0", "--no-peer-probes", "--insecure",
                        ],
                        tmp_path / f"exporter-{node}.log",
                        {},
                    )
                )  # fmt: skip
            target = f"127.0.0.1:{service.port}"

            async def reported_since(since: float) -> set[str]:
                async with grpc.aio.insecure_channel(target) as channel:
                    stub = pgrpc.PlacementStub(channel)
                    resp = await stub.GetTopology(
                        ppb.GetTopologyRequest(nodes=nodes, include_links=False), timeout=2
                    )
                return {
                    n.topology.name
                    for n in resp.nodes
                    if not n.stale and n.last_report.ToNanoseconds() / 1e9 >= since
                }

            async def until(check: object, timeout_s: float, what: str) -> float:
                began = time.monotonic()
                while True:
                    with contextlib.suppress(grpc.aio.AioRpcError, PlacementCallError, OSError):
                        if await check():  # type: ignore[operator]
                            return time.monotonic() - began
                    if time.monotonic() - began > timeout_s:
                        raise AssertionError(f"not within {timeout_s} s: {what}")
                    await asyncio.sleep(0.1)

            async def placed() -> bool:
                async with grpc.aio.insecure_channel(target) as channel:
                    answer = await PlacementClient(channel).place(ONE, ttl_s=5)
                return answer.result.placed

            start = time.time()
            await until(lambda: _all(reported_since(start), nodes), 120, "every exporter reports")
            await until(placed, 30, "a first Place")
            leader = service.leader
            assert leader is not None
            procs[leader].send_signal(signal.SIGKILL)
            await procs[leader].wait()
            killed, killed_wall = time.monotonic(), time.time()
            # The acceptance figures. They are wall time by design, set by the flags
            # and not by this machine's speed: the Lease runs out 5 s after the last renewal,
            # the follower tries every 1 s, then labels its Pod; exporters retry within 3 s.
            # Measured with the machine at a load of 14 on 2 cores: 8.1 s and 9.0 s.
            took_place = await until(placed, 10, "a Place after the kill")
            await until(
                lambda: _all(reported_since(killed_wall), nodes),
                15 - (time.monotonic() - killed),
                "every exporter reports to the new leader",
            )
            took_reports = time.monotonic() - killed
            assert service.leader is not None
            assert service.leader != leader
            print(
                f"after kill -9: Place in {took_place:.1f} s, all reports in {took_reports:.1f} s"
            )
        finally:
            for proc in [*exporters, *procs.values()]:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                await proc.wait()
            follower.cancel()
            server.close()

    run(go(), timeout_s=300)


async def _all(found: object, want: list[str]) -> bool:
    return set(want) <= await found  # type: ignore[operator]
