"""The `gputopo` command line.

Subcommands live in `gputopo.app.commands`, one module each, found at start-up; they import their
heavy modules lazily, so `gputopo --help` is fast. Exit codes: 0 success, 1 the work failed (a
request not placed, a check that found problems), 2 bad usage or input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from gputopo.app import commands

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _version() -> str:
    """The installed distribution's version: one source of truth, `pyproject.toml`."""
    try:
        return version("gputopo")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `chosen`, only that command's module is loaded (the others are listed
    by name alone). Why: loading every command, and through `bench` every benchmark, cost each
    long-running process (an exporter on every node) about 3.5 MiB of RSS it never uses."""
    parser = argparse.ArgumentParser(
        prog="gputopo", description="GPU topology made schedulable on Kubernetes."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    parser.add_argument("--version", action="version", version=f"gputopo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        name = info.name.replace("_", "-")
        if chosen is not None and name != chosen:
            sub.add_parser(name)
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(handler=module.run)
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The command `argv` names (its first word that is no option), if it is one; None
    otherwise, so that help and errors list every command as before."""
    known = {m.name.replace("_", "-") for m in pkgutil.iter_modules(commands.__path__)}
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in known else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    given = list(sys.argv[1:] if argv is None else argv)
    args = _parser(_command_named(given)).parse_args(given)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    if args.command in ("aggregator", "scheduler"):
        level = min(level, logging.INFO)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except (UnicodeError, RecursionError) as err:
        # Bad input that slipped past a command's own checks: one line and exit 2, no traceback.
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)[:200]
        print(f"gputopo {args.command}: bad input: {why}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`gputopo demo --json | head`): stop quietly, like other CLIs.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
