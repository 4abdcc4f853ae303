"""`gputopo aggregator` as users run it, and a cluster simulated from an inventory."""

from __future__ import annotations

import asyncio
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from aggregator.labels import Profile
from aggregator.server import Aggregator, AggregatorConfig
from exporter.simulate import SimulatedExporters
from gputopo.app.cli import main
from gputopo.app.commands.aggregator import LABEL_PROFILES
from gputopo.machines import load_machine
from gputopo.placement import place
from gputopo.request import request_from_mapping
from gputopo.topology import NodeTopology
from tests.aggregator.kubeutil import create_nodes, read_nodes, run
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

SMALL = Path(__file__).parent.parent / "data" / "inventory_small.yaml"


def test_an_inventory_alone_serves_a_simulated_cluster() -> None:
    async def body() -> None:
        agg = Aggregator(AggregatorConfig(inventory_path=str(SMALL), inventory_nodes=True))
        snap = agg.state.snapshot()
        assert len(snap.nodes) == 25
        assert all(n.placeable for n in snap.nodes.values())
        assert snap.node("h100-01").free == frozenset({4, 5, 6, 7})  # `used: [0-3]`
        assert 7 not in snap.node("a100-07").free
        assert snap.node("gb200-003").topology.fabric.accelerator_sub_domain == "nvl72-a.1"
        req = request_from_mapping(
            {
                "groups": [
                    {"name": "g", "pods": 18, "gpus_per_pod": 4, "scope": {"required": "nvlink"}}
                ]
            }
        )
        result, _ = place(snap, req)
        assert result.placed, result.reason
        assert {p.node for p in result.pods} == {f"gb200-{i:03}" for i in range(1, 19)}
        await agg.start()
        await agg.stop(grace_s=0.1)

    run(body())


def test_inventory_nodes_carry_gfd_labels_and_their_own_for_node_selectors() -> None:
    agg = Aggregator(AggregatorConfig(inventory_path=str(SMALL), inventory_nodes=True))
    snap = agg.state.snapshot()
    labels = snap.node("gb200-003").labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["topology.kubernetes.io/zone"] == "zone-2"  # the inventory's own, inherited
    req = request_from_mapping(
        {
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "groups": [{"name": "g", "gpus_per_pod": 8}],
        }
    )
    result, _ = place(snap, req)
    assert result.placed, result.reason
    assert result.pods[0].node.startswith("h100-")


def test_the_inventory_outranks_what_an_exporter_reports() -> None:
    (built,) = fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=1)
    node = replace(built, name="h100-02")  # the inventory puts h100-02 under leaf-1

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(inventory_path=str(SMALL), heartbeat_interval_s=0.2))
        await agg.start()
        try:
            async with SimulatedExporters([node], target=agg.grpc_target) as sim:
                await sim.wait_acked()
                rec = agg.state.record("h100-02")
                assert rec is not None
                assert rec.topology.fabric.tiers == ("leaf-1", "spine-1", "core")
                assert rec.resolution is not None
                assert rec.resolution.chosen["tiers"] == "inventory"
                assert [c.ignored_source for c in rec.resolution.conflicts] == ["exporter"]
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def test_the_command_prints_its_dry_run_patches_and_writes_nothing(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    topologies = fabric_cluster(
        spines=1, leaves_per_spine=1, nodes_per_leaf=2, prefix=kube_scope.name("g")
    )
    run(create_nodes(kube_apiserver, [t.name for t in topologies]))
    before = run(read_nodes(kube_apiserver, kube_scope.prefix))
    code = "import sys; from gputopo.app.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [
        sys.executable,
        "-c",
        code,
        "aggregator",
        "--insecure",
        "--grpc-port=0",
        "--http-port=0",
        f"--kubeconfig={kube_apiserver.kubeconfig_path}",
        "--dry-run",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    readers = [
        threading.Thread(target=lambda s=stream: [lines.put(x) for x in s], daemon=True)
        for stream in (proc.stdout, proc.stderr)
    ]
    for thread in readers:
        thread.start()
    try:
        seen: list[str] = []

        def wait_for(pattern: str) -> re.Match[str]:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for line in seen:
                    if match := re.search(pattern, line):
                        return match
                try:
                    seen.append(lines.get(timeout=0.5))
                except queue.Empty:
                    assert proc.poll() is None, "\n".join(seen)
            raise AssertionError(f"never printed {pattern!r}:\n" + "\n".join(seen))

        target = wait_for(r"aggregator: gRPC (\S+),").group(1)

        async def report() -> None:
            async with SimulatedExporters(
                topologies, target=target, heartbeat_interval_s=0.2
            ) as sim:
                await sim.wait_acked()
                await asyncio.to_thread(
                    wait_for, rf"{topologies[-1].name}: \+gputopo.io/gpu-count=8"
                )

        run(report())
        for topo in topologies:
            wait_for(rf"^{topo.name}: \+fabric.topograph.run/tier-0={topo.fabric.tiers[0]}$")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for thread in readers:
            thread.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    after = run(read_nodes(kube_apiserver, kube_scope.prefix))
    assert {n: o.resource_version for n, o in after.items()} == {
        n: o.resource_version for n, o in before.items()
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            [
                "aggregator",
                "--insecure",
                "--kubeconfig",
                "/nonexistent/kubeconfig",
                "--grpc-port=0",
            ],
            "cannot use kubeconfig /nonexistent/kubeconfig",
            id="a kubeconfig that is not there",
        ),
        pytest.param(
            ["demo", "--kubeconfig", "/nonexistent/kubeconfig"],
            "cannot use kubeconfig /nonexistent/kubeconfig",
            id="the demo with a kubeconfig that is not there",
        ),
        pytest.param(
            [
                "aggregator",
                "--insecure",
                "--inventory",
                "/nonexistent/inventory.yaml",
                "--grpc-port=0",
            ],
            "/nonexistent/inventory.yaml",
            id="an inventory that is not there",
        ),
    ],
)
def test_bad_input_is_a_message_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_export_reads_a_running_aggregator(capsys: pytest.CaptureFixture[str]) -> None:
    nodes = fabric_cluster(spines=1, leaves_per_spine=2, nodes_per_leaf=2, prefix="x")

    async def body() -> int:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.2))
        await agg.start()
        try:
            async with SimulatedExporters(nodes, target=agg.grpc_target) as sim:
                await sim.wait_acked()
                url = f"http://127.0.0.1:{agg.http_port}"
                return await asyncio.to_thread(main, ["export", "slurm", "--aggregator", url])
        finally:
            await agg.stop(grace_s=0.1)

    assert run(body()) == 0
    assert capsys.readouterr().out == (
        "# switch.3.1=core\n"
        "SwitchName=switch.3.1 Switches=switch.2.1\n"
        "# switch.2.1=spine-0\n"
        "SwitchName=switch.2.1 Switches=switch.1.[1-2]\n"
        "# switch.1.1=leaf-0-0\n"
        "SwitchName=switch.1.1 Nodes=x-00-[0-1]\n"
        "# switch.1.2=leaf-0-1\n"
        "SwitchName=switch.1.2 Nodes=x-01-[0-1]\n"
    )


def _export_from_aggregator(nodes: list[NodeTopology], *argv: str) -> int:
    """Run `gputopo export ARGV --aggregator 127.0.0.1:PORT` (no scheme) against an aggregator
    that has heard these nodes."""

    async def body() -> int:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.2))
        await agg.start()
        try:
            async with SimulatedExporters(nodes, target=agg.grpc_target) as sim:
                await sim.wait_acked()
                address = f"127.0.0.1:{agg.http_port}"
                return await asyncio.to_thread(main, ["export", *argv, "--aggregator", address])
        finally:
            await agg.stop(grace_s=0.1)

    return run(body())


def test_export_takes_an_aggregator_address_without_a_scheme(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nodes = fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, prefix="x")
    assert _export_from_aggregator(nodes, "slurm") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "SwitchName=switch.1.1 Nodes=x-00-[0-1]"


@pytest.mark.parametrize(
    ("argv", "want_reason"),
    [
        pytest.param(
            ["slurm", "--block"],
            "none of the 2 nodes of the aggregator at http://127.0.0.1:",
            id="slurm --block with no NVLink domain",
        ),
        pytest.param(
            ["kueue"],
            "has fabric tiers or an NVLink domain; give the aggregator an --inventory",
            id="kueue with no tiers",
        ),
        pytest.param(["kai"], "has fabric tiers or an NVLink domain", id="kai with no tiers"),
        pytest.param(["volcano"], "has fabric tiers; give the", id="volcano with no tiers"),
    ],
)
def test_an_export_with_nothing_to_write_is_an_error_with_the_reason(
    argv: list[str], want_reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [load_machine("dgx-h100", node_name=f"plain-{i}") for i in range(2)]
    assert not any(n.fabric.tiers or n.fabric.accelerator_domain for n in nodes)
    assert _export_from_aggregator(nodes, *argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"gputopo export {argv[0]}: nothing to write: " in err
    assert want_reason in err


def test_an_export_of_an_aggregator_with_no_node_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _export_from_aggregator([], "kueue") == 1
    assert "knows no nodes" in capsys.readouterr().err


def test_the_commands_offer_exactly_the_label_profiles_there_are() -> None:
    assert get_args(Profile) == LABEL_PROFILES


@pytest.mark.parametrize(
    ("options", "want_named"),
    [
        pytest.param(["--dry-run"], "--dry-run", id="--dry-run alone would print nothing"),
        pytest.param(
            ["--scheduler-objects", "kueue"],
            "--scheduler-objects",
            id="--scheduler-objects alone would write nothing",
        ),
        pytest.param(
            ["--leader-elect", "--dry-run"],
            "--dry-run, --leader-elect",
            id="--leader-elect alone would elect no one; every idle option is named",
        ),
    ],
)
def test_cluster_only_options_without_a_cluster_refuse_to_start(
    options: list[str], want_named: str
) -> None:
    code = "import sys; from gputopo.app.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [
        sys.executable,
        "-c",
        code,
        "aggregator",
        "--insecure",
        "--grpc-port=0",
        "--http-port=0",
        *options,
    ]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`gputopo aggregator {' '.join(options)}` started without a cluster")
    assert proc.returncode == 2
    assert f"{want_named} act only on a Kubernetes cluster" in proc.stderr
    assert "--kubeconfig PATH or --in-cluster" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flag", "protocol"),
    [
        pytest.param("--grpc-port", "gRPC", id="gRPC: no SO_REUSEPORT, so no second owner"),
        pytest.param("--http-port", "HTTP", id="HTTP: refused, and the gRPC side let go"),
    ],
)
def test_a_second_aggregator_on_a_taken_port_exits_with_one_line(
    flag: str, protocol: str, tmp_path: Path
) -> None:
    """Seen before: two aggregators on one gRPC port both started (gRPC sets SO_REUSEPORT by
    default) and the kernel split exporters and placement calls between two states."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = [sys.executable, "-m", "gputopo", "aggregator", "--insecure", "--grpc-port", "0"]
    base += ["--http-port", "0"]
    argv = [*base, flag, str(port)]  # the later flag wins: this one holds the port
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # until the first one listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        second = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    finally:
        first.terminate()
        first.wait(timeout=10)
    assert second.returncode == 2
    ours = [line for line in second.stderr.splitlines() if line.startswith("gputopo aggregator:")]
    assert ours == [ours[0]]
    assert f"cannot listen on 127.0.0.1:{port} for {protocol}" in ours[0]
    assert "Traceback" not in second.stderr
