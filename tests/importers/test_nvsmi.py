"""`nvidia-smi topo -m`: recordings in, the same matrix out; broken pastes give clear errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.importers import TopologyImportError, parse_topo_matrix, render_topo_matrix
from gputopo.importers.nvsmi import TopoMatrix, on_nvswitch, read_topo_matrix
from gputopo.links import LinkKind
from gputopo.machines import read_recording
from gputopo.topology import Gpu, Link, Measurement, Nic, NodeTopology, gpu, nic

COMPLETE = (
    "nvsmi_topo_hgx_a100_sxm4_80gb_8nic_roce.txt",
    "nvsmi_topo_4x_h100_nv6_8numa.txt",
    "nvsmi_topo_dgx1_v100_sxm2_hybrid_cube_mesh.txt",
    "nvsmi_topo_workstation_2x_rtx5090_phb.txt",
)


def device_cells(matrix: TopoMatrix) -> dict[tuple[str, str], str]:
    """Every GPU-GPU and GPU-NIC cell (GPU rows and NIC rows), keyed by device names."""

    def name(column: str) -> str:
        return column if column.startswith("GPU") else matrix.nic_name(column) or column

    cells = {}
    for row in matrix.rows:
        for column, text in zip(matrix.columns, row.cells, strict=False):
            if row.label.startswith("GPU") or column.startswith("GPU"):
                cells[(name(row.label), name(column))] = text.strip().upper()
    return cells


@pytest.mark.parametrize("recording", COMPLETE)
def test_render_prints_the_recorded_code_for_every_gpu_and_nic_pair(recording: str) -> None:
    text = read_recording(recording)
    rendered = render_topo_matrix(parse_topo_matrix(text))
    recorded_cells = device_cells(read_topo_matrix(text))
    assert recorded_cells  # the comparison below must compare something
    assert device_cells(read_topo_matrix(rendered)) == recorded_cells


@pytest.mark.parametrize("recording", COMPLETE)
def test_a_complete_recording_is_not_partial_and_reads_back_equal(recording: str) -> None:
    topology = parse_topo_matrix(read_recording(recording), node_name="n")
    again = parse_topo_matrix(render_topo_matrix(topology), node_name="n")
    assert not topology.partial
    assert again.links == topology.links
    assert again.gpus == topology.gpus
    assert [n.name for n in again.nics] == [n.name for n in topology.nics]


@dataclass(frozen=True)
class RecordingCase:
    recording: str
    want_gpus: int
    want_nics: tuple[str, ...]
    want_pair_0_1: str
    want_nearest_nics_gpu0: tuple[int, ...]
    want_gpu_numa: tuple[int | None, ...]
    want_nic_numa: tuple[int | None, ...]
    want_nvswitch: bool
    want_gbps_0_1: float


RECORDING_CASES = [
    pytest.param(
        RecordingCase(
            "nvsmi_topo_hgx_a100_sxm4_80gb_8nic_roce.txt",
            want_gpus=8,
            want_nics=tuple(f"mlx5_{i}" for i in range(8)),
            want_pair_0_1="NV12",
            want_nearest_nics_gpu0=(0, 1),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_nic_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_nvswitch=True,
            want_gbps_0_1=300.0,  # 12 lanes x 25 GB/s, generation unknown -> NVLink 4 figures
        ),
        id="HGX A100: NV12 to 7 peers is 84 lanes, so NVSwitch; two PXB NICs per GPU pair",
    ),
    pytest.param(
        RecordingCase(
            "nvsmi_topo_4x_h100_nv6_8numa.txt",
            want_gpus=4,
            want_nics=("NIC0", "NIC1", "NIC2", "NIC3"),
            want_pair_0_1="NV6",
            want_nearest_nics_gpu0=(0,),
            want_gpu_numa=(3, 1, 7, 5),
            want_nic_numa=(3, 1, 7, 5),
            want_nvswitch=False,
            want_gbps_0_1=150.0,
        ),
        id="4x H100 NV6: 18 lanes fit one GPU; each NIC takes the NUMA node of its PIX GPU",
    ),
    pytest.param(
        RecordingCase(
            "nvsmi_topo_dgx1_v100_sxm2_hybrid_cube_mesh.txt",
            want_gpus=8,
            want_nics=("mlx5_0",),
            want_pair_0_1="NV1",
            want_nearest_nics_gpu0=(0,),
            want_gpu_numa=(None,) * 8,
            want_nic_numa=(None,),
            want_nvswitch=False,
            want_gbps_0_1=25.0,
        ),
        id="DGX-1 V100: old mlx5_0 column is NIC0 by name; no NUMA column, so NUMA unknown",
    ),
    pytest.param(
        RecordingCase(
            "nvsmi_topo_workstation_2x_rtx5090_phb.txt",
            want_gpus=2,
            want_nics=(),
            want_pair_0_1="PHB",
            want_nearest_nics_gpu0=(),
            want_gpu_numa=(0, 0),
            want_nic_numa=(),
            want_nvswitch=False,
            want_gbps_0_1=20.79,  # Gen4 x16 assumed, x0.66 for PHB
        ),
        id="RTX 5090 workstation: TAB paste with empty fields and a p2p block after the legend",
    ),
]


@pytest.mark.parametrize("case", RECORDING_CASES)
def test_a_recording_imports_the_facts_it_shows(case: RecordingCase) -> None:
    topology = parse_topo_matrix(read_recording(case.recording))
    link = topology.gpu_link(0, 1)
    assert link is not None
    assert topology.gpu_count == case.want_gpus
    assert tuple(n.name for n in topology.nics) == case.want_nics
    assert link.code == case.want_pair_0_1
    assert topology.nearest_nics(0) == case.want_nearest_nics_gpu0
    assert tuple(g.numa_node for g in topology.gpus) == case.want_gpu_numa
    assert tuple(n.numa_node for n in topology.nics) == case.want_nic_numa
    assert link.via_switch is (case.want_nvswitch and link.kind is LinkKind.NVLINK)
    assert link.nominal_gbps == pytest.approx(case.want_gbps_0_1, abs=0.01)


def test_nvswitch_inference_counts_a_gpus_lanes_over_all_its_peers() -> None:
    def nv(i: int, j: int, lanes: int) -> Link:
        return Link(gpu(i), gpu(j), LinkKind.NVLINK, lanes)

    # GPU0 has NV12 to two peers: 24 > 18 lanes, more than one GPU has.
    assert on_nvswitch([nv(0, 1, 12), nv(0, 2, 12)], 3) == frozenset({0})
    # A DGX-1 style mesh: 6 lanes per GPU in all.
    assert on_nvswitch([nv(0, 1, 2), nv(0, 2, 2), nv(0, 3, 2)], 4) == frozenset()
    # Exactly 18 may be direct.
    assert on_nvswitch([nv(0, 1, 6), nv(0, 2, 6), nv(0, 3, 6)], 4) == frozenset()


def test_space_and_tab_pastes_of_one_matrix_import_equal() -> None:
    spaced = read_recording("nvsmi_topo_workstation_2x_rtx5090_phb.txt").replace("\t", "    ")
    tabbed = read_recording("nvsmi_topo_workstation_2x_rtx5090_phb.txt")
    assert parse_topo_matrix(spaced) == parse_topo_matrix(tabbed)


UNDERLINE, RESET = "\x1b[4m", "\x1b[0m"
H100_VM = "nvsmi_topo_h100_80gb_hbm3_vm_1gpu_ansi.txt"
PLAIN_2GPU = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tPIX\t0-15\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tPIX\t0-15\t0\t\tN/A\n"
    "NIC0\tPIX\tPIX\t X \n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


@dataclass(frozen=True)
class EscapedCase:
    escaped: str
    want_same_as: str


ESCAPED_CASES = [
    pytest.param(
        EscapedCase(
            PLAIN_2GPU.replace("\tGPU0\tGPU1", f"\t{UNDERLINE}GPU0\tGPU1", 1).replace(
                "GPU NUMA ID\n", f"GPU NUMA ID{RESET}\n", 1
            ),
            want_same_as=PLAIN_2GPU,
        ),
        id="nvidia-smi 580 underlines the header row, even when it writes to a file",
    ),
    pytest.param(
        EscapedCase(
            PLAIN_2GPU.replace("NV18", "\x1b[1;32mNV18\x1b[m").replace(
                "GPU1\tNV18", f"{UNDERLINE}GPU1{RESET}\tNV18"
            ),
            want_same_as=PLAIN_2GPU,
        ),
        id="colour with parameters and escapes glued to a row label are styling too",
    ),
    pytest.param(
        EscapedCase(
            read_recording(H100_VM),
            # The bytes nvidia-smi wrapped the header in, removed by hand, not by the importer.
            want_same_as=read_recording(H100_VM).replace(UNDERLINE, "").replace(RESET, ""),
        ),
        id="the H100 VM recording as nvidia-smi 580 wrote it",
    ),
]


@pytest.mark.parametrize("case", ESCAPED_CASES)
def test_terminal_escapes_in_a_matrix_are_styling_and_import_as_the_plain_text(
    case: EscapedCase,
) -> None:
    assert "\x1b[" in case.escaped
    assert "\x1b" not in case.want_same_as
    assert parse_topo_matrix(case.escaped) == parse_topo_matrix(case.want_same_as)


def test_the_h100_vm_recording_is_one_gpu_on_numa_node_0_with_nothing_missing() -> None:
    topology = parse_topo_matrix(read_recording(H100_VM), node_name="vm")
    assert topology.gpus == (Gpu(index=0, numa_node=0, cpu_affinity="0-15"),)
    assert topology.nics == ()
    assert topology.links == ()
    assert [(n.id, n.cpus) for n in topology.numa_nodes] == [(0, "0-15")]
    assert not topology.partial
    assert topology.problems == ()


def test_a_gb200_paste_cut_inside_gpu3_gives_a_partial_machine_that_says_what_is_missing() -> None:
    topology = parse_topo_matrix(read_recording("nvsmi_topo_gb200_4gpu_grace_partial.txt"))
    assert topology.partial
    assert topology.gpu_count == 4
    assert len(topology.nics) == 6
    assert all(topology.gpu_link(i, 3) is not None for i in range(3))
    assert {lk.code for lk in topology.gpu_links()} == {"NV18"}
    assert topology.link(gpu(3), nic(0)) is not None  # the last cell before the cut
    assert [j for j in range(6) if topology.link(gpu(3), nic(j)) is None] == [1, 2, 3, 4, 5]
    assert [g.numa_node for g in topology.gpus] == [0, 0, 1, None]
    for j in range(1, 6):
        assert sum(p.startswith(f"GPU3-NIC{j}: unknown") for p in topology.problems) == 1
    assert any(p.startswith("GPU3: NUMA Affinity unknown") for p in topology.problems)
    assert any("no NIC Legend" in p for p in topology.problems)


@dataclass(frozen=True)
class PartialCase:
    text: str
    want_code_0_1: str | None
    want_problem: str


PARTIAL_CASES = [
    pytest.param(
        PartialCase(
            "\tGPU0\tGPU1\tGPU2\nGPU1\tNV4\t X\tNV4\nGPU2\tNV4\tNV4\t X\nGPU0\t X\tNV",
            want_code_0_1="NV4",
            want_problem=(
                "GPU0-GPU1: row GPU0 is cut inside this cell at line 4; used NV4 from row GPU1"
            ),
        ),
        id="a row cut mid-cell is mended from the mirror cell",
    ),
    pytest.param(
        PartialCase(
            "GPU0 GPU1 GPU2\nGPU0 X NV4 PIX\nGPU2 PIX NV4 X\n",
            want_code_0_1="NV4",
            want_problem="GPU1-GPU2: no GPU1 row; used NV4 from row GPU2",
        ),
        id="a missing row is filled from the other rows, and says so",
    ),
    pytest.param(
        PartialCase(
            "GPU0 GPU1\nGPU0 X N/A\nGPU1 N/A X\n",
            want_code_0_1=None,
            want_problem="GPU0-GPU1: unknown (row GPU0 reads N/A; row GPU1 reads N/A)",
        ),
        id="N/A on both sides leaves the pair unknown",
    ),
]


@pytest.mark.parametrize("case", PARTIAL_CASES)
def test_a_cut_or_holed_matrix_keeps_what_it_can_and_flags_the_rest(case: PartialCase) -> None:
    topology = parse_topo_matrix(case.text)
    link = topology.gpu_link(0, 1)
    assert topology.partial
    assert (link.code if link else None) == case.want_code_0_1
    assert any(p.startswith(case.want_problem) for p in topology.problems), topology.problems


@dataclass(frozen=True)
class MalformedCase:
    text: str
    want: str


MALFORMED_CASES = [
    pytest.param(MalformedCase("", "no `nvidia-smi topo -m` matrix found"), id="empty input"),
    pytest.param(
        MalformedCase("# source: a ticket\n\n", "no `nvidia-smi topo -m` matrix found"),
        id="only a source line",
    ),
    pytest.param(
        MalformedCase(
            "\tGPU0\tGPU1\tCPU Affinity\n", "line 1: the header names GPU0 ... GPU1 but no rows"
        ),
        id="header only",
    ),
    pytest.param(
        MalformedCase(
            "GPU0 GPU1\nGPU0 X NV\nGPU1 NV X\n",
            "line 2: unknown topology code 'NV' in column GPU1 of row GPU0",
        ),
        id="unknown code NV, a number short of NV12",
    ),
    pytest.param(
        MalformedCase(
            "GPU0 GPU1 GPU2\nGPU0 X PIX\nGPU1 PIX X PIX\nGPU2 PIX PIX X\n",
            "line 2: expected 3 cells after GPU0, found 2",
        ),
        id="non-square: a short row in the middle is no cut paste",
    ),
    pytest.param(
        MalformedCase(
            "GPU0 GPU1 NIC0\nGPU0 X PIX SYS 0-3 0\nGPU1 PIX X SYS\nNIC0 SYS SYS X\n",
            "line 2: expected at most 3 cells after GPU0, found 5",
        ),
        id="more cells than columns",
    ),
    pytest.param(
        MalformedCase(
            "\x00\x13\xff\xfe garbage \x7f\n\x01\x02",
            "line 1: expected the header row of `nvidia-smi topo -m`",
        ),
        id="binary junk",
    ),
    pytest.param(
        MalformedCase(
            "GPU0 GPU1\nGPU0 X PIX\nGPU7 PIX X\n",
            "line 3: row label 'GPU7' is not one of the header's columns (GPU0 ... GPU1)",
        ),
        id="a row for a GPU the header does not name",
    ),
    pytest.param(
        MalformedCase("GPU0 GPU1\nGPU0 PIX PIX\nGPU1 PIX X\n", "line 2: GPU0's own cell"),
        id="the diagonal must read X",
    ),
    pytest.param(
        MalformedCase("GPU0 GPU1\nGPU0 X X\nGPU1 X X\n", "line 2: X (self) in column GPU1"),
        id="X off the diagonal",
    ),
    pytest.param(
        MalformedCase(
            "GPU0 NIC0\nGPU0 X NV2\nNIC0 NV2 X\n", "line 2: NV2 is not a PCIe path class"
        ),
        id="NVLink to a NIC",
    ),
    pytest.param(
        MalformedCase("GPU0 GPU2\nGPU0 X PIX\n", "line 1: expected GPU1 in the header, found GPU2"),
        id="GPU columns out of order",
    ),
    pytest.param(
        MalformedCase("GPU0 GPU1\nGPU0 X PIX\nGPU0 X PIX\nGPU1 PIX X\n", "line 3: a second GPU0"),
        id="a row twice",
    ),
    pytest.param(
        MalformedCase(
            "GPU0 GPU1 GPU2\nGPU0 X", "line 2: the input ends before any GPU-GPU or GPU-NIC cell"
        ),
        id="a cut in the first row leaves nothing usable",
    ),
    pytest.param(
        MalformedCase(
            "# notes\n\x1b[4m GPU0 GPU1\x1b[0m\nGPU0 X NV\nGPU1 NV X\n",
            "line 3: unknown topology code 'NV' in column GPU1 of row GPU0",
        ),
        id="an underlined header does not shift the line an error names",
    ),
    pytest.param(
        MalformedCase(
            "\x1b[4m\x1b[0m\nGPU0 GPU1\n", "line 2: the header names GPU0 ... GPU1 but no rows"
        ),
        id="a line of escapes alone is a blank line",
    ),
]


@pytest.mark.parametrize("case", MALFORMED_CASES)
def test_malformed_input_gives_one_line_naming_where(case: MalformedCase) -> None:
    with pytest.raises(TopologyImportError) as raised:
        parse_topo_matrix(case.text)
    message = str(raised.value)
    assert message.startswith(case.want), message
    assert "\n" not in message
    assert isinstance(raised.value, ValueError)


def test_the_brief_example_error_reads_exactly() -> None:
    header = "        " + "".join(f"GPU{i}    " for i in range(8))
    rows = [
        f"GPU{i}    " + "    ".join("X" if j == i else "SYS" for j in range(8)) for i in range(8)
    ]
    rows[2] = "GPU2     SYS SYS X SYS SYS"
    with pytest.raises(TopologyImportError) as raised:
        parse_topo_matrix("\n".join(["# source: test", header, *rows]))
    assert str(raised.value) == "line 5: expected 8 cells after GPU2, found 5"
    assert raised.value.line == 5


def test_an_unknown_nic_legend_keeps_nic_names_and_says_so() -> None:
    topology = parse_topo_matrix("GPU0 NIC0\nGPU0 X PIX\nNIC0 PIX X\n")
    assert topology.nics[0].name == "NIC0"
    assert "no NIC Legend: names of NIC0 unknown, kept as printed" in topology.problems
    assert not topology.partial


@pytest.mark.parametrize("recording", COMPLETE)
def test_a_paste_that_stops_right_after_the_matrix_is_complete(recording: str) -> None:
    matrix_only = read_recording(recording).split("Legend:")[0].rstrip() + "\n"
    topology = parse_topo_matrix(matrix_only)
    assert not topology.partial, topology.problems
    assert topology.links == parse_topo_matrix(read_recording(recording)).links


def test_the_p2p_block_after_the_legend_is_ignored() -> None:
    text = read_recording("nvsmi_topo_workstation_2x_rtx5090_phb.txt")
    assert "GNS" in text
    assert parse_topo_matrix(text).problems == ()


def test_measured_bandwidth_is_printed_with_a_star_and_nominal_without() -> None:
    measured = Measurement(gbps=116.26, method="nccl-tests", measured_at=1000.0)
    topology = NodeTopology(
        name="n",
        gpus=(Gpu(0), Gpu(1), Gpu(2)),
        links=(
            Link(gpu(0), gpu(1), LinkKind.NVLINK, 12, nominal_gbps=300.0, measured=measured),
            Link(gpu(0), gpu(2), LinkKind.PHB, nominal_gbps=20.8),
            Link(gpu(1), gpu(2), LinkKind.PHB, nominal_gbps=20.8),
        ),
    )
    rendered = render_topo_matrix(topology)
    bandwidth = rendered.split("GB/s per direction")[1].splitlines()
    assert bandwidth[2].split() == ["GPU0", "X", "116.3*", "20.8"]
    assert "* = measured" in rendered
    # A measurement older than the age limit no longer counts.
    stale = render_topo_matrix(topology, now=1000.0 + 7 * 3600).split("GB/s per direction")[1]
    assert stale.splitlines()[2].split() == ["GPU0", "X", "300.0", "20.8"]


PCIE_CODES = ("PIX", "PXB", "PHB", "NODE", "SYS")


@st.composite
def topologies(draw: st.DrawFn) -> NodeTopology:
    """Any matrix nvidia-smi could print: GPU pairs NV1-NV18 or PCIe, NICs on PCIe paths."""
    gpu_count = draw(st.integers(1, 8))
    nic_count = draw(st.integers(0, 4))
    gpu_code = st.one_of(st.sampled_from(PCIE_CODES), st.integers(1, 18).map(lambda n: f"NV{n}"))
    links = []
    for i in range(gpu_count):
        for j in range(i + 1, gpu_count):
            code = draw(gpu_code)
            kind = LinkKind.NVLINK if code.startswith("NV") else LinkKind[code]
            lanes = int(code[2:]) if kind is LinkKind.NVLINK else 0
            links.append(Link(gpu(i), gpu(j), kind, lanes))
        for j in range(nic_count):
            links.append(Link(gpu(i), nic(j), LinkKind[draw(st.sampled_from(PCIE_CODES))]))
    affinity = st.sampled_from(["", "0-31,64-95", "6,14,22,30", "0-71"])
    gpus = tuple(
        Gpu(
            i,
            numa_node=draw(st.one_of(st.none(), st.integers(0, 7))),
            cpu_affinity=draw(affinity),
        )
        for i in range(gpu_count)
    )
    nics = tuple(Nic(j, name=f"mlx5_{draw(st.integers(0, 99))}_{j}") for j in range(nic_count))
    return NodeTopology(name="random", gpus=gpus, nics=nics, links=tuple(links))


@settings(max_examples=150, deadline=None)
@given(topologies())
def test_any_valid_matrix_round_trips_through_render_and_parse(topology: NodeTopology) -> None:
    again = parse_topo_matrix(render_topo_matrix(topology), node_name="random")

    def facts(t: NodeTopology) -> object:
        return (
            [(lk.a, lk.b, lk.code) for lk in t.links],
            [(g.numa_node, g.cpu_affinity) for g in t.gpus],
            [n.name for n in t.nics],
        )

    assert facts(again) == facts(topology)
    assert not again.partial
