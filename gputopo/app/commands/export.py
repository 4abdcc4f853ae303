"""`gputopo export slurm|kueue|kai|volcano`: scheduler topology for a cluster, to stdout."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gputopo.app.commands.aggregator import add_label_arguments, label_scheme

if TYPE_CHECKING:
    from aggregator.exports import Placed

HELP = "write Slurm topology.conf, Kueue/KAI Topology or Volcano HyperNodes to stdout"

FORMATS = ("slurm", "kueue", "kai", "volcano")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument("format", choices=FORMATS, help="what to write")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--inventory",
        metavar="FILE",
        help="a cluster inventory in topograph's model format (default: the demo cluster)",
    )
    source.add_argument(
        "--aggregator",
        metavar="URL",
        help="a running aggregator's HTTP address, e.g. http://127.0.0.1:8080 (http:// if none)",
    )
    parser.add_argument(
        "--block",
        action="store_true",
        help="slurm: topology/block over NVLink domains instead of topology/tree",
    )
    add_label_arguments(
        parser,
        profile_help="label keys the Topology levels name (as the aggregator publishes them)",
    )


def aggregator_url(address: str) -> str:
    """The aggregator's base URL: `HOST:PORT` as `--aggregator` is written everywhere else
    (the exporter's option takes it so) means plain HTTP."""
    address = address.rstrip("/")
    return address if "://" in address else f"http://{address}"


def why_empty(fmt: str, *, block: bool, nodes: Sequence[Placed], source: str) -> str:
    """Why `fmt` has nothing to say about these nodes: an empty export is an error, since a
    scheduler fed an empty file or no objects silently loses its topology."""
    if not nodes:
        return f"{source} knows no nodes"
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    if fmt == "slurm" and block:
        return (
            f"none of the {count} of {source} is in an NVLink domain, so topology/block has no "
            "block; `gputopo export slurm` (topology/tree) writes the switch tiers"
        )
    what = "fabric tiers" if fmt == "volcano" else "fabric tiers or an NVLink domain"
    return (
        f"none of the {count} of {source} has {what}; give the aggregator an --inventory, "
        "or label the nodes (topograph's fabric.topograph.run/tier-N, a cloud's topology labels)"
    )


def run(args: argparse.Namespace) -> int:
    """Write the chosen format, or exit 1 saying why there is nothing to write."""
    import sys
    import urllib.request

    import yaml

    from aggregator.exports import (
        Placed,
        kai_topologies,
        kueue_topologies,
        slurm_block,
        slurm_tree,
        volcano_hypernodes,
    )
    from aggregator.fabric import FabricSources
    from gputopo.inventory import InventoryError, load_inventory

    nodes: list[Placed]
    source = "the demo cluster"
    if args.inventory:
        source = f"inventory {args.inventory}"
        try:
            inventory = load_inventory(args.inventory)
        except (OSError, InventoryError) as err:
            print(f"gputopo export: {err}", file=sys.stderr)
            return 2
        sources = FabricSources(inventory=inventory)
        nodes = [
            Placed(name, sources.resolve_node(name, None, {}).fabric) for name in inventory.nodes
        ]
    elif args.aggregator:
        from google.protobuf import json_format

        from gputopo.codec import fabric_from_proto
        from gputopo.v1 import topology_pb2 as tpb

        # /api/v1/topology is a ClusterTopology in protobuf's JSON mapping: read it back as one.
        url = aggregator_url(args.aggregator) + "/api/v1/topology?links=false"
        source = f"the aggregator at {aggregator_url(args.aggregator)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                cluster = json_format.Parse(
                    response.read(), tpb.ClusterTopology(), ignore_unknown_fields=True
                )
        except (OSError, ValueError, json_format.ParseError) as err:
            print(f"gputopo export: cannot read {url}: {err}", file=sys.stderr)
            return 2
        nodes = [
            Placed(n.topology.name, fabric_from_proto(n.topology.fabric)) for n in cluster.nodes
        ]
    else:
        from gputopo.app.demo import demo_nodes

        # Merged as the aggregator merges what the demo's exporters report (NVML adds the
        # NVL72 rack's partition), so the objects name the labels it publishes.
        sources = FabricSources()
        nodes = [Placed(n.name, sources.resolve_node(n.name, n, {}).fabric) for n in demo_nodes()]
    scheme = label_scheme(args)
    if args.format == "slurm":
        text = slurm_block(nodes) if args.block else slurm_tree(nodes)
    else:
        if args.format == "kueue":
            objects = kueue_topologies(nodes, scheme)
        elif args.format == "kai":
            objects = kai_topologies(nodes, scheme)
        else:
            objects = volcano_hypernodes(nodes)
        text = yaml.safe_dump_all(objects, sort_keys=False) if objects else ""
    if not text:
        reason = why_empty(args.format, block=args.block, nodes=nodes, source=source)
        print(f"gputopo export {args.format}: nothing to write: {reason}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0
