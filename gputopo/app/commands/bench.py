"""`gputopo bench NAME`: run one of the benchmarks in `gputopo.app.benchmarks`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from gputopo.app import benchmarks

HELP = "run a benchmark and print its figures (JSON with --json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per benchmark module (`_name` modules are parts of one, not commands)."""
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    found = pkgutil.iter_modules(benchmarks.__path__)
    for info in sorted((m for m in found if not m.name.startswith("_")), key=lambda m: m.name):
        module = importlib.import_module(f"{benchmarks.__name__}.{info.name}")
        cmd = sub.add_parser(info.name.replace("_", "-"), help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(bench=module.run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark."""
    result: int = args.bench(args)
    return result
