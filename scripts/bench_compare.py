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

A ratio alone does not say whether a figure moved: a p99 of 20 samples is its maximum, and
two runs of the same code differ by more than 5 % in it. `--aa` runs the base a second time
in every round (base, branch, base again; the order of the two base runs alternates), so each
figure also gets `aa`, the same ratio between the base and itself, and `noise`: over every
way to cut the base's runs in two halves, the largest ratio of their medians, either way up
(the A/A is one such cut). The `verdict` lists every figure whose ratio is above
`--threshold` with its noise, and calls it `beyond_noise` only when the ratio is also above
that noise; nothing is left out, so a reader sees both. A markdown table of the same goes to
stderr.

The second base run is a copy of the base checkout at another path (made for the run, removed
after): the branch differs from the base in its path too, and identical code at two paths gave
25 of 1,040 placement figures beyond the noise of one checkout run twice, so a noise that is
to judge the branch has to include what a second checkout changes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs if key in r)


def _ratio(top: float, bottom: float) -> float | None:
    return round(top / bottom, 3) if bottom else None


def compare(
    base: list[dict[str, float]],
    branch: list[dict[str, float]],
    again: list[dict[str, float]] | None = None,
) -> dict[str, dict[str, float | None]]:
    """Per figure present on both sides: medians over rounds, branch / base, and with `again`
    (a second set of base runs) the A/A ratio and the noise it shows."""
    figures: dict[str, dict[str, float | None]] = {}
    for key in sorted(set(base[0]) & set(branch[0])):
        if key.rsplit(".", 1)[-1] in (*ROW_KEYS, "seed"):
            continue  # names a row, not a figure
        b, n = _median(base, key), _median(branch, key)
        figure: dict[str, float | None] = {"base": b, "branch": n, "ratio": _ratio(n, b)}
        if again is not None and any(key in r for r in again):
            figure["aa"] = _ratio(_median(again, key), b)
            figure["noise"] = noise([r[key] for r in (*base, *again) if key in r])
        figures[key] = figure
    return figures


def noise(runs: list[float]) -> float | None:
    """How far apart two medians of the same code get: over every way to cut the base runs in
    two halves, the largest ratio of one half's median to the other's, either way up.

    The A/A ratio itself is one such cut, a single draw: a figure that did not move beats a
    single draw half the time. Every cut of the 2 x rounds runs (20 for 3 rounds) gives a
    bound that an unchanged figure rarely exceeds. None when a median is 0.
    """
    half = len(runs) // 2
    worst = 1.0
    for chosen in itertools.combinations(range(len(runs)), half):
        one = statistics.median(runs[i] for i in chosen)
        other = statistics.median(runs[i] for i in range(len(runs)) if i not in chosen)
        if one <= 0 or other <= 0:
            return None
        worst = max(worst, one / other, other / one)
    return round(worst, 3)


def verdict(figures: dict[str, dict[str, float | None]], threshold: float) -> dict[str, Any]:
    """Every figure above `threshold`, each with its A/A noise and whether it is beyond it (a
    figure without an A/A reading cannot be called noise: it counts as beyond)."""
    above = []
    for key, f in figures.items():
        ratio = f["ratio"]
        if ratio is None or ratio <= threshold:
            continue
        noise = f.get("noise")
        above.append(
            {
                "figure": key,
                "base": f["base"],
                "branch": f["branch"],
                "ratio": ratio,
                "aa": f.get("aa"),
                "noise": noise,
                "beyond_noise": noise is None or ratio > noise,
            }
        )
    return {
        "threshold": threshold,
        "compared": len(figures),
        "above_threshold": len(above),
        "beyond_noise": sum(1 for a in above if a["beyond_noise"]),
        "above": above,
    }


def table(found: dict[str, Any]) -> str:
    """The verdict as a markdown table, beyond-noise rows first."""
    lines = [
        f"{found['above_threshold']} of {found['compared']} figures above "
        f"{found['threshold']}x, {found['beyond_noise']} of them beyond their A/A noise",
        "",
        "| figure | base | branch | ratio | A/A | noise | beyond noise |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = sorted(found["above"], key=lambda a: (not a["beyond_noise"], -a["ratio"]))
    for a in rows:
        lines.append(
            f"| `{a['figure']}` | {a['base']:g} | {a['branch']:g} | {a['ratio']}x | "
            f"{a['aa'] if a['aa'] is not None else '-'} | "
            f"{a['noise'] if a['noise'] is not None else '-'} | "
            f"{'yes' if a['beyond_noise'] else 'no'} |"
        )
    return "\n".join(lines)


def _copy(base: Path, scratch: Path) -> Path:
    """The base's files at another path (same directory name), without git's and caches."""
    twin = scratch / base.name
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", ".mypy_cache")
    shutil.copytree(base, twin, ignore=ignore, symlinks=True)
    return twin


def _round(
    i: int,
    args: argparse.Namespace,
    *,
    bench: list[str],
    script: Path | None,
    twin: Path,
    sides: dict[str, list[dict[str, float]]],
) -> None:
    """One round: base, branch and, with --aa, the base's copy; the two base runs swap roles
    every round, so that neither side of the A/A is always the earlier one."""
    before = flatten(run(args.base.resolve(), bench, script))
    sides["branch"].append(flatten(run(HERE, bench + args.branch_only.split(), script)))
    if not args.aa:
        sides["base"].append(before)
        return
    after = flatten(run(twin, bench, script))
    first, second = (before, after) if i % 2 == 0 else (after, before)
    sides["base"].append(first)
    sides["again"].append(second)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the base commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--aa",
        action="store_true",
        help="run the base twice a round and give each figure its A/A noise (1.5x the time)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=1.05,
        help="ratio above which the verdict lists a figure (default 1.05)",
    )
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
    sides: dict[str, list[dict[str, float]]] = {"base": [], "branch": [], "again": []}
    script = args.script.resolve() if args.script else None
    load = [os.getloadavg()]  # the machine's load, for the reader: ratios hold up, times do not
    with tempfile.TemporaryDirectory(prefix="bench-compare-aa-") as scratch:
        twin = _copy(args.base.resolve(), Path(scratch)) if args.aa else args.base.resolve()
        for i in range(args.rounds):
            _round(i, args, bench=bench, script=script, twin=twin, sides=sides)
    load.append(os.getloadavg())
    figures = compare(sides["base"], sides["branch"], sides["again"] if args.aa else None)
    found = verdict(figures, args.threshold)
    print(table(found), file=sys.stderr)
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in figures.items()]
    head = json.dumps(
        {
            "bench": bench,
            "rounds": args.rounds,
            "aa": args.aa,
            "load_1_5_15": {"start": load[0], "end": load[1]},
        }
    )[:-1]
    print(
        head
        + ', "figures": {\n'
        + ",\n".join(lines)
        + '\n}, "verdict": '
        + json.dumps(found, indent=1)
        + "}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
