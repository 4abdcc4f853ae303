"""Importers of real topology recordings: `nvidia-smi topo -m` text and NCCL topology XML.

Every importer returns a `NodeTopology` with nominal bandwidth filled in, marks it `partial`
with one `problems` line per missing fact when the input was cut short, and raises
`TopologyImportError` (a `ValueError` whose message is one line naming the input line) when the
input is not a recording at all. They are pure: text in, topology out.
"""

from gputopo.importers.detect import RecordingFormat, detect_format, import_topology
from gputopo.importers.errors import TopologyImportError
from gputopo.importers.nccl_xml import DeviceClass, parse_nccl_topology, unclassified_devices
from gputopo.importers.nvsmi import parse_topo_matrix, render_topo_matrix

__all__ = [
    "DeviceClass",
    "RecordingFormat",
    "TopologyImportError",
    "detect_format",
    "import_topology",
    "parse_nccl_topology",
    "parse_topo_matrix",
    "render_topo_matrix",
    "unclassified_devices",
]
