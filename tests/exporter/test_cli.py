"""`gputopo topo show/import` on the recordings, and `gputopo exporter` as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from google.protobuf import json_format

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.app.cli import main
from gputopo.codec import topology_from_proto
from gputopo.importers import import_topology
from gputopo.importers.topo_matrix import read_topo_matrix
from gputopo.machines import PROFILES, load_machine, load_profile, read_recording, recordings
from gputopo.v1 import topology_pb2 as tpb

NVSMI = [r for r in recordings() if r.startswith("nvsmi_topo_")]
COMPLETE_NVSMI = [r for r in NVSMI if "partial" not in r]
NCCL_XML = [r for r in recordings() if r.startswith("nccl_topo_")]  # vendor files and dumps
# What the profiles built on a recording say about devices it lists without a PCI class.
ASSUMED = {
    spec.recording.file: dict(spec.recording.assume_classes)
    for spec in map(load_profile, PROFILES)
    if spec.recording.assume_classes
}


def assume_class_flags(recording: str) -> list[str]:
    """`--assume-class BUSID=KIND` for each class the recording's profile assumes."""
    pairs = ASSUMED.get(recording, {}).items()
    return [word for busid, kind in pairs for word in ("--assume-class", f"{busid}={kind}")]


def gpu_cells(text: str) -> dict[tuple[str, str], str]:
    matrix = read_topo_matrix(text)
    return {
        (row, column): matrix.cell(row, column) or ""
        for row in matrix.gpu_columns
        for column in matrix.gpu_columns
    }


@pytest.mark.parametrize("recording", COMPLETE_NVSMI)
def test_topo_show_prints_the_recorded_code_for_every_gpu_pair(
    recording: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / recording
    path.write_text(read_recording(recording))
    assert main(["topo", "show", "--from", str(path)]) == 0
    shown = capsys.readouterr().out
    gpus = read_topo_matrix(read_recording(recording)).gpu_columns
    header = next(line for line in shown.splitlines() if not line.startswith("# NVLink "))
    assert header.split()[: len(gpus)] == list(gpus)
    first_matrix = shown.split("GB/s per direction")[0]
    want = gpu_cells(read_recording(recording))
    assert gpu_cells(first_matrix) == want
    assert "GB/s per direction" in shown  # the second matrix: bandwidth per pair


def test_a_bundled_recording_can_be_named_instead_of_a_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topo", "show", "--from", "nvsmi_topo_hgx_a100_sxm4_80gb_8nic_roce.txt"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^GPU0\s+X\s+NV12", out, re.MULTILINE)


@pytest.mark.parametrize("recording", NCCL_XML)
def test_topo_show_prints_an_nccl_xml_recording_as_a_matrix(
    recording: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["topo", "show", "--from", recording, *assume_class_flags(recording)])
    out = capsys.readouterr().out
    imported = import_topology(read_recording(recording), assume_classes=ASSUMED.get(recording))
    assert code == 0
    rows = [line for line in out.split("Legend:")[0].splitlines() if line.startswith("GPU")]
    assert imported.gpu_count > 0
    assert len(rows) == imported.gpu_count


def test_a_cut_recording_is_shown_flagged_partial_with_what_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["topo", "show", "--from", "nvsmi_topo_gb200_4gpu_grace_partial.txt"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "incomplete; the topology is partial" in err
    assert "Problems:" in out
    assert "GPU3-NIC1: unknown" in out


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("hello\n", "line 1: expected the header row", id="not a matrix"),
        pytest.param("<system><gpu/>", "not well-formed XML", id="truncated XML"),
        pytest.param(
            "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \nGPU2\tSYS\tSYS\n",
            "row label 'GPU2' is not one of the header's columns",
            id="a row for a GPU the header lacks",
        ),
    ],
)
def test_malformed_input_exits_2_with_one_line_and_no_traceback(
    text: str, want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "paste.txt"
    path.write_text(text)
    assert main(["topo", "show", "--from", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert want in err
    assert "Traceback" not in err


def test_a_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["topo", "import", str(tmp_path / "nope.txt"), "--json"]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("recording", [*NVSMI, *NCCL_XML])
def test_topo_import_json_is_the_imported_topology(
    recording: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = assume_class_flags(recording)
    assert main(["topo", "import", recording, "--json", "--node-name", "n1", *flags]) == 0
    data = json.loads(capsys.readouterr().out)
    message = json_format.ParseDict(data, tpb.NodeTopology())
    assert topology_from_proto(message) == import_topology(
        read_recording(recording), node_name="n1", assume_classes=ASSUMED.get(recording)
    )


def test_topo_show_of_this_gpu_less_machine_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show"]) == 1
    assert "libnvidia-ml.so.1 not found" in capsys.readouterr().err


def test_gputopo_exporter_runs_without_a_gpu_reports_and_stops_on_sigterm() -> None:
    """The command as a DaemonSet runs it: NODE_NAME from the environment, real /sys, no GPU."""

    async def scenario() -> None:
        aggregator = Aggregator(AggregatorConfig(heartbeat_interval_s=0.2))
        await aggregator.start()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gputopo",
            "exporter",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--probe-host",
            "127.0.0.1",
            "--probe-port",
            "0",
            "--insecure",
            stderr=subprocess.PIPE,
            env=os.environ
            | {"NODE_NAME": "cli-node", "GPUTOPO_AGGREGATOR": aggregator.grpc_target},
        )
        try:
            assert process.stderr is not None
            port = 0
            log = []
            async with asyncio.timeout(30):
                while not port:
                    line = (await process.stderr.readline()).decode()
                    assert line, f"exporter exited: {''.join(log)}"
                    log.append(line)
                    if found := re.search(r"metrics on [\d.]+:(\d+)", line):
                        port = int(found.group(1))
            metrics = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            )
            assert "gputopo_nvml_up 0.0" in metrics
            assert 'gputopo_exporter_info{node="cli-node"' in metrics
            for _ in range(100):
                if "cli-node" in aggregator.state.node_names:
                    break
                await asyncio.sleep(0.1)
            assert aggregator.state.snapshot().node("cli-node").topology.gpus == ()
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                rest = (await process.stderr.read()).decode()
                assert await process.wait() == 0
            log.append(rest)
            text = "".join(log)
            assert "NVML is not available" in text
            assert "libnvidia-ml.so.1 not found" in text
            assert "Traceback" not in text
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await aggregator.stop(grace_s=0)

    asyncio.run(scenario())


def test_gputopo_exporter_simulates_a_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter", "--simulate", "no-such-profile", "--node-name", "x"]) == 2
    assert "unknown machine profile" in capsys.readouterr().err


@pytest.mark.parametrize("profile", PROFILES)
def test_topo_show_takes_a_profile_name_as_gputopo_machines_prints_it(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topo", "show", "--from", profile]) == 0
    shown = capsys.readouterr().out
    gpus = read_topo_matrix(shown).gpu_columns
    assert len(gpus) == load_machine(profile, node_name="x").gpu_count


def test_a_source_that_is_nothing_known_lists_what_from_takes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topo", "show", "--from", "dgx-h200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputopo topo: cannot read dgx-h200: No such file or directory; it takes")
    assert all(name in err for name in (*PROFILES, *recordings()))
    assert "Traceback" not in err


def test_a_simulated_exporter_does_not_log_a_driver_that_reads_as_real() -> None:
    """`gputopo exporter --simulate` logs which fake machine answers, not the fake's driver."""
    args = [sys.executable, "-m", "gputopo", "exporter", "--simulate", "dgx-h100"]
    args += ["--node-name", "sim-0", "--http-host", "127.0.0.1", "--http-port", "0"]
    args += ["--probe-host", "127.0.0.1", "--probe-port", "0", "--no-peer-probes", "--insecure"]
    env = {k: v for k, v in os.environ.items() if k != "GPUTOPO_AGGREGATOR"}
    log: list[str] = []
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env) as process:
        try:
            assert process.stderr is not None
            for line in process.stderr:
                log.append(line)
                if "NVML" in line:
                    break
            process.send_signal(signal.SIGTERM)
            log.append(process.stderr.read())
            assert process.wait(timeout=15) == 0
        finally:
            if process.poll() is None:
                process.kill()
    text = "".join(log)
    assert "NVML simulated: fake machine dgx-h100 (no GPU, driver or CUDA is real)" in text
    assert "driver 550" not in text


def test_a_plain_exporter_loads_no_kubernetes_cryptography_or_numpy() -> None:
    """The RSS the exporter on every node saves (agent.py, deviceplugin.py, tls.py say why):
    run as deployed without `--device-plugin` and with `--insecure`, the process never imports
    the kubernetes client (~18 MiB) nor cryptography (~8 MiB), nor the placement engine and
    numpy (~13 MiB, `gputopo.codec` loads them on first use); `-X importtime` lists every
    module it imported."""
    args = [sys.executable, "-X", "importtime", "-m", "gputopo", "exporter"]
    args += ["--simulate", "dgx-h100", "--node-name", "sim-0", "--http-host", "127.0.0.1"]
    args += ["--http-port", "0", "--probe-host", "127.0.0.1", "--probe-port", "0"]
    args += ["--no-peer-probes", "--insecure"]
    env = {k: v for k, v in os.environ.items() if k != "GPUTOPO_AGGREGATOR"}
    imported: set[str] = set()
    serving = False
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env) as process:
        try:
            assert process.stderr is not None
            for line in process.stderr:
                if line.startswith("import time:"):
                    imported.add(line.rsplit("|", 1)[-1].strip())
                elif serving := "metrics on" in line:  # started up
                    break
            process.send_signal(signal.SIGTERM)
            process.stderr.read()
            assert process.wait(timeout=15) == 0
        finally:
            if process.poll() is None:
                process.kill()
    assert serving
    assert "exporter.agent" in imported  # the listing is whole
    heavy = {"kubernetes", "cryptography", "exporter.deviceplugin", "numpy", "gputopo.placement"}
    loaded = heavy & imported
    assert not loaded, f"imported: {sorted(loaded)}"
