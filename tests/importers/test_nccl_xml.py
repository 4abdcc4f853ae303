"""NCCL topology XML: each vendor file imports into the machine it describes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gputopo.importers import (
    DeviceClass,
    TopologyImportError,
    import_topology,
    parse_nccl_topology,
    unclassified_devices,
)
from gputopo.importers.detect import detect_format
from gputopo.importers.nccl_xml import pcie_generation
from gputopo.links import LinkKind
from gputopo.machines import read_recording
from gputopo.topology import DeviceRef, Link, NicKind, NodeTopology, gpu, nic


def link_of(topology: NodeTopology, a: DeviceRef, b: DeviceRef) -> Link:
    found = topology.link(a, b)
    assert found is not None, f"no link {a}-{b}"
    return found


def code(topology: NodeTopology, a: DeviceRef, b: DeviceRef) -> str:
    return link_of(topology, a, b).code


G5_CLASSES: dict[str, DeviceClass] = {
    f"0000:00:{bus}.0": "gpu" for bus in ("16", "17", "18", "19", "1a", "1b", "1c", "1d")
}
G5_CLASSES["0000:00:15.0"] = "nic"


@dataclass(frozen=True)
class FileCase:
    recording: str
    want_gpus: int
    want_nvlink_pairs: int
    want_nearest_nics: tuple[tuple[int, ...], ...]
    want_gpu_numa: tuple[int, ...]
    want_nic_kinds: tuple[NicKind, ...]
    want_path_0_1: str
    want_pcie: tuple[int, int]
    want_problems: int = 0


# Written from reading each file: GPUs in bus-id order, NICs in bus-id order.
FILE_CASES = [
    pytest.param(
        FileCase(
            "nccl_topo_xml_azure_ndv4.xml",
            want_gpus=8,
            want_nvlink_pairs=0,
            # 0001,0002 + NICs 0101,0102 on switch ffff:ff:02.0 (cpu 1); 0003,0004 + 0103,0104 on
            # ff:01 (cpu 0); 000b,000c + 0105,0106 on ff:04 (cpu 3); 000d,000e + 0107,0108 on ff:03.
            want_nearest_nics=((0, 1), (0, 1), (2, 3), (2, 3), (4, 5), (4, 5), (6, 7), (6, 7)),
            want_gpu_numa=(1, 1, 0, 0, 3, 3, 2, 2),
            want_nic_kinds=(NicKind.INFINIBAND,) * 8,
            want_path_0_1="PIX",
            want_pcie=(4, 16),
        ),
        id="Azure NDv4: 2 GPUs + 2 IB NICs per switch, GPU order by bus id crosses NUMA order",
    ),
    pytest.param(
        FileCase(
            "nccl_topo_xml_azure_ndv5.xml",
            want_gpus=8,
            want_nvlink_pairs=0,
            want_nearest_nics=tuple((i,) for i in range(8)),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_nic_kinds=(NicKind.INFINIBAND,) * 8,
            want_path_0_1="PHB",
            want_pcie=(5, 16),
        ),
        id="Azure NDv5: each GPU shares a virtual switch with one NIC; 32.0 GT/s PCIe is Gen5",
    ),
    pytest.param(
        FileCase(
            "nccl_topo_xml_aws_p4d-24xl.xml",
            want_gpus=8,
            want_nvlink_pairs=0,
            want_nearest_nics=((0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_nic_kinds=(NicKind.EFA,) * 4,
            want_path_0_1="PIX",
            want_pcie=(3, 16),
        ),
        id="AWS p4d: 2 GPUs and 1 EFA (vendor 0x1d0f) per switch",
    ),
    pytest.param(
        FileCase(
            "nccl_topo_xml_aws_p4de-24xl.xml",
            want_gpus=8,
            want_nvlink_pairs=0,
            want_nearest_nics=((0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)),
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_nic_kinds=(NicKind.EFA,) * 4,
            want_path_0_1="PIX",
            want_pcie=(3, 16),
        ),
        id="AWS p4de: same layout as p4d",
    ),
    pytest.param(
        FileCase(
            "nccl_topo_xml_azure_ndv2.xml",
            want_gpus=8,
            want_nvlink_pairs=0,
            want_nearest_nics=((0,),) * 8,
            want_gpu_numa=(0, 0, 0, 0, 1, 1, 1, 1),
            want_nic_kinds=(NicKind.INFINIBAND,),
            want_path_0_1="PHB",
            want_pcie=(4, 16),
        ),
        id="Azure NDv2: no switches, so GPUs on one CPU are PHB; the only NIC is on CPU 0",
    ),
    pytest.param(
        FileCase(
            "nccl_topo_xml_azure_ncv4.xml",
            want_gpus=4,
            want_nvlink_pairs=0,
            want_nearest_nics=((0,),) * 4,
            want_gpu_numa=(0, 1, 2, 3),
            want_nic_kinds=(NicKind.ETHERNET,),
            want_path_0_1="SYS",
            want_pcie=(0, 0),
            want_problems=4,  # each GPU's <nvlink> targets itself
        ),
        id="Azure NCv4: self-targeted NVLink ignored with a problem; eth0 hangs off CPU 0",
    ),
]


@pytest.mark.parametrize("case", FILE_CASES)
def test_a_vendor_topology_file_imports_into_the_machine_it_describes(case: FileCase) -> None:
    topology = parse_nccl_topology(read_recording(case.recording))
    nvlink_pairs = [lk for lk in topology.gpu_links() if lk.kind is LinkKind.NVLINK]
    link = topology.gpu_link(0, 1)
    assert link is not None
    assert topology.gpu_count == case.want_gpus
    assert len(nvlink_pairs) == case.want_nvlink_pairs
    assert tuple(topology.nearest_nics(g.index) for g in topology.gpus) == case.want_nearest_nics
    assert tuple(g.numa_node for g in topology.gpus) == case.want_gpu_numa
    assert tuple(n.kind for n in topology.nics) == case.want_nic_kinds
    assert link.code == case.want_path_0_1
    assert {(g.pcie_generation, g.pcie_width) for g in topology.gpus} == {case.want_pcie}
    assert len(topology.problems) == case.want_problems
    assert not topology.partial
    assert_nominal_known_unless_nic_speed_unknown(topology)


def test_the_g5_file_without_classes_is_partial_and_names_every_device_it_cannot_tell() -> None:
    topology = parse_nccl_topology(read_recording("nccl_topo_xml_aws_g5.48xl.xml"))
    assert topology.partial
    assert topology.gpu_count == 0
    assert [n.id for n in topology.numa_nodes] == [0, 1]
    assert len(topology.problems) == 9
    assert all("has no class" in p and "left out" in p for p in topology.problems)
    assert unclassified_devices(read_recording("nccl_topo_xml_aws_g5.48xl.xml")) == tuple(
        [b for b in G5_CLASSES if G5_CLASSES[b] == "gpu"] + ["0000:00:15.0"]
    )


H100_VM_DUMP = "nccl_topo_dump_h100_vm_1gpu_numa_minus1.xml"


def test_the_h100_vm_dump_is_one_gen5_gpu_with_no_numa_affinity_and_nothing_missing() -> None:
    text = read_recording(H100_VM_DUMP)
    assert text.startswith("# source:")
    assert 'numaid="-1"' in text
    assert 'link_width="0"' in text
    topology = import_topology(text, node_name="vm")  # detected, past its `# source:` line
    assert [
        (g.pci_bus_id, g.numa_node, g.pcie_generation, g.pcie_width) for g in topology.gpus
    ] == [("0000:00:06.0", None, 5, 0)]
    assert [(n.name, n.kind, n.numa_node) for n in topology.nics] == [
        ("eth0", NicKind.ETHERNET, None)
    ]
    assert topology.numa_nodes == ()
    assert code(topology, gpu(0), nic(0)) == "PHB"
    assert_nominal_known_unless_nic_speed_unknown(topology)
    assert not topology.partial
    assert topology.problems == ()


def gpu_pci(busid: str, *, speed: str = "32.0 GT/s PCIe", width: str = "16") -> str:
    return (
        f'<pci busid="{busid}" class="0x030200" vendor="0x10de" link_speed="{speed}" '
        f'link_width="{width}"><gpu sm="90"/></pci>'
    )


@dataclass(frozen=True)
class DumpCase:
    text: str
    want_gpu_numa: tuple[int | None, ...]
    want_numa_nodes: tuple[int, ...]
    want_pcie: tuple[tuple[int, int], ...]
    want_path_0_1: str


DUMP_CASES = [
    pytest.param(
        DumpCase(
            '<system version="1"><cpu numaid="-1">'
            + gpu_pci("0000:01:00.0")
            + '</cpu><cpu numaid="1" affinity="ff">'
            + gpu_pci("0000:02:00.0")
            + "</cpu></system>",
            want_gpu_numa=(None, 1),
            want_numa_nodes=(1,),
            want_pcie=((5, 16), (5, 16)),
            want_path_0_1="SYS",
        ),
        id="numaid -1 leaves its GPU without a NUMA node and makes no node -1; still two sockets",
    ),
    pytest.param(
        DumpCase(
            '<system version="1"><cpu numaid="0">'
            + gpu_pci("0000:01:00.0", width="0")
            + gpu_pci("0000:02:00.0", width="16")
            + "</cpu></system>",
            want_gpu_numa=(0, 0),
            want_numa_nodes=(0,),
            want_pcie=((5, 0), (5, 16)),
            want_path_0_1="PHB",
        ),
        id="link_width 0 is a width NCCL could not read: unknown, beside a Gen5 speed it did read",
    ),
    pytest.param(
        DumpCase(
            '<system version="1"><cpu numaid="0">'
            + gpu_pci("0000:01:00.0", speed="", width="0")
            + gpu_pci("0000:02:00.0", speed="", width="0")
            + "</cpu></system>",
            want_gpu_numa=(0, 0),
            want_numa_nodes=(0,),
            want_pcie=((0, 0), (0, 0)),
            want_path_0_1="PHB",
        ),
        id="no speed and width 0 (Azure NCv4 writes this) is an unknown link, not a problem",
    ),
    pytest.param(
        DumpCase(
            "# source: a dump\n#  second note\n\n"
            '<?xml version="1.0"?>\n<system version="1"><cpu numaid="0">'
            + gpu_pci("0000:01:00.0")
            + gpu_pci("0000:02:00.0")
            + "</cpu></system>\n",
            want_gpu_numa=(0, 0),
            want_numa_nodes=(0,),
            want_pcie=((5, 16), (5, 16)),
            want_path_0_1="PHB",
        ),
        id="# notes above an XML declaration are read past, as a recording's source line is",
    ),
]


@pytest.mark.parametrize("case", DUMP_CASES)
def test_a_dump_from_a_real_machine_imports_as_it_comes(case: DumpCase) -> None:
    topology = import_topology(case.text, node_name="n")
    assert tuple(g.numa_node for g in topology.gpus) == case.want_gpu_numa
    assert tuple(n.id for n in topology.numa_nodes) == case.want_numa_nodes
    assert tuple((g.pcie_generation, g.pcie_width) for g in topology.gpus) == case.want_pcie
    assert code(topology, gpu(0), gpu(1)) == case.want_path_0_1
    assert_nominal_known_unless_nic_speed_unknown(topology)
    assert not topology.partial
    assert topology.problems == ()


def test_the_g5_file_with_assumed_classes_is_8_gpus_and_one_nic_on_socket_1() -> None:
    topology = parse_nccl_topology(
        read_recording("nccl_topo_xml_aws_g5.48xl.xml"), assume_classes=G5_CLASSES
    )
    assert not topology.partial
    assert topology.gpu_count == 8
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [(n.pci_bus_id, n.numa_node) for n in topology.nics] == [("0000:00:15.0", 1)]
    assert code(topology, gpu(0), nic(0)) == "SYS"
    assert code(topology, gpu(4), nic(0)) == "PHB"


DUMP = """<?xml version="1.0"?>
<system version="1">
  <cpu numaid="0" affinity="0000ffff,ffffffff" arch="x86_64" vendor="GenuineIntel">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:02:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
        <pci busid="0000:0f:00.0" class="0x030200" vendor="0x10de" link_speed="32.0 GT/s PCIe"
             link_width="16">
          <gpu dev="0" sm="90" rank="0" gdr="1">
            <nvlink target="0000:c1:00.0" count="6" tclass="0x068000"/>
            <nvlink target="0000:c2:00.0" count="6" tclass="0x068000"/>
            <nvlink target="0000:c3:00.0" count="6" tclass="0x068000"/>
          </gpu>
        </pci>
        <pci busid="0000:10:00.0" class="0x020700" vendor="0x15b3" link_speed="32.0 GT/s PCIe"
             link_width="16">
          <nic>
            <net name="mlx5_1" dev="1" speed="400000" port="1" gdr="1"/>
          </nic>
        </pci>
      </pci>
      <pci busid="0000:03:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
        <pci busid="0000:07:00.0" class="0x030200" vendor="0x10de" link_speed="16.0 GT/s PCIe"
             link_width="8">
          <gpu dev="1" sm="90" rank="1" gdr="1">
            <nvlink target="0000:c1:00.0" count="6" tclass="0x068000"/>
            <nvlink target="0000:c2:00.0" count="6" tclass="0x068000"/>
            <nvlink target="0000:c3:00.0" count="6" tclass="0x068000"/>
          </gpu>
        </pci>
        <pci busid="0000:08:00.0" class="0x020000" vendor="0x15b3" link_speed="32.0 GT/s PCIe"
             link_width="16">
          <nic>
            <net name="mlx5_0" dev="0" speed="200000" port="1" gdr="1"/>
          </nic>
        </pci>
      </pci>
    </pci>
    <pci busid="0000:05:00.0" class="0x030000" vendor="0x1a03" link_speed="" link_width="0"/>
  </cpu>
  <cpu numaid="1" affinity="ffffffff,ffff0000,00000000" arch="x86_64" vendor="GenuineIntel">
    <pci busid="0000:8a:00.0" class="0x030200" vendor="0x10de" link_speed="32.0 GT/s PCIe"
         link_width="16">
      <gpu dev="2" sm="90" rank="2" gdr="1">
        <nvlink target="0000:c1:00.0" count="4" tclass="0x068000"/>
        <nvlink target="0000:c2:00.0" count="4" tclass="0x068000"/>
      </gpu>
    </pci>
  </cpu>
</system>
"""


def test_a_full_nccl_dump_gives_switch_lanes_tree_paths_and_dev_order() -> None:
    topology = parse_nccl_topology(DUMP, node_name="h100-a")
    assert topology.name == "h100-a"
    # dev numbers win over bus order: 0000:0f is GPU0 although 0000:07 sorts first.
    assert [g.pci_bus_id for g in topology.gpus] == ["0000:0f:00.0", "0000:07:00.0", "0000:8a:00.0"]
    assert [(lk.code, lk.via_switch) for lk in topology.gpu_links()] == [
        ("NV18", True),
        ("NV8", True),  # GPU2 has only 8 links into the switches: min(18, 8)
        ("NV8", True),
    ]
    assert link_of(topology, gpu(0), gpu(1)).nominal_gbps == 450.0
    assert [g.nvlink_lanes for g in topology.gpus] == [18, 18, 8]
    assert [g.compute_capability for g in topology.gpus] == ["9.0", "9.0", "9.0"]
    assert [(g.pcie_generation, g.pcie_width) for g in topology.gpus] == [(5, 16), (4, 8), (5, 16)]
    # NICs by <net dev>; class 0x0207 is InfiniBand, a Mellanox 0x0200 port is RoCE.
    assert [(n.name, n.kind, n.speed_mbps) for n in topology.nics] == [
        ("mlx5_0", NicKind.ROCE, 200000),
        ("mlx5_1", NicKind.INFINIBAND, 400000),
    ]
    assert topology.nearest_nics(0) == (1,)  # same switch 0000:02: PIX
    assert code(topology, gpu(0), nic(0)) == "PXB"
    assert code(topology, gpu(2), nic(0)) == "SYS"
    assert [n.cpus for n in topology.numa_nodes] == ["0-47", "48-95"]
    assert topology.gpu_count == 3  # the BMC's VGA device (vendor 0x1a03) is no GPU
    assert topology.problems == ()


def test_direct_nvlink_between_gpus_counts_lanes_and_reports_disagreement() -> None:
    text = """<system version="1"><cpu numaid="0">
      <pci busid="0000:01:00.0" class="0x030200"><gpu dev="0">
        <nvlink target="0000:02:00.0" count="2" tclass="0x030200"/>
        <nvlink target="0000:03:00.0" count="1" tclass="0x030200"/>
        <nvlink target="0000:99:00.0" count="1" tclass="0x030200"/>
      </gpu></pci>
      <pci busid="0000:02:00.0" class="0x030200"><gpu dev="1">
        <nvlink target="0000:01:00.0" count="2" tclass="0x030200"/>
      </gpu></pci>
      <pci busid="0000:03:00.0" class="0x030200"><gpu dev="2">
        <nvlink target="0000:01:00.0" count="2" tclass="0x030200"/>
        <nvlink target="0000:aa:00.0" count="2" tclass="0x060400"/>
      </gpu></pci>
    </cpu></system>"""
    topology = parse_nccl_topology(text)
    assert [(lk.code, lk.via_switch) for lk in topology.gpu_links()] == [
        ("NV2", False),
        ("NV1", False),
        ("PHB", False),
    ]
    assert topology.problems == (
        "GPU0: <nvlink> to 0000:99:00.0, no GPU in the file; ignored",
        "GPU2: <nvlink> to 0000:aa:00.0, class 0x060400; ignored",
        "GPU0-GPU2: 1 NVLinks one way, 2 back; kept 1",
    )


@pytest.mark.parametrize(
    ("link_speed", "want"),
    [
        pytest.param("8 GT/s", 3, id="AWS files write Gen3 as 8 GT/s"),
        pytest.param("16 GT/s", 4, id="Azure NDv4 writes Gen4 without a decimal"),
        pytest.param("16.0 GT/s PCIe", 4, id="NCCL dumps add a decimal and PCIe"),
        pytest.param("32.0 GT/s PCIe", 5, id="Gen5"),
        pytest.param("2.5 GT/s", 1, id="Gen1"),
        pytest.param("", 0, id="empty means unknown"),
    ],
)
def test_link_speed_reads_as_a_pcie_generation(link_speed: str, want: int) -> None:
    assert pcie_generation(link_speed) == want


def test_an_unknown_link_speed_is_a_problem_not_a_crash() -> None:
    with pytest.raises(ValueError, match="not a PCIe transfer rate"):
        pcie_generation("Unknown")
    text = '<system><cpu numaid="0"><pci busid="0000:01:00.0" class="0x030200" '
    text += 'link_speed="Unknown" link_width="x16"/></cpu></system>'
    topology = parse_nccl_topology(text)
    assert topology.gpus[0].pcie_generation == 0
    assert len(topology.problems) == 2


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(
            read_recording("nccl_graph_xml_azure_ncv4.xml"),
            "this is an NCCL graph file (<graphs>, NCCL_GRAPH_FILE)",
            id="an NCCL graph file is not a topology",
        ),
        pytest.param(
            '<system version="1">\n  <cpu numaid="0">\n</system>',
            "line 3: not well-formed XML (mismatched tag, column 3)",
            id="mismatched tag names its line",
        ),
        pytest.param(
            '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">]>\n<system>&lol;</system>',
            "line 2: a DOCTYPE or ENTITY declaration",
            id="entity declarations are refused before parsing",
        ),
        pytest.param(
            "<topology><gpu/></topology>",
            "expected NCCL topology XML with a <system> root, found <topology>",
            id="another XML document",
        ),
        pytest.param(
            '<system version="1"/>', "the <system> has no <cpu> element", id="an empty system"
        ),
        pytest.param("", "line 1: not well-formed XML (no element found", id="empty input"),
        pytest.param(
            '# source: a dump\n<system version="1">\n  <cpu numaid="0">\n</system>',
            "line 4: not well-formed XML (mismatched tag, column 3)",
            id="# notes before the markup still count in the line an error names",
        ),
    ],
)
def test_what_is_not_a_topology_file_gives_a_one_line_error(text: str, want: str) -> None:
    with pytest.raises(TopologyImportError) as raised:
        parse_nccl_topology(text)
    assert str(raised.value).startswith(want), str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("recording", "want_format"),
    [
        ("nccl_topo_xml_azure_ndv5.xml", "nccl-xml"),
        ("nvsmi_topo_hgx_a100_sxm4_80gb_8nic_roce.txt", "nvidia-smi"),
        ("nvsmi_topo_workstation_2x_rtx5090_phb.txt", "nvidia-smi"),
        ("nccl_topo_dump_h100_vm_1gpu_numa_minus1.xml", "nccl-xml"),  # after a `# source:` line
        ("nvsmi_topo_h100_80gb_hbm3_vm_1gpu_ansi.txt", "nvidia-smi"),
    ],
)
def test_import_topology_detects_the_format_and_dispatches(
    recording: str, want_format: str
) -> None:
    text = read_recording(recording)
    topology: NodeTopology = import_topology(text, node_name="n")
    assert detect_format(text) == want_format
    assert topology.name == "n"
    assert topology.gpu_count > 0


@pytest.mark.parametrize(
    "recording", ["nccl_topo_xml_azure_ndv5.xml", "nvsmi_topo_hgx_a100_sxm4_80gb_8nic_roce.txt"]
)
def test_a_file_saved_on_windows_imports_like_the_original(recording: str) -> None:
    text = read_recording(recording)
    windows = "\ufeff" + text.replace("\n", "\r\n")
    assert import_topology(windows, node_name="n") == import_topology(text, node_name="n")


def test_import_topology_of_nothing_says_what_it_expected() -> None:
    with pytest.raises(TopologyImportError, match="expected `nvidia-smi topo -m` output or NCCL"):
        import_topology("  \n", node_name="n")


def assert_nominal_known_unless_nic_speed_unknown(topology: NodeTopology) -> None:
    """Every link has a nominal figure, except paths to a NIC whose speed the recording does
    not give: those are 0 (unknown), never the GPU's PCIe rate."""
    unknown = {nic(n.index) for n in topology.nics if n.speed_mbps <= 0}
    for lk in topology.links:
        assert (lk.nominal_gbps == 0) == bool({lk.a, lk.b} & unknown), lk
