"""`gputopo export slurm|kueue|kai|volcano`: scheduler topology for a cluster, to stdout."""

from __future__ import annotations

import argparse

from gputopo.app.commands.aggregator import add_label_arguments, label_scheme

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
        help="a running aggregator's HTTP address, e.g. http://127.0.0.1:8080",
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


def run(args: argparse.Namespace) -> int:
    """Write the chosen format."""
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
    if args.inventory:
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
        url = args.aggregator.rstrip("/") + "/api/v1/topology?links=false"
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
        sys.stdout.write(slurm_block(nodes) if args.block else slurm_tree(nodes))
        return 0
    if args.format == "kueue":
        objects = kueue_topologies(nodes, scheme)
    elif args.format == "kai":
        objects = kai_topologies(nodes, scheme)
    else:
        objects = volcano_hypernodes(nodes)
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
    return 0
