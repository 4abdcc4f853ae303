"""`gputopo demo`: the local demo cluster."""

from __future__ import annotations

import argparse

HELP = "run a local demo cluster with simulated GPU nodes, real gRPC and real placement"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="also create Node objects for the simulated nodes in that cluster (when absent) "
        "and publish their labels there",
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    import sys

    from gputopo.app.demo import main
    from gputopo.runtime.kube import KubeError

    try:
        return main(as_json=args.json, kubeconfig=args.kubeconfig)
    except KubeError as err:
        print(f"gputopo demo: {err}", file=sys.stderr)
        return 2 if err.status == 0 else 1
