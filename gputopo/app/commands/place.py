"""`gputopo place`: place a request against an inventory file, offline, without any server.

    gputopo place --cluster MODEL.yaml --request REQUEST.yaml [--policy NAME] [--compare] [--json]

MODEL.yaml is a cluster inventory (topograph's model format with gputopo's `nodeProfile` and
`used` extensions, see `gputopo.inventory`); REQUEST.yaml a placement request in the form the
README documents. Exit codes: 0 placed, 1 not placed, 2 bad input (the message names the file
and the field).
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "place a request against a cluster inventory file, offline (no server)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument(
        "--cluster", required=True, metavar="MODEL.yaml", help="cluster inventory file"
    )
    parser.add_argument(
        "--request", required=True, metavar="REQUEST.yaml", help="placement request file"
    )
    parser.add_argument(
        "--policy", default=None, help="gputopo (default), kueue-bestfit, default or first-fit"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also show what every other policy would choose on the same state",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    """Load both files, place, print."""
    import yaml

    from gputopo.cluster import ClusterSnapshot, NodeState
    from gputopo.inventory import (
        InventoryError,
        inventory_labels,
        inventory_topologies,
        parse_inventory,
        read_text,
    )
    from gputopo.placement import POLICIES, UnknownPolicyError, place
    from gputopo.placement.report import result_to_dict, result_to_text
    from gputopo.request import RequestError, request_from_mapping

    try:
        text = read_text(args.cluster)
    except (OSError, InventoryError) as err:  # the error names the file already
        print(f"gputopo place: {err}", file=sys.stderr)
        return 2
    try:
        inventory = parse_inventory(text, source=args.cluster)
        topologies, used = inventory_topologies(inventory)
    except (OSError, InventoryError) as err:
        why = _one_line(err)
        where = "" if why.startswith(args.cluster) else f"{args.cluster}: "
        print(f"gputopo place: {where}{why}", file=sys.stderr)
        return 2
    try:
        request = request_from_mapping(yaml.safe_load(read_text(args.request)))
    except InventoryError as err:  # read_text's: not UTF-8 text
        print(f"gputopo place: {err}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"gputopo place: {args.request}: nested too deeply to be a request", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError, RequestError) as err:
        print(f"gputopo place: {args.request}: {_one_line(err)}", file=sys.stderr)
        return 2
    labels = inventory_labels(inventory, topologies)
    snapshot = ClusterSnapshot(
        NodeState(
            t,
            frozenset(range(t.gpu_count)) - used.get(t.name, frozenset()),
            labels.get(t.name, {}),
        )
        for t in topologies
    )
    try:
        result, seconds = place(snapshot, request, policy=args.policy)
    except UnknownPolicyError as err:
        print(f"gputopo place: --policy: {err}", file=sys.stderr)
        return 2
    data = result_to_dict(result, snapshot, seconds=seconds)
    if args.compare:
        data["compare"] = {}
        for name in sorted(POLICIES):
            if name == result.policy:
                continue
            other, took = place(snapshot, request, policy=name)
            data["compare"][name] = result_to_dict(other, snapshot, seconds=took)
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(result_to_text(data))
        for name, other in data.get("compare", {}).items():
            print(f"\n{name} would choose:")
            print(result_to_text(other))
    return 0 if result.placed else 1


def _one_line(err: BaseException) -> str:
    """An error as one line (a YAML error spans several), cut to a readable length."""
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:300] + "..."
