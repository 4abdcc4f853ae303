"""The command line: discovery of subcommands, exit codes."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import json_format

from gputopo.app import commands
from gputopo.app.cli import main
from gputopo.codec import topology_from_proto
from gputopo.machines import PROFILES, load_profile
from gputopo.v1 import topology_pb2 as tpb


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("aggregator", "demo", "machines"):
        assert command in out


def test_help_lists_every_command_with_its_help_though_commands_load_lazily(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`main` loads only the command it runs (cli.py says why); help still loads them all."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # help wraps its lines
    names = [m.name for m in pkgutil.iter_modules(commands.__path__)]
    for name in names:
        module = importlib.import_module(f"{commands.__name__}.{name}")
        assert f"{name.replace('_', '-')} {' '.join(module.HELP.split())}" in out
    code = (
        "import sys; from gputopo.app.cli import _parser; _parser('machines'); "
        "print(sorted(m for m in sys.modules if m.startswith('gputopo.app.commands.')))"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "['gputopo.app.commands.machines']"


def test_machines_lists_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["machines"]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in PROFILES)


def test_machines_counts_one_nic_in_the_singular(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["machines"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert " 1 NIC " in lines["dgx1-v100"]
    assert " 8 NICs " in lines["dgx-h100"]
    assert "1 NICs" not in "".join(lines.values())


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@dataclass(frozen=True)
class ImportCase:
    recording: str
    want_gpu_numa: tuple[int | None, ...]
    want_numa_nodes: tuple[int, ...]
    want_nics: tuple[str, ...]


# Every topology-format recording of the H100 cloud VM (its `nvidia-smi -q` and sysfs listings
# are other formats), bundled byte for byte.
H100_VM_CASES = [
    pytest.param(
        ImportCase(
            "nvsmi_topo_h100_80gb_hbm3_vm_1gpu_ansi.txt",
            want_gpu_numa=(0,),
            want_numa_nodes=(0,),
            want_nics=(),
        ),
        id="topo -m with nvidia-smi 580's underlined header: one GPU on NUMA node 0",
    ),
    pytest.param(
        ImportCase(
            "nccl_topo_dump_h100_vm_1gpu_numa_minus1.xml",
            want_gpu_numa=(None,),
            want_numa_nodes=(),
            want_nics=("eth0",),
        ),
        id="NCCL 2.28 dump with numaid -1 and link_width 0: one GPU with no NUMA affinity",
    ),
]


@pytest.mark.parametrize("case", H100_VM_CASES)
def test_topo_import_json_takes_the_h100_vm_recordings_as_they_came(
    case: ImportCase, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["topo", "import", "--json", case.recording])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    data = json.loads(out)
    topology = topology_from_proto(json_format.ParseDict(data, tpb.NodeTopology()))
    assert topology.gpu_count == 1
    assert tuple(g.numa_node for g in topology.gpus) == case.want_gpu_numa
    # No NUMA affinity is no value at all in the JSON, not -1 and not 0.
    assert ("numa_node" in data["gpus"][0]) is (case.want_gpu_numa[0] is not None)
    assert tuple(n.id for n in topology.numa_nodes) == case.want_numa_nodes
    assert tuple(n.name for n in topology.nics) == case.want_nics
    assert not topology.partial
    assert topology.problems == ()


NIC_ONLY = (
    '<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0" class="0x020000" '
    'vendor="0x15b3"><nic><net name="eth0" dev="0" speed="100000"/></nic></pci></cpu></system>'
)


@dataclass(frozen=True)
class NoGpuCase:
    source: str  # a bundled recording's name, or the text to write to a file
    want_reason: str
    want_remedy: bool


NO_GPU_CASES = [
    pytest.param(
        NoGpuCase(
            "nccl_topo_xml_aws_g5.48xl.xml",
            want_reason="no GPU: 9 PCI device(s) have no class, so none can be taken for a GPU",
            want_remedy=True,
        ),
        id="AWS g5 file without classes: says so and prints the command with --assume-class",
    ),
    pytest.param(
        NoGpuCase(NIC_ONLY, want_reason="no GPU: the recording lists none", want_remedy=False),
        id="a dump of a machine with a NIC and no GPU: nothing to suggest",
    ),
]


ACTIONS = [pytest.param("import", id="topo import"), pytest.param("show", id="topo show")]


def recording_argv(action: str, case: NoGpuCase, tmp_path: Path) -> tuple[list[str], str]:
    """`topo import FILE --json` or `topo show --from FILE`, and FILE: a bundled name or a file
    holding the case's text."""
    source = case.source
    if source.startswith("<"):
        path = tmp_path / "dump.xml"
        path.write_text(source)
        source = str(path)
    if action == "import":
        return ["topo", "import", source, "--json"], source
    return ["topo", "show", "--from", source], source


def options_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The long options `gputopo ARGV --help` lists."""
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("case", NO_GPU_CASES)
def test_a_recording_with_no_gpu_exits_1_with_the_reason(
    action: str, case: NoGpuCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, source = recording_argv(action, case, tmp_path)
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"gputopo topo: {source}: {case.want_reason}" in err.splitlines()
    assert ("--assume-class" in err) is case.want_remedy
    assert "Traceback" not in err


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("case", NO_GPU_CASES)
def test_every_option_a_no_gpu_refusal_names_is_one_its_command_has(
    action: str, case: NoGpuCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, _ = recording_argv(action, case, tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", err))
    assert bool(named) is case.want_remedy
    assert named <= options_of(["topo", action], capsys)
    suggested = [line.split() for line in err.splitlines() if line[:1] == " "]
    assert all(words[:3] == ["gputopo", "topo", action] for words in suggested)


def test_the_command_a_g5_refusal_prints_runs_and_edited_as_it_says_gives_the_g5_machine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topo", "import", "nccl_topo_xml_aws_g5.48xl.xml", "--json"]) == 1
    # The command is the indented line; the others start with "gputopo topo:".
    printed = [line.strip() for line in capsys.readouterr().err.splitlines() if line[:1] == " "]
    assert len(printed) == 1
    words = shlex.split(printed[0])
    assert words[:4] == ["gputopo", "topo", "import", "nccl_topo_xml_aws_g5.48xl.xml"]

    assert main(words[1:]) == 0  # as printed: every device without a class taken for a GPU
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 9

    # Edited as it says ("make the NICs =nic"), with what the g5 profile knows: 0000:00:15.0 is
    # the EFA.
    classes = load_profile("g5-a10g-8x").recording.assume_classes
    nics = {busid for busid, kind in classes.items() if kind == "nic"}
    edited = [f"{w.split('=')[0]}=nic" if w.split("=")[0] in nics else w for w in words]
    assert edited != words
    assert main(edited[1:]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert (len(data["gpus"]), [n["pci_bus_id"] for n in data["nics"]]) == (8, sorted(nics))
    assert err == ""
