"""`gputopo topo`: show a node's topology as `nvidia-smi topo -m` does, or import a recording.

    gputopo topo show                 this node, discovered now (NVML and /sys)
    gputopo topo show --from SOURCE   a recording: `nvidia-smi topo -m` text or NCCL topology XML
                                      (a path, or the name of a bundled recording), or a machine
                                      profile by name (what `gputopo machines` lists)
    gputopo topo import FILE --json   a recording as the node topology, in JSON

`show` prints nvidia-smi's matrix (GPU rows with X, NV<n>, PIX, PXB, PHB, NODE, SYS), then GB/s
per direction for each pair, measured (*) or nominal. Input that is not a recording exits 2 with
one line naming where it went wrong; a truncated recording is shown, flagged partial, with what
is missing. A source that is none of these exits 2 listing the names it takes. A recording that
yields no GPU exits 1 with the reason, since a node topology with
no GPU is never what was meant. NCCL XML that lists devices without a PCI class (AWS's g5 file)
says what they are with `--assume-class BUSID=gpu|nic`; when it does not, the command prints
itself again with those flags, ready to edit, rather than naming an option it does not have.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gputopo.importers import DeviceClass
    from gputopo.topology import NodeTopology

HELP = "show a node's GPU topology like `nvidia-smi topo -m`, or import a recording"
ASSUME_CLASS = "--assume-class"
_CLASSES: tuple[DeviceClass, ...] = ("gpu", "nic")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Sub-commands `show` and `import`."""
    sub = parser.add_subparsers(dest="topo_command", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print a topology as nvidia-smi's matrix plus bandwidth")
    show.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help=(
            "instead of this node: a recording (path or bundled name) or a machine profile "
            "(`gputopo machines`)"
        ),
    )
    show.add_argument("--node-name", default="", help="name to give the node")
    show.add_argument("--sysfs-root", default="/sys", help="sysfs of this node (default /sys)")
    _add_assume_class(show)
    imp = sub.add_parser("import", help="read a recording into a node topology")
    imp.add_argument(
        "file",
        metavar="SOURCE",
        help="a recording (path or bundled name) or a machine profile (`gputopo machines`)",
    )
    imp.add_argument("--json", action="store_true", help="print the topology as JSON")
    imp.add_argument("--node-name", default="imported", help="name to give the node")
    _add_assume_class(imp)


def _add_assume_class(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        ASSUME_CLASS,
        dest="assume_classes",
        action="append",
        default=[],
        type=_assumed_class,
        metavar="BUSID=gpu|nic",
        help="NCCL XML only: what a PCI device the file lists without a class is (repeatable)",
    )


def _assumed_class(text: str) -> tuple[str, DeviceClass]:
    """`0000:00:16.0=gpu` -> ("0000:00:16.0", "gpu"); argparse reports the error as usage."""
    busid, _, kind = text.partition("=")
    for known in _CLASSES:
        if kind.strip().lower() == known and busid.strip():
            return busid.strip().lower(), known
    raise argparse.ArgumentTypeError(f"expected BUSID=gpu or BUSID=nic, found {text!r}")


def run(args: argparse.Namespace) -> int:
    """Run the chosen action."""
    if args.topo_command == "import":
        return _import(args)
    return _show(args)


def _read(source: str) -> str:
    """A recording's text, from a path or a bundled name; OSError naming why not."""
    import errno
    from pathlib import Path

    from gputopo.inventory import MAX_FILE_BYTES
    from gputopo.machines import read_recording, recordings

    path = Path(source)
    if not path.exists() and source in recordings():
        return read_recording(source)
    with path.open("rb") as fh:  # bounded: `/dev/zero` is refused, not read to exhaustion
        raw = fh.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES >> 20} MiB; not a recording")
    return raw.decode("utf-8", errors="replace")


def sources_accepted() -> str:
    """What `--from` (and `import`) take besides a path, for the message when a source is none."""
    from gputopo.machines import PROFILES, recordings

    return (
        "a path to a recording (nvidia-smi topo -m text or NCCL XML), a machine profile ("
        + ", ".join(PROFILES)
        + ") or a bundled recording ("
        + ", ".join(recordings())
        + ")"
    )


def _load(args: argparse.Namespace, source: str, node_name: str) -> NodeTopology | int:
    """The imported recording or profile, or the exit code after saying on stderr why there is
    none."""
    from pathlib import Path

    from gputopo.importers import (
        TopologyImportError,
        detect_format,
        import_topology,
        unclassified_devices,
    )
    from gputopo.machines import PROFILES, load_machine

    if source in PROFILES and not Path(source).exists():
        return load_machine(source, node_name=node_name)
    try:
        text = _read(source)
    except OSError as error:
        hint = f"; it takes {sources_accepted()}" if not Path(source).exists() else ""
        print(
            f"gputopo topo: cannot read {source}: {error.strerror or error}{hint}",
            file=sys.stderr,
        )
        return 2
    assumed = dict(args.assume_classes)
    try:
        topology = import_topology(text, node_name=node_name, assume_classes=assumed)
        unclassified = (
            [b for b in unclassified_devices(text) if b not in assumed]
            if detect_format(text) == "nccl-xml"
            else []
        )
    except TopologyImportError as error:
        print(f"gputopo topo: {source}: {error}", file=sys.stderr)
        return 2
    if not topology.gpus:
        why = (
            f"{len(unclassified)} PCI device(s) have no class, so none can be taken for a GPU"
            if unclassified
            else "the recording lists none"
        )
        print(f"gputopo topo: {source}: no GPU: {why}", file=sys.stderr)
    elif topology.partial:
        print(
            f"gputopo topo: warning: {source} is incomplete; the topology is partial "
            f"({len(topology.problems)} problem(s) listed)",
            file=sys.stderr,
        )
    if unclassified:
        print(
            f"gputopo topo: say what each device without a class is with {ASSUME_CLASS} "
            "BUSID=gpu|nic; to start from, all of them as GPUs (make the NICs =nic):\n"
            f"  {_again(args, {**assumed, **dict.fromkeys(unclassified, 'gpu')})}",
            file=sys.stderr,
        )
    return topology if topology.gpus else 1


def _again(args: argparse.Namespace, classes: dict[str, DeviceClass]) -> str:
    """This command line again, with `classes` as its --assume-class flags."""
    import shlex

    if args.topo_command == "import":
        words = ["gputopo", "topo", "import", args.file, *(["--json"] if args.json else [])]
        if args.node_name != "imported":
            words += ["--node-name", args.node_name]
    else:
        words = ["gputopo", "topo", "show", "--from", args.source]
        if args.node_name:
            words += ["--node-name", args.node_name]
    for busid, kind in classes.items():
        words += [ASSUME_CLASS, f"{busid}={kind}"]
    return shlex.join(words)


def _show(args: argparse.Namespace) -> int:
    import time

    from gputopo.importers import render_topo_matrix

    if args.source:
        found = _load(args, args.source, args.node_name or "imported")
        if isinstance(found, int):
            return found
        sys.stdout.write(render_topo_matrix(found))
        return 0
    topology = _discover(args)
    if not topology.gpus:
        print(
            f"gputopo topo: no GPU to show: {topology.nvml.reason or 'NVML found none'}",
            file=sys.stderr,
        )
        return 1
    sys.stdout.write(render_topo_matrix(topology, now=time.time()))
    return 0


def _discover(args: argparse.Namespace) -> NodeTopology:
    import socket
    from pathlib import Path

    from exporter.discovery import Discovery
    from exporter.nvml import Nvml
    from exporter.sysfs import Sysfs

    nvml = Nvml()
    try:
        discovery = Discovery(
            node_name=args.node_name or socket.gethostname(),
            nvml=nvml,
            sysfs=Sysfs(Path(args.sysfs_root)),
        )
        return discovery.run().topology
    finally:
        nvml.close()


def _import(args: argparse.Namespace) -> int:
    import json

    from google.protobuf import json_format

    from gputopo.codec import topology_to_proto

    topology = _load(args, args.file, args.node_name)
    if isinstance(topology, int):
        return topology
    if args.json:
        message = json_format.MessageToDict(
            topology_to_proto(topology),
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        print(json.dumps(message, indent=2))
        return 0
    counts = (
        (topology.gpu_count, "GPU"),
        (len(topology.nics), "NIC"),
        (len(topology.numa_nodes), "NUMA node"),
        (len(topology.links), "link"),
    )
    print(
        f"{topology.name}: {', '.join(_counted(n, noun) for n, noun in counts)}"
        f"{', partial' if topology.partial else ''}"
    )
    for problem in topology.problems:
        print(f"  - {problem}")
    return 0


def _counted(count: int, noun: str) -> str:
    """`1 NIC`, `2 NICs`, `0 links`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
