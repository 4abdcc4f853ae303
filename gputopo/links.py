"""Link kinds, ordered best to worst, and the one mapping from NVML and nvidia-smi onto them.

Every part of gputopo that reasons about "how well are these two devices connected" speaks
`LinkKind`. The enum is ordered: a smaller value is a better path, so `min()` over kinds picks the
best path and sorting by kind sorts best first. NVML reports NVLink and the PCIe common ancestor
through two different calls (an NVLink count per pair, and `nvmlDeviceGetTopologyCommonAncestor`
levels); nvidia-smi's `topo -m` prints the same facts as codes. `link_kind_from_nvml` and
`link_kind_from_code` are the only translations from those worlds into ours.
"""

from __future__ import annotations

import enum
import re

__all__ = [
    "NVML_TOPOLOGY_LEVELS",
    "LinkHealth",
    "LinkKind",
    "link_code",
    "link_kind_from_code",
    "link_kind_from_nvml",
]


class LinkKind(enum.IntEnum):
    """How two devices are connected, best first.

    NVLINK covers direct NVLink and NVLink through NVSwitch (the `Link` carries lanes, generation
    and whether a switch is in the path). C2C is Grace-Hopper/Blackwell chip-to-chip. PIX..SYS are
    nvidia-smi's PCIe path classes. NET is a path that leaves the machine (InfiniBand, RoCE,
    Ethernet), used only between nodes.
    """

    NVLINK = 1
    C2C = 2
    PIX = 3
    PXB = 4
    PHB = 5
    NODE = 6
    SYS = 7
    NET = 8

    @property
    def is_pcie(self) -> bool:
        """True for the PCIe path classes, whose bandwidth is bounded by a PCIe link."""
        return LinkKind.PIX <= self <= LinkKind.SYS


class LinkHealth(enum.IntEnum):
    """Health of a link; anything but OK lowers its effective bandwidth or removes it."""

    OK = 1
    DEGRADED = 2
    DOWN = 3


# NVML_TOPOLOGY_* levels from nvml.h / pynvml (INTERNAL=0 ... SYSTEM=50). NVML has no NVLink level:
# NVLink is found per link with nvmlDeviceGetNvLinkRemotePciInfo/RemoteDeviceType.
NVML_TOPOLOGY_LEVELS: dict[int, LinkKind] = {
    # Two GPUs on one board (K80/M60-style dual-GPU cards) share an on-board PCIe switch; nvidia-smi
    # prints PIX for them, so they count as the best PCIe class.
    0: LinkKind.PIX,
    10: LinkKind.PIX,
    20: LinkKind.PXB,
    30: LinkKind.PHB,
    40: LinkKind.NODE,
    50: LinkKind.SYS,
}

_PCIE_CODES: dict[str, LinkKind] = {
    "PIX": LinkKind.PIX,
    "PXB": LinkKind.PXB,
    "PHB": LinkKind.PHB,
    "NODE": LinkKind.NODE,
    "SOC": LinkKind.SYS,  # drivers before R384 printed SOC for what is now SYS
    "SYS": LinkKind.SYS,
    "C2C": LinkKind.C2C,
    "NET": LinkKind.NET,
}
_NV_CODE = re.compile(r"^NV(\d+)$")


def link_kind_from_nvml(*, common_ancestor_level: int | None, nvlink_lanes: int) -> LinkKind:
    """Map what NVML says about a GPU pair onto a `LinkKind`.

    Any active NVLink between the pair (direct, or both GPUs on one NVSwitch fabric) wins over the
    PCIe path, exactly as nvidia-smi prints `NV#` instead of the PCIe class. An unknown level
    (the call failed) degrades to SYS, the most pessimistic PCIe class, rather than failing.
    """
    if nvlink_lanes > 0:
        return LinkKind.NVLINK
    if common_ancestor_level is None:
        return LinkKind.SYS
    try:
        return NVML_TOPOLOGY_LEVELS[common_ancestor_level]
    except KeyError:
        # Levels between the defined ones do not occur; round down to the next defined level.
        known = [lvl for lvl in NVML_TOPOLOGY_LEVELS if lvl <= common_ancestor_level]
        return NVML_TOPOLOGY_LEVELS[max(known)] if known else LinkKind.PIX


def link_kind_from_code(code: str) -> tuple[LinkKind, int]:
    """Parse an nvidia-smi `topo -m` cell into (kind, NVLink lanes).

    Raises ValueError for `X` (self) and for anything that is not a known code, so a parser can
    report the exact cell it could not read.
    """
    text = code.strip().upper()
    match = _NV_CODE.match(text)
    if match:
        lanes = int(match.group(1))
        if lanes <= 0:
            raise ValueError(f"NVLink code with no lanes: {code!r}")
        return LinkKind.NVLINK, lanes
    try:
        return _PCIE_CODES[text], 0
    except KeyError:
        raise ValueError(f"unknown topology code {code!r}") from None


def link_code(kind: LinkKind, lanes: int = 0) -> str:
    """The nvidia-smi code for a link: `NV<lanes>` for NVLink, else the PCIe class name."""
    if kind is LinkKind.NVLINK:
        return f"NV{lanes}"
    return kind.name
