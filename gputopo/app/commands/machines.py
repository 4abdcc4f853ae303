"""`gputopo machines`: the machine profiles built from recordings."""

from __future__ import annotations

import argparse

HELP = "list the machine profiles built from recordings of real machines"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument(
        "--assumptions",
        action="store_true",
        help="also print what each profile assumes beyond its recording",
    )


def run(args: argparse.Namespace) -> int:
    """Print one line per profile."""
    from gputopo.machines import describe_profiles

    for profile in describe_profiles():
        print(profile.line())
        if args.assumptions:
            for assumption in profile.assumptions:
                print(f"    assumed: {assumption}")
    return 0
