"""Read and print `nvidia-smi topo -m` matrices.

`nvidia-smi topo -m` is the topology record users actually have: it is in bug reports, cluster
runbooks and chat logs, pasted with spaces or TABs, often cut short. Reading it gives a fake
machine built from a real one; printing it (`render_topo_matrix`) shows any `NodeTopology` in the
layout every GPU user already reads.

Reading happens in two steps. `read_topo_matrix` only cuts the text into cells (header, rows,
NIC legend) and checks the shape; `parse_topo_matrix` gives the cells meaning:

1. GPU-GPU and GPU-NIC cells become `Link`s (`NV#` -> NVLink with lanes, `PIX`..`SYS` -> PCIe
   path classes). A cell that is missing (a cut or absent row, `N/A`) is taken from its mirror
   cell when that one exists; either way the topology is marked `partial` and each missing fact
   gets one line in `problems`.
2. A GPU's NUMA node is the lowest id of its `NUMA Affinity` list; a NIC's NUMA node is that of
   the GPUs that reach it without crossing sockets.
3. Whether NVLink goes through an NVSwitch is inferred from lane counts (`on_nvswitch`).
4. The NVLink generation, which the matrix never says, is taken from the product its `#` source
   line names when that is unambiguous (`gputopo.importers.product`); else the facts table's
   default applies.
5. Nominal bandwidth is filled in from the facts table.

NIC-NIC cells are checked but not kept: the model has no NIC-NIC links.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gputopo.importers.errors import TopologyImportError
from gputopo.importers.idlists import parse_idlist
from gputopo.importers.product import (
    nvlink_generation_named,
    nvlink_generation_note,
    recording_notes,
)
from gputopo.importers.topo_matrix import (
    ATTRIBUTE_COLUMNS,
    CPU_AFFINITY,
    GPU_NUMA_ID,
    NOT_AVAILABLE,
    NUMA_AFFINITY,
    SELF,
    MatrixRow,
    TopoMatrix,
    read_topo_matrix,
    show,
)
from gputopo.links import LinkHealth, LinkKind, link_kind_from_code
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import (
    DEFAULT_MEASUREMENT_MAX_AGE_S,
    DeviceKind,
    DeviceRef,
    Gpu,
    Link,
    Nic,
    NodeTopology,
    NumaNode,
    gpu,
    nic,
)

__all__ = [
    "ATTRIBUTE_COLUMNS",
    "MAX_NVLINKS_PER_GPU",
    "MatrixRow",
    "TopoMatrix",
    "gpu_nvlink_lanes",
    "on_nvswitch",
    "parse_topo_matrix",
    "read_topo_matrix",
    "render_topo_matrix",
    "with_numa_completed",
]

# The most NVLinks any GPU has had: 18 on H100 and B200 (A100 12, V100 6, P100 4).
MAX_NVLINKS_PER_GPU = 18

LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""  # noqa: E501  (nvidia-smi's own text)


# ---------------------------------------------------------------------------------------------
# Meaning


@dataclass(frozen=True, slots=True)
class _Code:
    kind: LinkKind
    lanes: int
    text: str


def parse_topo_matrix(text: str, *, node_name: str = "imported") -> NodeTopology:
    """Build a `NodeTopology` from `nvidia-smi topo -m` output.

    Raises `TopologyImportError` naming the line for text that is not such a matrix (no header,
    an unknown code, a row of the wrong width) or when a cut leaves nothing usable. A cut paste
    otherwise gives a `partial` topology with one `problems` line per missing fact.
    """
    matrix = read_topo_matrix(text)
    codes = _read_codes(matrix)
    problems: list[str] = []
    cut = matrix.cut_row
    if cut is not None:
        problems.append(f"input ends inside row {cut.label} at line {cut.line}: truncated paste?")
    partial = cut is not None

    gpu_cols, nic_cols = matrix.gpu_columns, matrix.nic_columns
    links: list[Link] = []
    pairs = [
        (gpu(i), a, gpu(j), b)
        for i, a in enumerate(gpu_cols)
        for j, b in enumerate(gpu_cols)
        if i < j
    ] + [(gpu(i), a, nic(j), b) for i, a in enumerate(gpu_cols) for j, b in enumerate(nic_cols)]
    for ref_a, label_a, ref_b, label_b in pairs:
        code, note = _pair_code(matrix, codes, label_a, label_b)
        if note:
            problems.append(note)
            partial = partial or _missing(matrix, label_a, label_b) is not None
        if code is not None:
            links.append(Link(a=ref_a, b=ref_b, kind=code.kind, lanes=code.lanes))

    gpus: list[Gpu] = []
    for index, label in enumerate(gpu_cols):
        found, missing = _gpu_attributes(matrix, index, label, problems)
        partial = partial or missing
        gpus.append(found)
    known = links or any(g.cpu_affinity or g.numa_node is not None for g in gpus)
    if cut is not None and not known and (len(gpu_cols) > 1 or nic_cols):
        raise TopologyImportError(
            "the input ends before any GPU-GPU or GPU-NIC cell: nothing usable is left",
            line=cut.line,
        )
    if NUMA_AFFINITY not in matrix.attribute_columns:
        problems.append("no NUMA Affinity column (older driver): GPU NUMA nodes unknown")

    switched = on_nvswitch(links, len(gpus))
    links = [
        replace(lk, via_switch=lk.a.index in switched or lk.b.index in switched)
        if lk.kind is LinkKind.NVLINK
        else lk
        for lk in links
    ]
    gpus = [replace(g, nvlink_lanes=gpu_nvlink_lanes(links, g.index)) for g in gpus]
    generation = nvlink_generation_named(
        recording_notes(text), max_lanes=max((g.nvlink_lanes for g in gpus), default=0)
    )
    if generation:
        gpus = [replace(g, nvlink_generation=generation) if g.nvlink_lanes else g for g in gpus]
    topology = NodeTopology(
        name=node_name,
        gpus=tuple(gpus),
        nics=tuple(_nics(matrix, problems)),
        links=tuple(links),
        partial=partial,
        problems=tuple(problems),
    )
    return with_nominal_bandwidth(with_numa_completed(topology))


def _read_codes(matrix: TopoMatrix) -> dict[tuple[str, str], _Code | None]:
    """Check every cell and read its code; None for `N/A` and for a cell cut mid-word."""
    gpu_cols = set(matrix.gpu_columns)
    codes: dict[tuple[str, str], _Code | None] = {}
    for row in matrix.rows:
        for at, text in enumerate(row.cells):
            column = matrix.columns[at]
            where = f"in column {column} of row {row.label}"
            if column == row.label:
                if text.upper() != SELF and not (row.cut and at == len(row.cells) - 1):
                    raise TopologyImportError(
                        f"{row.label}'s own cell should read X, found {show(text)}", line=row.line
                    )
                continue
            if text.upper() == SELF:
                raise TopologyImportError(f"X (self) {where}, off the diagonal", line=row.line)
            if text.upper() == NOT_AVAILABLE:
                codes[(row.label, column)] = None
                continue
            try:
                kind, lanes = link_kind_from_code(text)
            except ValueError as error:
                if row.cut and at == len(row.cells) - 1:
                    codes[(row.label, column)] = None  # the paste ends inside this cell
                    continue
                raise TopologyImportError(f"{error} {where}", line=row.line) from None
            both_gpus = row.label in gpu_cols and column in gpu_cols
            if both_gpus and not (kind is LinkKind.NVLINK or kind.is_pcie):
                raise TopologyImportError(f"{text} cannot join two GPUs ({where})", line=row.line)
            if not both_gpus and not kind.is_pcie:
                raise TopologyImportError(
                    f"{text} is not a PCIe path class, as a NIC cell must be ({where})",
                    line=row.line,
                )
            codes[(row.label, column)] = _Code(kind, lanes, text.upper())
    return codes


def _missing(matrix: TopoMatrix, row: str, column: str) -> str | None:
    """Why a cell has no code, or None when it has one."""
    found = matrix.row(row)
    if found is None:
        return f"no {row} row"
    at = matrix.columns.index(column)
    if at >= len(found.cells):
        return f"row {row} ends at line {found.line} before column {column}"
    text = found.cells[at]
    if text.upper() == NOT_AVAILABLE:
        return f"row {row} reads N/A"
    if found.cut and at == len(found.cells) - 1:
        try:
            link_kind_from_code(text)
        except ValueError:
            return f"row {row} is cut inside this cell at line {found.line}"
    return None


def _pair_code(
    matrix: TopoMatrix, codes: Mapping[tuple[str, str], _Code | None], a: str, b: str
) -> tuple[_Code | None, str]:
    """The code of a pair from row a, else from its mirror in row b, and a problem line if any.

    A missing mirror alone is no problem: the fact is known, and NIC rows hold nothing else the
    model keeps.
    """
    first, second = codes.get((a, b)), codes.get((b, a))
    if first is not None:
        if second is not None and (first.kind, first.lanes) != (second.kind, second.lanes):
            return first, (
                f"{a}-{b}: row {a} reads {first.text} but row {b} reads {second.text}; "
                f"kept {first.text}"
            )
        return first, ""
    why_first = _missing(matrix, a, b)
    if second is not None:
        return second, f"{a}-{b}: {why_first}; used {second.text} from row {b}"
    return None, f"{a}-{b}: unknown ({why_first}; {_missing(matrix, b, a)})"


def _gpu_attributes(
    matrix: TopoMatrix, index: int, label: str, problems: list[str]
) -> tuple[Gpu, bool]:
    """A GPU's CPU affinity and NUMA node from its trailing columns; True when facts are missing."""
    row = matrix.row(label)
    missing = False
    values: dict[str, str] = {}
    for column in matrix.attribute_columns:
        value = matrix.attribute(label, column)
        if value is None:
            if column != GPU_NUMA_ID:  # not kept in the model
                why = f"no {label} row" if row is None else f"row {label} ends at line {row.line}"
                problems.append(f"{label}: {column} unknown ({why})")
                missing = True
            continue
        values[column] = value
    cpu_affinity = values.get(CPU_AFFINITY, NOT_AVAILABLE)
    numa_text = values.get(NUMA_AFFINITY, NOT_AVAILABLE)
    numa_node: int | None = None
    if numa_text.upper() != NOT_AVAILABLE:
        try:
            numa_node = parse_idlist(numa_text)[0]
        except ValueError:
            problems.append(f"{label}: NUMA Affinity {show(numa_text)} is not a list of NUMA ids")
    return (
        Gpu(
            index=index,
            numa_node=numa_node,
            cpu_affinity="" if cpu_affinity.upper() == NOT_AVAILABLE else cpu_affinity,
        ),
        missing,
    )


def on_nvswitch(links: Iterable[Link], gpu_count: int) -> frozenset[int]:
    """The GPUs whose NVLinks must go through an NVSwitch, judged from NVLink lane counts alone.

    nvidia-smi prints `NV<n>` for a pair whether the n links join the two GPUs directly or join
    each GPU to a switch that both reach. Through a switch, the same links of a GPU carry the
    traffic to every peer, so they are counted once per peer: a GPU whose lanes summed over its
    peers exceed `MAX_NVLINKS_PER_GPU` (18, the most any GPU has) cannot be wired directly and
    must be on a switch (HGX A100: 7 peers x NV12 = 84). Below that the answer is "direct", which
    is right for bridges and DGX-1-style meshes and, for a switch with a single peer, harmless:
    the bandwidth is the same.
    """
    totals = [0] * gpu_count
    for link in links:
        if link.kind is LinkKind.NVLINK:
            totals[link.a.index] += link.lanes
            totals[link.b.index] += link.lanes
    return frozenset(i for i, total in enumerate(totals) if total > MAX_NVLINKS_PER_GPU)


def gpu_nvlink_lanes(links: Iterable[Link], index: int) -> int:
    """A GPU's active NVLinks: its links into the switch (the same links serve every switched
    peer, so they count once) plus its direct links."""
    mine = [lk for lk in links if lk.kind is LinkKind.NVLINK and index in (lk.a.index, lk.b.index)]
    switch = max((lk.lanes for lk in mine if lk.via_switch), default=0)
    return switch + sum(lk.lanes for lk in mine if not lk.via_switch)


def _nics(matrix: TopoMatrix, problems: list[str]) -> list[Nic]:
    unnamed = [c for c in matrix.nic_columns if matrix.nic_name(c) is None]
    if unnamed:
        what = "no NIC Legend" if not matrix.nic_legend else "the NIC Legend lacks some NICs"
        problems.append(f"{what}: names of {', '.join(unnamed)} unknown, kept as printed")
    return [
        Nic(index=index, name=matrix.nic_name(column) or column)
        for index, column in enumerate(matrix.nic_columns)
    ]


def with_numa_completed(topology: NodeTopology) -> NodeTopology:
    """Infer unknown NIC NUMA nodes from the GPUs and list every NUMA node a device names.

    A NIC's NUMA node is that of the GPUs nearest it, when that path does not cross sockets:
    `SYS` crosses the inter-socket link, so it says nothing about where the NIC is. Among the
    other GPUs the nearest decide (PIX before NODE); if they disagree it stays unknown. NUMA
    nodes the topology lacks are added, with the CPUs of their GPUs when those agree.
    """
    nics = tuple(
        n if n.numa_node is not None else replace(n, numa_node=_nic_numa(topology, n.index))
        for n in topology.nics
    )
    known = {node.id: node for node in topology.numa_nodes}
    named = {g.numa_node for g in topology.gpus} | {n.numa_node for n in nics}
    for node in sorted(i for i in named if i is not None and i not in known):
        affinities = {g.cpu_affinity for g in topology.gpus if g.numa_node == node}
        known[node] = NumaNode(id=node, cpus=affinities.pop() if len(affinities) == 1 else "")
    return replace(topology, nics=nics, numa_nodes=tuple(known[i] for i in sorted(known)))


def _nic_numa(topology: NodeTopology, index: int) -> int | None:
    near = sorted(
        (lk.kind, numa_node)
        for g in topology.gpus
        if (numa_node := g.numa_node) is not None
        and (lk := topology.link(gpu(g.index), nic(index))) is not None
        and lk.kind < LinkKind.SYS
    )
    if not near:
        return None
    nodes = {node for kind, node in near if kind == near[0][0]}
    return nodes.pop() if len(nodes) == 1 else None


# ---------------------------------------------------------------------------------------------
# Printing


def render_topo_matrix(topology: NodeTopology, *, now: float | None = None) -> str:
    """Print a topology as `nvidia-smi topo -m` does, then its per-pair bandwidth.

    A `# NVLink N` note comes first when the GPUs' NVLink generation is known (nvidia-smi never
    says it; reading the note back keeps it). The first matrix is nvidia-smi's layout (GPU rows,
    NIC rows, `CPU Affinity`, `NUMA Affinity`, the legend and the `NIC Legend:`), so
    `parse_topo_matrix` reads it back. Cells the model does not hold print as `N/A`: NIC-NIC
    paths, and links a partial topology lacks. The second matrix gives GB/s per direction for
    each GPU pair and GPU-NIC pair: the measurement when one is fresh at `now` (any age when
    `now` is None), marked `*`, else the nominal figure.
    """
    gpu_labels = [f"GPU{g.index}" for g in topology.gpus]
    nic_labels = [f"NIC{n.index}" for n in topology.nics]
    refs: list[DeviceRef] = [gpu(g.index) for g in topology.gpus] + [
        nic(n.index) for n in topology.nics
    ]
    labels = gpu_labels + nic_labels
    header = [*labels, CPU_AFFINITY, NUMA_AFFINITY]
    rows: list[list[str]] = []
    for g in topology.gpus:
        rows.append(
            [
                f"GPU{g.index}",
                *(_code_cell(topology, gpu(g.index), ref) for ref in refs),
                g.cpu_affinity or NOT_AVAILABLE,
                NOT_AVAILABLE if g.numa_node is None else str(g.numa_node),
            ]
        )
    for n in topology.nics:
        rows.append([f"NIC{n.index}", *(_code_cell(topology, nic(n.index), ref) for ref in refs)])
    generations = {g.nvlink_generation for g in topology.gpus if g.nvlink_lanes}
    note = (
        [nvlink_generation_note(min(generations))] if generations and 0 not in generations else []
    )
    parts = [*note, _table(header, rows), "", LEGEND]
    # A NIC whose name is unknown keeps its column label and gets no legend line, so reading
    # the output back says the name is unknown, as reading the original did.
    named = [n for n in topology.nics if n.name != f"NIC{n.index}"]
    if named:
        parts += ["", "NIC Legend:", ""] + [f"  NIC{n.index}: {n.name}" for n in named]
    parts += ["", _bandwidth_table(topology, labels, refs, now=now)]
    if topology.partial or topology.problems:
        parts += ["", "Problems:"] + [f"  - {p}" for p in topology.problems]
    return "\n".join(parts) + "\n"


def _code_cell(topology: NodeTopology, me: DeviceRef, other: DeviceRef) -> str:
    if me == other:
        return f" {SELF}"
    if me.kind is other.kind is DeviceKind.NIC:
        return NOT_AVAILABLE  # NIC-NIC paths are not in the model
    link = topology.link(me, other)
    return link.code if link is not None else NOT_AVAILABLE


def _bandwidth_table(
    topology: NodeTopology, labels: list[str], refs: list[DeviceRef], *, now: float | None
) -> str:
    rows = []
    for g in topology.gpus:
        me = gpu(g.index)
        cells = []
        for ref in refs:
            link = topology.link(me, ref) if ref != me else None
            cells.append(f" {SELF}" if ref == me else _gbps_cell(link, now))
        rows.append([f"GPU{g.index}", *cells])
    title = "GB/s per direction (* = measured; otherwise nominal, from the facts table):"
    return title + "\n" + _table(labels, rows)


def _gbps_cell(link: Link | None, now: float | None) -> str:
    if link is None:
        return "-"
    value = link.bandwidth_gbps(now=now)
    m = link.measured
    measured = (
        link.health is not LinkHealth.DOWN
        and m is not None
        and m.gbps > 0
        and (now is None or now - m.measured_at <= DEFAULT_MEASUREMENT_MAX_AGE_S)
    )
    return f"{value:.1f}{'*' if measured else ''}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded like nvidia-smi's TAB stops: at least 8 wide, 2 spaces between."""
    label_width = max([8, *(len(r[0]) + 2 for r in rows)])
    widths = [max(8, len(name) + 4 if " " in name else len(name) + 2) for name in header]
    for row in rows:
        for at, cell in enumerate(row[1:]):
            widths[at] = max(widths[at], len(cell) + 2)
    lines = [" " * label_width + "".join(n.ljust(w) for n, w in zip(header, widths, strict=True))]
    for row in rows:
        cells = "".join(c.ljust(w) for c, w in zip(row[1:], widths, strict=False))
        lines.append(row[0].ljust(label_width) + cells)
    return "\n".join(line.rstrip() for line in lines)
