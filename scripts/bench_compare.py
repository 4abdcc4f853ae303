"""Run one `gputopo bench` side by side on this checkout and on another commit, interleaved.

    git worktree add --detach /tmp/gputopo-base <commit>
    .venv/bin/python scripts/bench_compare.py --base /tmp/gputopo-base --rounds 3 -- \
        placement --sizes 1000,10000

Both sides run with this interpreter and its installed dependencies; each gets its own
checkout first on PYTHONPATH. `--script PATH` runs that script (this checkout's, with the
arguments after `--`) instead of `gputopo bench`: a benchmark older commits do not have, over
an API they share (`scripts/bench_state.py`). Rounds alternate base, branch, base, branch,
... so that load from other work on the machine falls on both alike. Prints JSON: for every
numeric figure of the benchmark's own JSON, the median over rounds on each side and branch /
base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
# Fields that name a row of a list (which layout, size, shape, policy it is about).
ROW_KEYS = ("layout", "gpus", "node_gpus", "request_gpus", "shape", "policy", "server")


def run(checkout: Path, bench: list[str], script: Path | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [str(script), *bench] if script else ["-m", "gputopo", "bench", *bench, "--json"]
    out = subprocess.run(
        [sys.executable, *command],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def flatten(value: Any, path: str = "") -> dict[str, float]:
    """Every number in a JSON value by its path; list rows are named by their ROW_KEYS."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, int | float):
        return {path: float(value)}
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out |= flatten(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            name = str(i)
            if isinstance(item, dict):
                name = "/".join(str(item[k]) for k in ROW_KEYS if k in item) or name
            out |= flatten(item, f"{path}[{name}]")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the base commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--branch-only",
        default="",
        metavar="FLAGS",
        help="flags added on the branch side alone (space separated): options the base does"
        " not know yet, such as one that turns off a part the branch added",
    )
    parser.add_argument("--script", type=Path, help="a script to run instead of gputopo bench")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- NAME [benchmark flags]")
    args = parser.parse_args()
    bench = [a for a in args.bench if a != "--"]
    sides: dict[str, list[dict[str, float]]] = {"base": [], "branch": []}
    script = args.script.resolve() if args.script else None
    for _ in range(args.rounds):
        sides["base"].append(flatten(run(args.base.resolve(), bench, script)))
        sides["branch"].append(flatten(run(HERE, bench + args.branch_only.split(), script)))
    figures = {}
    for key in sorted(set(sides["base"][0]) & set(sides["branch"][0])):
        if key.rsplit(".", 1)[-1] in (*ROW_KEYS, "seed"):
            continue  # names a row, not a figure
        base = statistics.median(r[key] for r in sides["base"] if key in r)
        branch = statistics.median(r[key] for r in sides["branch"] if key in r)
        figures[key] = {
            "base": base,
            "branch": branch,
            "ratio": round(branch / base, 3) if base else None,
        }
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in figures.items()]
    head = json.dumps({"bench": bench, "rounds": args.rounds})[:-1]
    print(head + ', "figures": {\n' + ",\n".join(lines) + "\n}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
