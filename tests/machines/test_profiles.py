"""Fake machines: every profile builds a complete machine that matches the recording it cites."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import pytest
import yaml

from gputopo.importers import import_topology, parse_topo_matrix, render_topo_matrix
from gputopo.links import LinkKind
from gputopo.machines import (
    PROFILES,
    ProfileError,
    describe_profiles,
    gpu_uuid,
    load_machine,
    load_profile,
    read_recording,
    recordings,
    with_gpu_fabric,
)
from gputopo.machines.build import build_machine
from gputopo.machines.profile import MeasuredPairs, NvlinkPairs, NvSwitch, Override, parse_profile
from gputopo.topology import FabricState, NodeTopology, gpu, nic


def test_every_profile_file_is_listed_and_every_listed_profile_has_a_file() -> None:
    folder = resources.files("gputopo.machines").joinpath("profiles")
    files = {entry.name.removesuffix(".yaml") for entry in folder.iterdir()}
    assert files == set(PROFILES)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_builds_a_complete_healthy_machine(profile: str) -> None:
    machine = load_machine(profile, node_name="node-a")
    assert not machine.partial, machine.problems
    assert machine.problems == ()
    assert machine.profile == profile
    assert machine.machine
    assert all(g.name and g.memory_mib > 0 and g.numa_node is not None for g in machine.gpus)
    assert all(n.speed_mbps > 0 for n in machine.nics)
    assert all(lk.nominal_gbps > 0 for lk in machine.links)
    nvlinks = [lk for lk in machine.gpu_links() if lk.kind is LinkKind.NVLINK]
    assert all(lk.generation > 0 and lk.max_lanes == lk.lanes for lk in nvlinks)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_cited_recording_is_bundled(profile: str) -> None:
    spec = load_profile(profile)
    cited = {spec.recording.file} | {
        o.change.evidence
        for o in spec.overrides
        if isinstance(o.change, (NvSwitch, MeasuredPairs)) and o.change.evidence
    }
    assert cited <= set(recordings())


@pytest.mark.parametrize("profile", PROFILES)
def test_a_profile_keeps_every_path_its_recording_states(profile: str) -> None:
    """Overrides complete recordings; only NVLink overrides may replace a recorded GPU pair."""
    spec = load_profile(profile)
    rec = spec.recording
    recorded = import_topology(
        read_recording(rec.file),
        recording_format=rec.format,
        assume_classes=rec.assume_classes,
    )
    machine = load_machine(profile, node_name="n")
    adds_nvlink = any(isinstance(o.change, (NvSwitch, NvlinkPairs)) for o in spec.overrides)
    for link in recorded.links:
        if adds_nvlink and link.b.kind is link.a.kind:
            continue
        found = machine.link(link.a, link.b)
        assert found is not None
        assert found.code == link.code, f"{link.a}-{link.b}"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_prints_as_a_matrix_that_reads_back(profile: str) -> None:
    machine = load_machine(profile, node_name="n")
    again = parse_topo_matrix(render_topo_matrix(machine))
    assert [(lk.a, lk.b, lk.code) for lk in again.links] == [
        (lk.a, lk.b, lk.code) for lk in machine.links
    ]


@dataclass(frozen=True)
class MachineCase:
    profile: str
    want_gpus: int
    want_codes: dict[tuple[int, int], str]
    want_nearest_nics: tuple[tuple[int, ...], ...]
    want_gpu_numa: tuple[int, ...]
    want_pair_gbps: tuple[tuple[int, int], float]
    want_gpu0_nic0_gbps: float | None = None


MACHINE_CASES = [
    pytest.param(
        MachineCase(
            "dgx-h100",
            want_gpus=8,
            want_codes={(0, 1): "NV18", (3, 4): "NV18", (0, 7): "NV18"},
            want_nearest_nics=tuple((i,) for i in range(8)),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_pair_gbps=((0, 1), 450.0),
            want_gpu0_nic0_gbps=50.0,  # NDR 400 Gb/s on the GPU's own switch: line rate
        ),
        id="DGX H100: NV18 everywhere = 450 GB/s, each GPU with its own NDR NIC",
    ),
    pytest.param(
        MachineCase(
            "hgx-a100-roce",
            want_gpus=8,
            want_codes={(0, 1): "NV12", (0, 7): "NV12"},
            want_nearest_nics=((0, 1), (0, 1), (2, 3), (2, 3), (4, 5), (4, 5), (6, 7), (6, 7)),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_pair_gbps=((2, 5), 300.0),
            want_gpu0_nic0_gbps=12.5,  # PXB to a 100 Gb/s RoCE NIC
        ),
        id="HGX A100 RoCE: NV12 = 300 GB/s, two PXB NICs per GPU pair",
    ),
    pytest.param(
        MachineCase(
            "ndv4-a100",
            want_gpus=8,
            want_codes={(0, 1): "NV12", (1, 2): "NV12"},
            want_nearest_nics=((0, 1), (0, 1), (2, 3), (2, 3), (4, 5), (4, 5), (6, 7), (6, 7)),
            want_gpu_numa=(1, 1, 0, 0, 3, 3, 2, 2),
            want_pair_gbps=((0, 1), 300.0),
            want_gpu0_nic0_gbps=25.0,  # HDR 200 Gb/s
        ),
        id="Azure NDv4: NVSwitch NV12 over the XML's switches, 4 NUMA nodes",
    ),
    pytest.param(
        MachineCase(
            "p4d-a100",
            want_gpus=8,
            want_codes={(0, 1): "NV12", (0, 4): "NV12"},
            want_nearest_nics=((0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_pair_gbps=((0, 4), 300.0),
            want_gpu0_nic0_gbps=12.5,  # EFA 100 Gb/s
        ),
        id="AWS p4d: NV12, one EFA per pair of GPUs",
    ),
    pytest.param(
        MachineCase(
            "dgx1-v100",
            want_gpus=8,
            want_codes={(0, 1): "NV1", (0, 3): "NV2", (0, 5): "SYS", (4, 7): "NV2"},
            want_nearest_nics=((0,),) * 8,
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_pair_gbps=((0, 3), 50.0),  # 2 NVLink 2 lanes x 25 GB/s
        ),
        id="DGX-1 V100: hybrid cube mesh kept, NUMA from the CPU affinity groups",
    ),
    pytest.param(
        MachineCase(
            "h100-nv6-4x",
            want_gpus=4,
            want_codes={(0, 1): "NV6", (2, 3): "NV6"},
            want_nearest_nics=((0,), (1,), (2,), (3,)),
            want_gpu_numa=(3, 1, 7, 5),
            want_pair_gbps=((0, 1), 150.0),
            want_gpu0_nic0_gbps=50.0,
        ),
        id="4x H100 NV6: 150 GB/s pairs, each GPU with its own PIX NIC on its NUMA node",
    ),
    pytest.param(
        MachineCase(
            "gb200-tray",
            want_gpus=4,
            want_codes={(0, 1): "NV18", (0, 3): "NV18", (2, 3): "NV18"},
            want_nearest_nics=((0, 1, 2, 3, 4, 5),) * 4,
            want_gpu_numa=(0, 0, 1, 1),
            want_pair_gbps=((0, 3), 900.0),  # NVLink 5: 18 x 50 GB/s
        ),
        id="GB200 tray: GPU3 completed, NV18 at NVLink 5 = 900 GB/s, all NICs SYS",
    ),
    pytest.param(
        MachineCase(
            "workstation-2x-rtx5090",
            want_gpus=2,
            want_codes={(0, 1): "PHB"},
            want_nearest_nics=((), ()),
            want_gpu_numa=(0, 0),
            want_pair_gbps=((0, 1), 20.793),  # Gen4 x16 at 0.66 for PHB
        ),
        id="RTX 5090 workstation: PHB over a Gen4 host, no NIC",
    ),
    pytest.param(
        MachineCase(
            "g5-a10g-8x",
            want_gpus=8,
            want_codes={(0, 1): "PHB", (0, 4): "SYS"},
            want_nearest_nics=((0,),) * 8,
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_pair_gbps=((0, 4), 18.587),  # Gen4 x16 at 0.59 across sockets
        ),
        id="g5.48xlarge: PCIe only, the EFA on socket 1",
    ),
    pytest.param(
        MachineCase(
            "pcie-h100-nvlbridge-8x",
            want_gpus=8,
            want_codes={(0, 1): "NV12", (1, 2): "PHB", (6, 7): "NV12", (0, 4): "SYS"},
            want_nearest_nics=((0,),) * 8,
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_pair_gbps=((6, 7), 300.0),
        ),
        id="H100 NVL: bridged pairs NV12 on the g5 layout, PCIe Gen5 between pairs",
    ),
]


@pytest.mark.parametrize("case", MACHINE_CASES)
def test_a_profile_has_the_facts_of_its_machine(case: MachineCase) -> None:
    machine = load_machine(case.profile, node_name="n")
    (i, j), gbps = case.want_pair_gbps
    pair = machine.gpu_link(i, j)
    assert pair is not None
    assert machine.gpu_count == case.want_gpus
    assert {p: _code(machine, *p) for p in case.want_codes} == case.want_codes
    assert tuple(machine.nearest_nics(g.index) for g in machine.gpus) == case.want_nearest_nics
    assert tuple(g.numa_node for g in machine.gpus) == case.want_gpu_numa
    assert pair.nominal_gbps == pytest.approx(gbps, abs=0.01)
    if case.want_gpu0_nic0_gbps is not None:
        to_nic = machine.link(gpu(0), nic(0))
        assert to_nic is not None
        assert to_nic.nominal_gbps == pytest.approx(case.want_gpu0_nic0_gbps)


def _code(machine: NodeTopology, i: int, j: int) -> str:
    link = machine.gpu_link(i, j)
    return link.code if link is not None else "none"


def test_nvswitch_machines_count_the_switch_lanes_once_per_gpu() -> None:
    machine = load_machine("dgx-h100", node_name="n")
    assert {(g.nvlink_lanes, g.nvlink_max_lanes) for g in machine.gpus} == {(18, 18)}
    assert all(lk.via_switch for lk in machine.gpu_links())
    bridged = load_machine("pcie-h100-nvlbridge-8x", node_name="n")
    assert [g.nvlink_lanes for g in bridged.gpus] == [12] * 8
    assert not any(lk.via_switch for lk in bridged.gpu_links())


def test_the_bridged_pairs_carry_the_recorded_nccl_tests_result() -> None:
    machine = load_machine("pcie-h100-nvlbridge-8x", node_name="n")
    pair = machine.gpu_link(0, 1)
    assert pair is not None
    assert pair.measured is not None
    assert pair.measured.gbps == 116.26  # busbw at 4 GiB in the recording
    assert pair.bandwidth_gbps() == 116.26
    assert pair.nominal_gbps == 300.0
    assert "116.3*" in render_topo_matrix(machine)
    unbridged = machine.gpu_link(1, 2)
    assert unbridged is not None
    assert unbridged.measured is None


def test_two_nodes_of_one_profile_differ_only_in_name_and_gpu_uuids() -> None:
    a = load_machine("dgx-h100", node_name="rack1-node01")
    b = load_machine("dgx-h100", node_name="rack1-node02")
    assert a.name == "rack1-node01"
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)
    assert len({g.uuid for g in a.gpus}) == 8
    assert all(
        re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", g.uuid) for g in a.gpus
    )
    assert a.links == b.links
    assert [g.pci_bus_id for g in a.gpus] == [g.pci_bus_id for g in b.gpus]
    same = replace(b, name=a.name, gpus=tuple(replace(g, uuid="") for g in b.gpus))
    assert replace(a, gpus=tuple(replace(g, uuid="") for g in a.gpus)) == same


def test_a_node_gets_the_same_gpu_uuids_in_every_run() -> None:
    again = load_machine("dgx-h100", node_name="rack1-node01")
    assert again.gpus[3].uuid == gpu_uuid("rack1-node01", 3)
    assert load_machine("dgx-h100", node_name="rack1-node01") == again


def test_a_thousand_nodes_load_quickly(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    nodes = [load_machine("dgx-h100", node_name=f"node-{i:04d}") for i in range(1000)]
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n1000 dgx-h100 nodes loaded in {elapsed * 1000:.0f} ms")
    assert len({n.name for n in nodes}) == 1000
    assert len({g.uuid for n in nodes for g in n.gpus}) == 8000


def test_the_caller_sets_multi_node_nvlink_fabric_per_rack() -> None:
    tray = load_machine("gb200-tray", node_name="nvl72-r1-t01")
    assert all(g.fabric is None for g in tray.gpus)
    assert load_profile("gb200-tray").multi_node_nvlink
    racked = with_gpu_fabric(tray, cluster_uuid="7b968a6d-c8aa-45e1-9e07-e1e51be99c31", clique_id=1)
    fabric = racked.gpus[0].fabric
    assert fabric is not None
    assert fabric.usable
    assert fabric.state is FabricState.COMPLETED
    assert fabric.clique == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"
    assert racked.links == tray.links


def test_describe_profiles_lists_every_profile_with_its_assumptions() -> None:
    described = {d.name: d for d in describe_profiles()}
    assert tuple(described) == PROFILES
    assert described["dgx-h100"].gpu_count == 8
    assert described["gb200-tray"].multi_node_nvlink
    assert any("GPU3" in a for a in described["gb200-tray"].assumptions)
    assert any("0000:00:15.0" in a for a in described["g5-a10g-8x"].assumptions)
    assert all(d.line().startswith(d.name) for d in described.values())


def test_unknown_profile_and_recording_names_list_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: dgx-h100"):
        load_machine("dgx-h200", node_name="n")
    with pytest.raises(ValueError, match="no bundled recording"):
        read_recording("nope.txt")


# A profile whose claim and cited evidence disagree must not build.


def _with_override(profile: str, override: Override) -> NodeTopology:
    spec = load_profile(profile)
    return build_machine(replace(spec, overrides=(override,)), read_recording)


def test_a_profile_claiming_other_lanes_than_its_evidence_fails() -> None:
    wrong = Override(NvSwitch(12, "nvsmi_nvlink_R_hgx_h100_gpu0.txt", 0), why="test")
    with pytest.raises(ProfileError, match="GPU 0 should list 12 links, 18 links"):
        _with_override("dgx-h100", wrong)


def test_a_profile_whose_link_speed_disagrees_with_its_nvlink_generation_fails() -> None:
    spec = load_profile("ndv4-a100")
    nvlink5 = replace(spec, gpus=replace(spec.gpus, nvlink_generation=5))
    with pytest.raises(ProfileError, match=r"links run at \[25.0\] GB/s, but NVLink 5 is 50.0"):
        build_machine(nvlink5, read_recording)


def test_without_its_completion_the_gb200_tray_is_partial() -> None:
    spec = load_profile("gb200-tray")
    machine = build_machine(replace(spec, overrides=()), read_recording)
    assert machine.partial
    assert "GPU3: NUMA node unknown" in machine.problems
    assert "GPU3-NIC5: no link" in machine.problems


@pytest.mark.parametrize(
    ("edit", "want"),
    [
        pytest.param(
            lambda d: d["gpus"].update(memroy_mib=1),
            "profiles/x.yaml: gpus: unknown key 'memroy_mib'",
            id="a typo is an error, not a silently dropped fact",
        ),
        pytest.param(
            lambda d: d["overrides"][0].pop("why"),
            "profiles/x.yaml: overrides[0]: missing key 'why'",
            id="every override says why",
        ),
        pytest.param(
            lambda d: d["overrides"][0].update(fill_gpu_nic="SYS"),
            "profiles/x.yaml: overrides[0]: needs exactly one of",
            id="one change per override",
        ),
        pytest.param(
            lambda d: d["recording"].update(format="csv"),
            "profiles/x.yaml: recording: format 'csv' is not one of",
            id="only known recording formats",
        ),
        pytest.param(
            lambda d: d["gpus"].update(why="two\nlines"),
            "profiles/x.yaml: gpus: why must be one line of text",
            id="why is one line",
        ),
    ],
)
def test_an_invalid_profile_file_names_the_key(
    edit: Callable[[dict[str, Any]], object], want: str
) -> None:
    text = resources.files("gputopo.machines").joinpath("profiles", "dgx-h100.yaml").read_text()
    data = yaml.safe_load(text)
    edit(data)
    with pytest.raises(ProfileError) as raised:
        parse_profile("x", data)
    assert str(raised.value).startswith(want), str(raised.value)
