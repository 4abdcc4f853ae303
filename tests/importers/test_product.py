"""The NVLink generation of a `topo -m` recording, from the product its source line names."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gputopo.importers import import_topology, render_topo_matrix
from gputopo.importers.product import nvlink_generation_named, recording_notes
from gputopo.links import LinkKind
from gputopo.machines import read_recording

GB200 = "nvsmi_topo_gb200_4gpu_grace_partial.txt"


def test_the_bundled_gb200_recording_shows_nvlink_5_at_900_gbps_per_direction() -> None:
    topology = import_topology(read_recording(GB200), node_name="gb200")
    assert {g.nvlink_generation for g in topology.gpus} == {5}
    nvlinks = [link for link in topology.links if link.kind is LinkKind.NVLINK]
    assert len(nvlinks) == 6
    assert {(link.lanes, link.nominal_gbps) for link in nvlinks} == {(18, 900.0)}


@dataclass(frozen=True)
class Case:
    notes: str
    max_lanes: int
    want_generation: int


CASES = [
    pytest.param(
        Case("# machine: GB200 compute tray (4x NVIDIA GB200, 2x Grace, NV18)", 18, 5),
        id="a GB200 tray's NV18 is NVLink 5",
    ),
    pytest.param(Case("# 8x NVIDIA B200 on NVSwitch", 18, 5), id="B200 is NVLink 5"),
    pytest.param(Case("# 8x NVIDIA H100 80GB HBM3, NV18", 18, 4), id="H100 is NVLink 4"),
    pytest.param(Case("# GH200 superchip", 18, 4), id="Grace Hopper is NVLink 4, not 5"),
    pytest.param(Case("# 8x NVIDIA A100-SXM4-80GB NV12", 12, 3), id="A100 is NVLink 3"),
    pytest.param(Case("# 8x Tesla V100-SXM2-16GB", 2, 2), id="V100 is NVLink 2"),
    pytest.param(Case("# a machine", 18, 0), id="no product named: unknown"),
    pytest.param(Case("# H100 vs B200 comparison", 18, 0), id="two generations named: unknown"),
    pytest.param(Case("# 8x Tesla V100", 18, 0), id="more links than a V100 ever had: unknown"),
]


@pytest.mark.parametrize("case", CASES)
def test_the_generation_is_the_one_the_notes_name(case: Case) -> None:
    got = nvlink_generation_named(case.notes, max_lanes=case.max_lanes)
    assert got == case.want_generation


def test_only_the_leading_hash_lines_are_notes() -> None:
    text = "\ufeff# source: x (GB200)\n\n        GPU0\nGPU0     X \n# H100 later\n"
    assert recording_notes(text) == "# source: x (GB200)"


def test_nvlink_said_outright_wins_and_a_rendered_matrix_reads_back_with_it() -> None:
    assert nvlink_generation_named("# DGX-1 NVLink2 (V100)", max_lanes=2) == 2
    assert nvlink_generation_named("# NVLink 5 on an H100 box?", max_lanes=18) == 5
    topology = import_topology(read_recording(GB200), node_name="gb200")
    again = import_topology(render_topo_matrix(topology), node_name="gb200")
    assert render_topo_matrix(topology).startswith("# NVLink 5\n")
    assert again.gpus == topology.gpus
