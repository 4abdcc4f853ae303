"""Cut `nvidia-smi topo -m` output into cells, before any meaning is given to them.

Pastes of `topo -m` come space- or TAB-aligned, with a source line or a command line on top, a
legend and sometimes a `topo -p2p` block below, and often cut short. nvidia-smi 580 also writes
ANSI underline escapes (`ESC[4m` ... `ESC[0m`) around the header row even when its output goes to
a file, so terminal escapes are dropped before anything else: they are styling, never content.
This module only finds the header, the rows and the NIC legend and checks the shape, so that
`gputopo.importers.nvsmi` can give the cells meaning and tests can compare printed matrices cell
by cell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gputopo.importers.errors import TopologyImportError

__all__ = [
    "ATTRIBUTE_COLUMNS",
    "CPU_AFFINITY",
    "GPU_NUMA_ID",
    "NOT_AVAILABLE",
    "NUMA_AFFINITY",
    "SELF",
    "MatrixRow",
    "TopoMatrix",
    "read_topo_matrix",
    "show",
    "without_escapes",
]

CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"
# The trailing per-GPU columns newer drivers print, in nvidia-smi's order; any subset may appear.
ATTRIBUTE_COLUMNS = (CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID)
_ATTRIBUTE_WORDS = tuple((name, tuple(name.upper().split())) for name in ATTRIBUTE_COLUMNS)


NOT_AVAILABLE = "N/A"
SELF = "X"
_GPU_COLUMN = re.compile(r"^GPU(\d+)$")
_NIC_COLUMN = re.compile(r"^NIC(\d+)$")
_DEVICE_NAME = re.compile(r"^[A-Za-z][\w.:-]*$")
_NIC_LEGEND_ENTRY = re.compile(r"^(NIC\d+)\s*:\s*(\S.*?)\s*$")
# An ANSI/ECMA-48 control sequence: ESC [, parameter bytes, intermediate bytes, one final byte.
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


@dataclass(frozen=True, slots=True)
class MatrixRow:
    """One row as printed: its label, device cells and trailing attribute values.

    `cut` marks the row the input ended in: it may hold fewer cells than the header names, and
    its last cell may be cut mid-word.
    """

    label: str
    line: int
    cells: tuple[str, ...]
    attributes: tuple[str, ...]
    cut: bool = False


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """The cells of a `topo -m` matrix before any meaning is given to them.

    `columns` are the device columns (`GPU0`.., then `NIC0`.. or, from old drivers, `mlx5_0`..),
    `attribute_columns` the trailing per-GPU columns present. `nic_legend` maps `NIC<i>` to the
    device name from the `NIC Legend:` block.
    """

    header_line: int
    columns: tuple[str, ...]
    attribute_columns: tuple[str, ...]
    rows: tuple[MatrixRow, ...]
    nic_legend: Mapping[str, str]

    @property
    def gpu_columns(self) -> tuple[str, ...]:
        """The GPU columns, in order."""
        return tuple(c for c in self.columns if _GPU_COLUMN.match(c))

    @property
    def nic_columns(self) -> tuple[str, ...]:
        """The NIC columns, in order."""
        return tuple(c for c in self.columns if not _GPU_COLUMN.match(c))

    @property
    def cut_row(self) -> MatrixRow | None:
        """The row the input ended inside, if it was cut."""
        return next((r for r in self.rows if r.cut), None)

    def row(self, label: str) -> MatrixRow | None:
        """The row with this label, or None when the input has none."""
        return next((r for r in self.rows if r.label == label), None)

    def cell(self, row: str, column: str) -> str | None:
        """The text of one cell, or None when the row is absent or ends before the column."""
        found = self.row(row)
        at = self.columns.index(column)
        if found is None or at >= len(found.cells):
            return None
        return found.cells[at]

    def attribute(self, row: str, column: str) -> str | None:
        """A row's value under an attribute column, or None when it is not there."""
        found = self.row(row)
        if found is None or column not in self.attribute_columns:
            return None
        at = self.attribute_columns.index(column)
        return found.attributes[at] if at < len(found.attributes) else None

    def nic_name(self, column: str) -> str | None:
        """The device name of a NIC column: the legend's, or the column itself for old drivers."""
        if _NIC_COLUMN.match(column):
            return self.nic_legend.get(column)
        return column


def read_topo_matrix(text: str) -> TopoMatrix:
    """Cut `nvidia-smi topo -m` output into cells and check its shape.

    Accepts leading `#` lines, a command line or a title line before the header, space- or
    TAB-separated cells (empty TAB fields are alignment), terminal escapes anywhere (removed, see
    `without_escapes`), and stops at `Legend:`; a `topo -p2p` block after it is ignored. A row
    with too few cells is an error unless it is the last line of the input (a cut paste), which
    is kept and marked `cut`.
    """
    # Pastes saved on Windows bring a byte order mark and CR line ends.
    plain = without_escapes(text.removeprefix("\ufeff"))
    lines = [line.rstrip("\r") for line in plain.split("\n")]
    header_at = _find_header(lines)
    columns, attributes = _read_header(lines[header_at], header_at + 1)
    last_content = max(i for i, line in enumerate(lines) if line.strip())
    rows: list[MatrixRow] = []
    legend_at = len(lines)
    for at in range(header_at + 1, len(lines)):
        stripped = lines[at].strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith(("Legend:", "NIC Legend:")):
            legend_at = at
            break
        row = _read_row(stripped, at + 1, columns, attributes, cut_allowed=at == last_content)
        if any(r.label == row.label for r in rows):
            raise TopologyImportError(f"a second {row.label} row", line=at + 1)
        rows.append(row)
    if not rows:
        raise TopologyImportError(
            f"the header names {_span(columns)} but no rows follow it", line=header_at + 1
        )
    return TopoMatrix(
        header_line=header_at + 1,
        columns=columns,
        attribute_columns=attributes,
        rows=tuple(rows),
        nic_legend=_read_nic_legend(lines[legend_at:]),
    )


def without_escapes(text: str) -> str:
    """The text without ANSI control sequences (CSI: `ESC[` ... final byte), lines kept as they are.

    nvidia-smi 580 underlines its `topo -m` header with `ESC[4m` ... `ESC[0m` whether or not it
    writes to a terminal, so a header glued to `ESC[4m` would not read as `GPU0`. The sequences
    never hold a newline, so line numbers in errors still point into the original input.
    """
    return _CSI.sub("", text)


def _find_header(lines: list[str]) -> int:
    for at, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or "nvidia-smi" in stripped:
            continue
        tokens = stripped.split()
        if tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != SELF):
            return at
        if stripped.endswith(":") and len(tokens) <= 4:
            continue  # a title such as "NVIDIA Topology:" from a diagnostics dump
        raise TopologyImportError(
            "expected the header row of `nvidia-smi topo -m` (GPU0 GPU1 ... CPU Affinity), "
            f"found {show(stripped)}",
            line=at + 1,
        )
    raise TopologyImportError(
        "no `nvidia-smi topo -m` matrix found: the input is empty or only comments"
    )


def _read_header(line: str, number: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    tokens = line.split()
    columns: list[str] = []
    attributes: list[str] = []
    at = 0
    while at < len(tokens):
        phrase = next(
            (
                (name, len(words))
                for name, words in _ATTRIBUTE_WORDS
                if tuple(t.upper() for t in tokens[at : at + len(words)]) == words
            ),
            None,
        )
        if phrase is not None:
            name, width = phrase
            if name in attributes:
                raise TopologyImportError(f"the header names {name!r} twice", line=number)
            attributes.append(name)
            at += width
            continue
        token = tokens[at]
        if attributes:
            raise TopologyImportError(
                f"unexpected header cell {show(token)} after the affinity columns", line=number
            )
        if not _DEVICE_NAME.match(token):
            raise TopologyImportError(f"{show(token)} is not a device column", line=number)
        if token in columns:
            raise TopologyImportError(f"the header names {token} twice", line=number)
        is_gpu = _GPU_COLUMN.match(token) is not None
        if is_gpu and token != f"GPU{len(columns)}":
            raise TopologyImportError(
                f"expected GPU{len(columns)} in the header, found {token}", line=number
            )
        columns.append(token)
        at += 1
    return tuple(columns), tuple(attributes)


def _read_row(
    text: str,
    number: int,
    columns: tuple[str, ...],
    attributes: tuple[str, ...],
    *,
    cut_allowed: bool,
) -> MatrixRow:
    label, *cells = text.split()
    if label not in columns:
        raise TopologyImportError(
            f"row label {show(label)} is not one of the header's columns ({_span(columns)})",
            line=number,
        )
    width = len(columns)
    if len(cells) < width and not cut_allowed:
        raise TopologyImportError(
            f"expected {width} cells after {label}, found {len(cells)}", line=number
        )
    if len(cells) > width + len(attributes):
        raise TopologyImportError(
            f"expected at most {width + len(attributes)} cells after {label}, found {len(cells)}",
            line=number,
        )
    return MatrixRow(
        label=label,
        line=number,
        cells=tuple(cells[:width]),
        attributes=tuple(cells[width:]),
        # NIC rows print no attribute values, so a NIC row is complete with its device cells.
        cut=cut_allowed and len(cells) < width + (len(attributes) if _is_gpu(label) else 0),
    )


def _is_gpu(column: str) -> bool:
    return _GPU_COLUMN.match(column) is not None


def _read_nic_legend(lines: list[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    inside = False
    for line in lines:
        stripped = line.strip()
        if stripped == "NIC Legend:":
            inside = True
            continue
        if not inside or not stripped:
            continue
        match = _NIC_LEGEND_ENTRY.match(stripped)
        if match is None:
            break
        legend[match.group(1)] = match.group(2)
    return legend


def _span(columns: tuple[str, ...]) -> str:
    return columns[0] if len(columns) == 1 else f"{columns[0]} ... {columns[-1]}"


def show(text: str) -> str:
    """A piece of input, quoted and shortened, safe to print in a one-line error."""
    shown = text if len(text) <= 40 else text[:37] + "..."
    return repr(shown)
