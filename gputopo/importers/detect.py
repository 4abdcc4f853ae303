"""Tell which recording a text is and hand it to the right importer.

`gputopo topo import FILE` should not make users say what they pasted: NCCL topology XML starts
with `<` (a declaration, a comment or `<system>`), `nvidia-smi topo -m` output with its header
row. Either may follow `#` notes (a recording's `# source:` line), so those are looked past.
Anything else gets the nvidia-smi importer's error, which names the line where a header row was
expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from gputopo.importers.errors import TopologyImportError
from gputopo.importers.nccl_xml import DeviceClass, parse_nccl_topology
from gputopo.importers.nvsmi import parse_topo_matrix
from gputopo.topology import NodeTopology

__all__ = ["RecordingFormat", "detect_format", "import_topology"]

RecordingFormat = Literal["nvidia-smi", "nccl-xml"]


def detect_format(text: str) -> RecordingFormat:
    """ "nccl-xml" when the first thing after any `#` notes is markup, else "nvidia-smi"."""
    if not text.strip():
        raise TopologyImportError(
            "the input is empty: expected `nvidia-smi topo -m` output or NCCL topology XML"
        )
    lines = (line.strip() for line in text.removeprefix("\ufeff").splitlines())
    first = next((line for line in lines if line and not line.startswith("#")), "")
    return "nccl-xml" if first.startswith("<") else "nvidia-smi"


def import_topology(
    text: str,
    *,
    node_name: str = "imported",
    recording_format: RecordingFormat | None = None,
    assume_classes: Mapping[str, DeviceClass] | None = None,
) -> NodeTopology:
    """Import a recording of either kind; `recording_format` skips detection when known.

    `assume_classes` is passed to the NCCL XML importer (see `parse_nccl_topology`).
    """
    kind = recording_format or detect_format(text)
    if kind == "nccl-xml":
        return parse_nccl_topology(text, node_name=node_name, assume_classes=assume_classes)
    return parse_topo_matrix(text, node_name=node_name)
