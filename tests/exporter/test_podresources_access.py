"""The exporter, as the DaemonSet runs it, can read the kubelet's PodResources socket.

The kubelet makes `/var/lib/kubelet/pod-resources` 0750 root:root. Here a real PodResources
server listens on a unix socket in such a directory, and the reader runs in a subprocess as the
user the manifest names (and, to show the test can fail, as the nobody user the exporter used to
run as). Needs root to make a root-owned directory and to switch users: elsewhere it is skipped,
and says why.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
import yaml

from exporter.agent import Agent, AgentConfig
from exporter.fake_machine import FakeMachine
from gputopo.gpu_use import GpuUse
from gputopo.v1 import podresources_pb2 as pb
from gputopo.v1 import podresources_pb2_grpc as pb_grpc

ROOT = Path(__file__).parents[2]
NOBODY = 65534

# Loads the code as root (the interpreter may live where others cannot read), then becomes the
# given user for good, reads the socket with the exporter's reader and prints what it learnt.
READER = """
import asyncio, json, os, sys
from exporter.fake_machine import FakeMachine
from exporter.podresources import PodResourcesReader
from pathlib import Path
topology = FakeMachine.from_profile("dgx-h100", node_name="n").topology
reader = PodResourcesReader(Path(sys.argv[1]), timeout_s=10)
uid = int(sys.argv[2])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
use = asyncio.run(reader.read(topology))
print(json.dumps({"reason": use.reason, "held": sorted(use.held)}))
"""


def manifest_user() -> int:
    ds = yaml.safe_load((ROOT / "deploy" / "exporter" / "daemonset.yaml").read_text())
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return int(container["securityContext"]["runAsUser"])


class Kubelet(pb_grpc.PodResourcesListerServicer):
    async def List(  # noqa: N802 - the kubelet's method name
        self, request: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        uuid = FakeMachine.from_profile("dgx-h100", node_name="n").topology.gpus[2].uuid
        devices = pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid])
        container = pb.ContainerResources(name="c", devices=[devices])
        return pb.ListPodResourcesResponse(
            pod_resources=[pb.PodResources(name="p", namespace="ns", containers=[container])]
        )


async def _read_as(uid: int, socket_path: Path) -> dict[str, object]:
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(Kubelet(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            READER,
            str(socket_path),
            str(uid),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        return dict(json.loads(out))
    finally:
        await server.stop(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a root-owned 0750 dir, setuid")
@pytest.mark.parametrize(
    ("who", "can_read"),
    [
        pytest.param("manifest", True, id="the manifest's user reads the socket"),
        pytest.param("nobody", False, id="nobody cannot, and the reading says why"),
    ],
)
def test_the_manifests_user_reads_a_socket_in_a_root_only_directory(
    who: str, can_read: bool
) -> None:
    uid = manifest_user() if who == "manifest" else NOBODY
    with tempfile.TemporaryDirectory(prefix="pr-") as base:
        os.chmod(base, 0o755)  # the host's /var/lib/kubelet: traversable
        directory = Path(base) / "pod-resources"
        directory.mkdir(mode=0o750)
        os.chown(directory, 0, 0)
        found = asyncio.run(asyncio.wait_for(_read_as(uid, directory / "kubelet.sock"), 60))
    if can_read:
        assert found == {"reason": "", "held": [2]}
    else:
        assert found["held"] == []
        assert "no permission" in str(found["reason"])
        assert "root" in str(found["reason"])


def test_readyz_and_a_metric_say_why_held_gpus_are_unknown() -> None:
    agent = Agent(AgentConfig(node_name="n", pod_resources_socket=Path("/nonexistent.sock")))
    assert agent._readyz().body["pod_resources"] == "not read yet"
    agent.gpu_use = GpuUse(reason="no permission to open /x (uid 65534): run as root")
    assert agent._readyz().body["pod_resources"].startswith("no permission")
    reason = {"reason": "no permission to open /x (uid 65534): run as root"}
    assert agent.registry.get_sample_value("gputopo_pod_resources_up", reason) == 0
    agent.gpu_use = GpuUse()
    assert agent._readyz().body["pod_resources"] == "ok"
    assert agent.registry.get_sample_value("gputopo_pod_resources_up", {"reason": ""}) == 1
