"""LinkKind ordering and the one mapping from NVML levels and nvidia-smi codes."""

from __future__ import annotations

import pytest

from gputopo.links import LinkKind, link_code, link_kind_from_code, link_kind_from_nvml


def test_kinds_are_ordered_best_first() -> None:
    assert sorted(LinkKind) == [
        LinkKind.NVLINK,
        LinkKind.C2C,
        LinkKind.PIX,
        LinkKind.PXB,
        LinkKind.PHB,
        LinkKind.NODE,
        LinkKind.SYS,
        LinkKind.NET,
    ]
    assert min(LinkKind.SYS, LinkKind.PIX) is LinkKind.PIX


@pytest.mark.parametrize(
    ("level", "lanes", "want"),
    [
        pytest.param(0, 0, LinkKind.PIX, id="same board counts as a single PCIe switch"),
        pytest.param(10, 0, LinkKind.PIX, id="single switch is PIX"),
        pytest.param(20, 0, LinkKind.PXB, id="multiple switches is PXB"),
        pytest.param(30, 0, LinkKind.PHB, id="host bridge is PHB"),
        pytest.param(40, 0, LinkKind.NODE, id="NVML NODE (formerly CPU) is NODE"),
        pytest.param(50, 0, LinkKind.SYS, id="system is SYS"),
        pytest.param(50, 2, LinkKind.NVLINK, id="any NVLink wins over the PCIe path"),
        pytest.param(None, 0, LinkKind.SYS, id="a failed NVML call degrades to the worst class"),
        pytest.param(35, 0, LinkKind.PHB, id="an undefined level rounds down"),
    ],
)
def test_nvml_levels_map_onto_kinds(level: int | None, lanes: int, want: LinkKind) -> None:
    assert link_kind_from_nvml(common_ancestor_level=level, nvlink_lanes=lanes) is want


@pytest.mark.parametrize(
    ("code", "want"),
    [
        ("NV18", (LinkKind.NVLINK, 18)),
        ("nv1", (LinkKind.NVLINK, 1)),
        ("PIX", (LinkKind.PIX, 0)),
        ("PXB", (LinkKind.PXB, 0)),
        ("PHB", (LinkKind.PHB, 0)),
        ("NODE", (LinkKind.NODE, 0)),
        ("SYS", (LinkKind.SYS, 0)),
        ("SOC", (LinkKind.SYS, 0)),
        (" SYS ", (LinkKind.SYS, 0)),
    ],
)
def test_nvidia_smi_codes_parse(code: str, want: tuple[LinkKind, int]) -> None:
    assert link_kind_from_code(code) == want


@pytest.mark.parametrize("code", ["X", "NV", "NV0", "PCI", "", "NV-2"])
def test_unknown_codes_are_errors(code: str) -> None:
    with pytest.raises(ValueError, match="code"):
        link_kind_from_code(code)


def test_codes_round_trip() -> None:
    for kind in LinkKind:
        lanes = 12 if kind is LinkKind.NVLINK else 0
        assert link_kind_from_code(link_code(kind, lanes)) == (kind, lanes)
