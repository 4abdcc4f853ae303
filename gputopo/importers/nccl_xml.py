"""Read NCCL topology XML (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`) into a `NodeTopology`.

Cloud vendors publish these files for their GPU instance types (Azure's ND/NC series, AWS p4d,
g5), and `NCCL_TOPO_DUMP_FILE` writes one on any machine, so they are the second common record of
a real machine. The schema (see NCCL's `src/graph/topo.cc`):

    <system version="1">
      <cpu numaid="0" affinity="0000ffff,ffffffff" ...>          one per NUMA node
        <pci busid="ffff:ff:01.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
          <pci busid="0001:00:00.0" class="0x030200" ...>        a GPU behind that switch
            <gpu dev="0" sm="90"><nvlink target="..." count="18" tclass="0x068000"/></gpu>
          </pci>
          <pci busid="0101:00:00.0" class="0x020700"><nic><net name="mlx5_0" speed="400000"/>
        ...

Reading it:

1. Walk the tree: `<cpu>` -> NUMA node; `<pci>` with children -> a bridge or switch; a leaf
   `<pci>` is a GPU (class 0x03xxxx or a `<gpu>` child), a NIC (0x0207xx InfiniBand, 0x0200xx
   Ethernet/EFA, or a `<nic>` child), or, with no class, unknown unless `assume_classes` says.
2. Number GPUs by `<gpu dev>` when every GPU has one, else by PCI bus id (nvidia-smi's order);
   NICs by `<net dev>`, else by bus id.
3. PCIe path classes from the tree: same parent switch -> PIX, a common switch higher up -> PXB,
   only the `<cpu>` in common -> PHB, different `<cpu>` -> SYS. NCCL's tree does not tell NODE
   apart from PHB, so neither do we.
4. NVLink from `<nvlink>`: tclass 0x068000 is an NVSwitch, and all GPUs on switches are peers with
   lanes = the smaller of their switch lane counts; 0x030200 is a direct link to that GPU.
5. Nominal bandwidth from the facts table.

Dumps from real machines bring facts in forms the vendor files do not. A VM whose PCI devices
have no NUMA node makes NCCL write `numaid="-1"`: no NUMA affinity, which is a fact, so its GPUs
and NICs get no NUMA node and no NUMA node -1 is made up. `link_width="0"` is a width NCCL could
not read (passthrough GPUs in VMs), so the width is unknown (0, as everywhere in the model), not
a link with no lanes. `#` lines before the markup (a recording's `# source:` line) are notes.

Only the standard library reads the XML, and documents with a DOCTYPE or entity declarations are
refused before parsing: topology files never need them, and entity expansion is how XML bombs work.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from gputopo.importers.errors import TopologyImportError
from gputopo.importers.idlists import cpulist_from_mask
from gputopo.links import LinkKind
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import Gpu, Link, Nic, NicKind, NodeTopology, NumaNode, gpu, nic

__all__ = ["DeviceClass", "parse_nccl_topology", "pcie_generation", "unclassified_devices"]

DeviceClass = Literal["gpu", "nic"]

NVSWITCH_CLASS = 0x068000
_GPU_CLASSES = (0x030000, 0x030200)
_NVIDIA_VENDOR = 0x10DE
_AMAZON_VENDOR = 0x1D0F  # EFA
_MELLANOX_VENDOR = 0x15B3
_DECLARATION = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_GT_PER_S = re.compile(r"^\s*([\d.]+)\s*GT/s", re.IGNORECASE)
# PCIe transfer rate per lane (GT/s) -> generation.
_GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


@dataclass(slots=True)
class _Cpu:
    numa_id: int | None  # None: NCCL found no NUMA affinity (numaid="-1")
    cpus: str


@dataclass(slots=True)
class _Device:
    """A GPU or NIC found in the tree, with where it hangs."""

    kind: DeviceClass
    busid: str
    cpu: int
    switches: tuple[int, ...]  # ids of the enclosing <pci> bridges, outermost first
    element: ET.Element | None
    pcie_generation: int = 0
    pcie_width: int = 0
    nic_kind: NicKind = NicKind.UNKNOWN


@dataclass(slots=True)
class _Walk:
    """What walking the tree found, and what it could not make sense of."""

    assume: Mapping[str, DeviceClass]
    cpus: list[_Cpu] = field(default_factory=list)
    devices: list[_Device] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unclassified: list[str] = field(default_factory=list)
    switch_ids: dict[int, int] = field(default_factory=dict)


def parse_nccl_topology(
    text: str,
    *,
    node_name: str = "imported",
    assume_classes: Mapping[str, DeviceClass] | None = None,
) -> NodeTopology:
    """Build a `NodeTopology` from NCCL topology XML.

    `assume_classes` maps PCI bus ids (as written in the file) to "gpu" or "nic" for devices
    the file lists without a class (AWS's g5 file); without it such devices are left out and the
    result is `partial`, saying which ones. Raises `TopologyImportError` for text that is not a
    topology file: malformed XML, a DOCTYPE, or an NCCL graph file (`<graphs>`).
    """
    walk = _walk(_parse_xml(text), assume_classes or {})

    gpus_found = _ordered_gpus([d for d in walk.devices if d.kind == "gpu"], walk.problems)
    nics_found = _ordered_nics([d for d in walk.devices if d.kind == "nic"])
    gpus = [_gpu(i, d, walk.cpus[d.cpu]) for i, d in enumerate(gpus_found)]
    nics = [
        Nic(
            index=i,
            name=port.name or f"NIC{i}",
            kind=port.device.nic_kind,
            speed_mbps=port.speed_mbps,
            numa_node=walk.cpus[port.device.cpu].numa_id,  # None when NCCL knows none
            pci_bus_id=port.device.busid,
        )
        for i, port in enumerate(nics_found)
    ]
    nvlinks, lanes_per_gpu = _nvlinks(gpus_found, walk.problems)
    links: list[Link] = []
    for i, a in enumerate(gpus_found):
        for j in range(i + 1, len(gpus_found)):
            lanes, via_switch = nvlinks.get((i, j), (0, False))
            if lanes > 0:
                links.append(Link(gpu(i), gpu(j), LinkKind.NVLINK, lanes, via_switch=via_switch))
            else:
                links.append(Link(gpu(i), gpu(j), _path_kind(a, gpus_found[j])))
        for j, port in enumerate(nics_found):
            links.append(Link(gpu(i), nic(j), _path_kind(a, port.device)))
    gpus = [replace(g, nvlink_lanes=lanes) for g, lanes in zip(gpus, lanes_per_gpu, strict=True)]
    for busid in walk.unclassified:
        walk.problems.append(
            f"PCI device {busid} has no class: cannot tell a GPU from a NIC, so it is left out"
        )
    if not gpus and not walk.unclassified:
        walk.problems.append("the file lists no GPU")
    topology = NodeTopology(
        name=node_name,
        gpus=tuple(gpus),
        nics=tuple(nics),
        numa_nodes=tuple(
            NumaNode(id=c.numa_id, cpus=c.cpus) for c in walk.cpus if c.numa_id is not None
        ),
        links=tuple(links),
        partial=bool(walk.unclassified),
        problems=tuple(walk.problems),
    )
    return with_nominal_bandwidth(topology)


def unclassified_devices(text: str) -> tuple[str, ...]:
    """The PCI bus ids of the devices the file lists without a class, in file order.

    These are what `assume_classes` can name: `parse_nccl_topology` leaves them out. Raises
    `TopologyImportError` as `parse_nccl_topology` does.
    """
    return tuple(_walk(_parse_xml(text), {}).unclassified)


def _walk(root: ET.Element, assume_classes: Mapping[str, DeviceClass]) -> _Walk:
    walk = _Walk(assume={k.lower(): v for k, v in assume_classes.items()})
    for index, element in enumerate(root.findall("cpu")):
        walk.cpus.append(_read_cpu(element, index, walk.problems))
        _walk_children(element, len(walk.cpus) - 1, (), walk)
    if not walk.cpus:
        raise TopologyImportError("the <system> has no <cpu> element: no NUMA node, no device")
    return walk


def _parse_xml(text: str) -> ET.Element:
    declaration = _DECLARATION.search(text)
    if declaration is not None:
        raise TopologyImportError(
            "a DOCTYPE or ENTITY declaration: topology files never need one and they are refused "
            "for safety",
            line=text.count("\n", 0, declaration.start()) + 1,
        )
    markup, notes = _after_notes(text.removeprefix("\ufeff"))
    try:
        root = ET.fromstring(markup)
    except ET.ParseError as error:
        line, column = error.position
        reason = str(error).split(":")[0]
        raise TopologyImportError(
            f"not well-formed XML ({reason}, column {column + 1})", line=notes + line
        ) from None
    if root.tag == "graphs":
        raise TopologyImportError(
            "this is an NCCL graph file (<graphs>, NCCL_GRAPH_FILE): it lists the rings and trees "
            "NCCL chose, not the machine; import the topology file (<system>, NCCL_TOPO_FILE or "
            "NCCL_TOPO_DUMP_FILE) instead"
        )
    if root.tag != "system":
        raise TopologyImportError(
            f"expected NCCL topology XML with a <system> root, found <{root.tag}>"
        )
    return root


def _after_notes(text: str) -> tuple[str, int]:
    """The text from its first line that is neither blank nor a `#` note, and how many lines
    came before it (XML allows nothing but the markup there, and error lines must still point
    into the whole input)."""
    lines = text.split("\n")
    notes = 0
    while notes < len(lines) - 1 and (not lines[notes].strip() or lines[notes].lstrip()[0] == "#"):
        notes += 1
    return "\n".join(lines[notes:]), notes


def _read_cpu(element: ET.Element, position: int, problems: list[str]) -> _Cpu:
    numa_text = element.get("numaid")
    try:
        numa_id = int(numa_text) if numa_text is not None else position
    except ValueError:
        numa_id = position
        problems.append(f"<cpu> #{position}: numaid {numa_text!r} is not a number; used {position}")
    mask = element.get("affinity", "")
    try:
        cpus = cpulist_from_mask(mask) if mask else ""
    except ValueError:
        cpus = ""
        problems.append(f"<cpu> #{position}: affinity {mask[:40]!r} is not a hex CPU mask")
    # NCCL's -1: the devices below have no NUMA affinity (a VM, say); a fact, not a node id.
    return _Cpu(numa_id=numa_id if numa_id >= 0 else None, cpus=cpus)


def _walk_children(element: ET.Element, cpu: int, switches: tuple[int, ...], walk: _Walk) -> None:
    for child in element:
        if child.tag == "pci":
            _walk_pci(child, cpu, switches, walk)
        elif child.tag == "nic":
            # A NIC NCCL could not place on the PCIe tree hangs off the CPU itself.
            walk.devices.append(
                _Device("nic", "", cpu, switches, child, nic_kind=_bare_kind(child))
            )


def _walk_pci(element: ET.Element, cpu: int, switches: tuple[int, ...], walk: _Walk) -> None:
    busid = element.get("busid", "").strip().lower()
    if element.find("pci") is not None:
        key = walk.switch_ids.setdefault(id(element), len(walk.switch_ids))
        _walk_children(element, cpu, (*switches, key), walk)
        return
    device_class = _number(element.get("class"))
    vendor = _number(element.get("vendor"))
    kind: DeviceClass | None
    if element.find("gpu") is not None:
        kind = "gpu"
    elif element.find("nic") is not None:
        kind = "nic"
    elif device_class is None:
        kind = walk.assume.get(busid)
        if kind is None:
            walk.unclassified.append(busid or "(no busid)")
            return
    elif device_class >> 8 in (c >> 8 for c in _GPU_CLASSES):
        kind = "gpu" if vendor in (None, _NVIDIA_VENDOR) else None  # a BMC's VGA is no GPU
    elif device_class >> 16 == 0x02:
        kind = "nic"
    else:
        kind = None  # a bridge with nothing below it, storage, ...
    if kind is None:
        return
    generation, width = _pcie_link(element, busid, walk.problems)
    walk.devices.append(
        _Device(
            kind=kind,
            busid=busid,
            cpu=cpu,
            switches=switches,
            element=element,
            pcie_generation=generation,
            pcie_width=width,
            nic_kind=_nic_kind(device_class, vendor) if kind == "nic" else NicKind.UNKNOWN,
        )
    )


def _number(text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _nic_kind(device_class: int | None, vendor: int | None) -> NicKind:
    if device_class is not None and device_class >> 8 == 0x0207:
        return NicKind.INFINIBAND
    if device_class is not None and device_class >> 8 == 0x0200:
        if vendor == _AMAZON_VENDOR:
            return NicKind.EFA
        # A Mellanox port in Ethernet mode is used by NCCL through RDMA, i.e. RoCE.
        return NicKind.ROCE if vendor == _MELLANOX_VENDOR else NicKind.ETHERNET
    return NicKind.UNKNOWN


def _bare_kind(element: ET.Element) -> NicKind:
    names = [net.get("name", "") for net in element.iter("net")]
    return (
        NicKind.ETHERNET if names and all(n.startswith("eth") for n in names) else NicKind.UNKNOWN
    )


def pcie_generation(link_speed: str) -> int:
    """The PCIe generation of a `link_speed` such as "16 GT/s" or "32.0 GT/s PCIe"; 0 if empty.

    ValueError for a speed that is not one of PCIe's rates.
    """
    if not link_speed.strip():
        return 0
    match = _GT_PER_S.match(link_speed)
    rate = float(match.group(1)) if match else -1.0
    if rate not in _GENERATIONS:
        raise ValueError(f"{link_speed!r} is not a PCIe transfer rate")
    return _GENERATIONS[rate]


def _pcie_link(element: ET.Element, busid: str, problems: list[str]) -> tuple[int, int]:
    speed, width_text = element.get("link_speed", ""), element.get("link_width", "")
    try:
        generation = pcie_generation(speed)
    except ValueError as error:
        generation = 0
        problems.append(f"{busid}: {error}; PCIe generation unknown")
    try:
        width = int(width_text) if width_text.strip() else 0
    except ValueError:
        width = 0
        problems.append(f"{busid}: link_width {width_text!r} is not a number; PCIe width unknown")
    # NCCL writes 0 when it could not read the width (GPUs passed through to a VM): unknown, as an
    # empty link_speed is, and 0 is how the model says unknown. No PCIe link has 0 lanes.
    return generation, max(width, 0)


def _ordered_gpus(found: list[_Device], problems: list[str]) -> list[_Device]:
    """GPUs in index order: `<gpu dev>` when every GPU has a distinct one, else bus id order."""
    numbered = {dev: d for d in found if (dev := _gpu_dev(d)) is not None}
    if found and sorted(numbered) == list(range(len(found))):
        return [numbered[i] for i in range(len(found))]
    if numbered:
        problems.append("<gpu dev> numbers are missing or repeated: GPUs numbered by PCI bus id")
    return sorted(found, key=lambda d: d.busid)


def _gpu_dev(device: _Device) -> int | None:
    element = device.element.find("gpu") if device.element is not None else None
    try:
        return int(element.get("dev", "")) if element is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class _Port:
    device: _Device
    name: str = ""
    speed_mbps: int = 0
    dev: int | None = None


def _ordered_nics(found: list[_Device]) -> list[_Port]:
    """One entry per network port (`<net>`), or per NIC device when the file names no ports;
    by `<net dev>` when every port has a distinct one, else by bus id."""
    ports: list[_Port] = []
    for device in found:
        nets = list(device.element.iter("net")) if device.element is not None else []
        ports += [
            _Port(device, n.get("name", ""), _int(n.get("speed")) or 0, _int(n.get("dev")))
            for n in nets
        ] or [_Port(device)]
    devs = {p.dev for p in ports if p.dev is not None}
    if len(devs) == len(ports):
        return sorted(ports, key=lambda p: p.dev or 0)
    return sorted(ports, key=lambda p: p.device.busid)  # stable: ports keep their file order


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _gpu(index: int, device: _Device, cpu: _Cpu) -> Gpu:
    element = device.element.find("gpu") if device.element is not None else None
    sm = _int(element.get("sm")) if element is not None else None
    return Gpu(
        index=index,
        pci_bus_id=device.busid,
        numa_node=cpu.numa_id,
        cpu_affinity=cpu.cpus,
        compute_capability=f"{sm // 10}.{sm % 10}" if sm else "",
        pcie_generation=device.pcie_generation,
        pcie_width=device.pcie_width,
    )


def _nvlinks(
    gpus: list[_Device], problems: list[str]
) -> tuple[dict[tuple[int, int], tuple[int, bool]], list[int]]:
    """NVLink lanes per GPU pair (i < j) with whether they go through NVSwitch, and each GPU's
    own active NVLinks (into switches plus direct)."""
    index_of = {d.busid: i for i, d in enumerate(gpus)}
    switch_lanes = [0] * len(gpus)
    own_lanes = [0] * len(gpus)
    direct: dict[tuple[int, int], int] = {}
    for i, device in enumerate(gpus):
        for target, count, tclass in _nvlink_elements(device, problems):
            if tclass == NVSWITCH_CLASS:
                switch_lanes[i] += count
            elif tclass in _GPU_CLASSES and target == device.busid:
                problems.append(
                    f"GPU{i} ({device.busid}): <nvlink> targets the GPU itself, which means "
                    "nothing; ignored"
                )
                continue
            elif tclass in _GPU_CLASSES and target in index_of:
                direct[(i, index_of[target])] = direct.get((i, index_of[target]), 0) + count
            else:
                what = "no GPU in the file" if tclass in _GPU_CLASSES else f"class {tclass:#08x}"
                problems.append(f"GPU{i}: <nvlink> to {target}, {what}; ignored")
                continue
            own_lanes[i] += count
    pairs: dict[tuple[int, int], tuple[int, bool]] = {}
    on_switch = [i for i, lanes in enumerate(switch_lanes) if lanes > 0]
    for a in on_switch:
        for b in on_switch:
            if a < b:
                pairs[(a, b)] = (min(switch_lanes[a], switch_lanes[b]), True)
    for a, b in sorted({(min(k), max(k)) for k in direct}):
        there, back = direct.get((a, b), 0), direct.get((b, a), 0)
        lanes = min(there, back) if there and back else there or back
        if there and back and there != back:
            problems.append(f"GPU{a}-GPU{b}: {there} NVLinks one way, {back} back; kept {lanes}")
        if lanes > pairs.get((a, b), (0, False))[0]:
            pairs[(a, b)] = (lanes, False)
    return pairs, own_lanes


def _nvlink_elements(device: _Device, problems: list[str]) -> Iterator[tuple[str, int, int]]:
    element = device.element.find("gpu") if device.element is not None else None
    if element is None:
        return
    for link in element.iter("nvlink"):
        count, tclass = _int(link.get("count")), _number(link.get("tclass"))
        if count is None or count <= 0 or tclass is None:
            problems.append(f"{device.busid}: <nvlink> without a count or tclass; ignored")
            continue
        yield link.get("target", "").strip().lower(), count, tclass


def _path_kind(a: _Device, b: _Device) -> LinkKind:
    """nvidia-smi's PCIe path class between two devices, from where they hang in the tree."""
    if a.cpu != b.cpu:
        return LinkKind.SYS
    if a.switches and b.switches and a.switches[-1] == b.switches[-1]:
        return LinkKind.PIX
    if a.switches and b.switches and a.switches[0] == b.switches[0]:
        return LinkKind.PXB
    return LinkKind.PHB
