"""Facts read from the recordings that back profile overrides rather than topologies.

A profile that says "18 NVLinks per GPU" should be checked against the recording it cites, not
trusted. These readers pull the few numbers the profiles rely on out of `nvidia-smi nvlink -s`
/ `nvlink -R` output and an nccl-tests table, so a profile whose claim and evidence disagree
fails to load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["AllReduceResult", "NvlinkStatus", "read_allreduce", "read_nvlink_status"]

_GPU_LINE = re.compile(r"^GPU (\d+):")
_LINK_LINE = re.compile(r"^Link (\d+):\s*(.*)$")
_REMOTE = re.compile(r"Remote Device ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-7])")
_SPEED = re.compile(r"^([\d.]+) GB/s")
# nccl-tests: size count type redop root time algbw busbw #wrong (out-of-place), then in-place.
_RESULT_ROW = re.compile(
    r"^\s*(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+"
)


@dataclass(frozen=True, slots=True)
class NvlinkStatus:
    """One GPU's NVLinks as `nvidia-smi nvlink -s` or `-R` lists them."""

    gpu: int
    links: int
    remotes: frozenset[str] = frozenset()
    gbps_per_link: tuple[float, ...] = ()


def read_nvlink_status(text: str) -> dict[int, NvlinkStatus]:
    """Per GPU index: how many links are listed, their remote devices (`-R`) and speeds (`-s`).

    A GPU whose block was cut short by the recording simply has fewer links; callers cite the
    GPU the recording has in full.
    """
    found: dict[int, NvlinkStatus] = {}
    current: int | None = None
    links: dict[int, str] = {}

    def close() -> None:
        if current is None:
            return
        remotes = frozenset(m.group(1).upper() for t in links.values() if (m := _REMOTE.search(t)))
        speeds = tuple(float(m.group(1)) for t in links.values() if (m := _SPEED.match(t)))
        found[current] = NvlinkStatus(current, len(links), remotes, speeds)

    for raw in text.splitlines():
        line = raw.strip()
        gpu_match = _GPU_LINE.match(line)
        if gpu_match:
            close()
            current, links = int(gpu_match.group(1)), {}
            continue
        link_match = _LINK_LINE.match(line)
        if link_match and current is not None:
            links[int(link_match.group(1))] = link_match.group(2)
    close()
    return found


@dataclass(frozen=True, slots=True)
class AllReduceResult:
    """The largest message of an nccl-tests run: its size, time and bus bandwidth."""

    size_bytes: int
    time_us: float
    busbw_gbps: float


def read_allreduce(text: str) -> AllReduceResult:
    """The out-of-place result for the largest message size in an nccl-tests table.

    The largest message is the one closest to the link's sustained rate. ValueError when the
    text has no result rows.
    """
    rows = [
        AllReduceResult(int(m.group(1)), float(m.group(2)), float(m.group(4)))
        for line in text.splitlines()
        if not line.lstrip().startswith("#") and (m := _RESULT_ROW.match(line))
    ]
    if not rows:
        raise ValueError("no nccl-tests result rows (size count type redop root time ...)")
    return max(rows, key=lambda r: r.size_bytes)
