"""Run one `gputopo bench` side by side on this checkout and on another commit, interleaved.

    git worktree add --detach /tmp/gputopo-base <commit>
    .venv/bin/python scripts/bench_compare.py --base /tmp/gputopo-base --rounds 3 -- \
        placement --sizes 1000,10000

Both sides run with this interpreter and its installed dependencies; each gets its own
checkout first on PYTHONPATH (`--branch DIR` names another checkout than this one as the
branch, e.g. a copy of the base for a same-code control). `--script PATH` runs that script
(this checkout's, with the arguments after `--`) instead of `gputopo bench`: a benchmark older
commits do not have, over an API they share (`scripts/bench_state.py`). Prints JSON: for every
numeric figure of the benchmark's own JSON, the median over rounds on each side and branch /
base.

A ratio alone does not say whether a figure moved: a p99 of 20 samples is its maximum, and
two runs of the same code differ by more than 5 % in it. `--aa` runs the base a second time
in every round, from a copy of the base checkout at another path (made for the run, removed
after: the branch differs from the base in its path too, and identical code at two paths gave
25 of 1,040 placement figures beyond the noise of one checkout run twice).

Paired rounds. Each bench process differs from the next in things that are not the code: the
hash seed Python draws (dict and set layout, collisions, the order of sets of strings, so the
work done), where ASLR puts heap, stack and mappings (cache and TLB aliasing), and what ran
just before it. Five rounds do not average those out, so every side of a round is run alike:
1. the same PYTHONHASHSEED for every side of a round, another for every round (derived from
   `--seed`, printed; `--random-hash-seed` lets each process draw its own, as Python does);
2. ASLR off for every side (`setarch <arch> -R`, when it works here; `--aslr` leaves it on);
   the JSON says which was used. With it off the layout follows the environment and the
   paths: every side runs through a link of one length to its checkout (`--real-paths`: from
   the checkout itself), and an environment variable of a per-round length moves the stack
   as ASLR would, alike for every side of the round;
3. the order of the sides in a round is shuffled (seeded), going through every order before
   one repeats, so no side always runs after the same one (`--fixed-order`: base, branch,
   base copy every round, the two base runs swapping roles, as before);
4. `--pin-cpu N` runs every side on CPU N (off by default: a bench with worker processes,
   such as `bench ingest`, would have them share the one CPU).

Statistics. Per figure: `base`, `branch` (medians over rounds), `ratio` (their quotient: the
unpaired ratio; branch / base, or base / branch for a figure that is better higher, marked
`higher_is_better`, so that a ratio above 1 is worse for every figure), with `--aa` `aa` (the
base copy's median over the base's) and `noise` (over every way to cut the base's runs in two
halves, the largest ratio of their medians, either way
up). Paired: `paired_ratio`, the median over rounds of branch_i / base_i; `paired_aa`, the
same of copy_i / base_i; `paired_noise`, the median over rounds of copy_i / base_i taken the
wider way up (which of two same-code runs of a round is "the base" is arbitrary: this is the
widest paired A/A over every choice). The `verdict` lists every figure (but quotients of two
others, `QUOTIENT`) whose paired or unpaired ratio is above `--threshold`, and calls it
`beyond_noise` when its paired ratio is above the threshold and above its paired noise;
`beyond_noise_unpaired` keeps the earlier rule (the unpaired ratio above the threshold and the
split-halves noise) so the two can be compared.
The split halves are not the paired ratio's yardstick: they see the medians wander between
rounds (load that drifts), which pairing cancels, and would hide a steady regression under it.
`beyond_both` counts the figures beyond under both rules: fewer false alarms where the load
holds still, but a steady regression under drifting load is beyond only paired.

Measured (placement, 1,040 figures, 5 rounds, 67c2cf9 against a copy of itself): the earlier
way 18 figures beyond noise (5 p50s); paired with ASLR off but each side at its own path 77
(the copy steadily 5 % slower); paired through links of one length 11 and 3 (seeds 22, 23)
under the unpaired rule, 14 and 6 under the paired one, 4 and 1 under both. The bench's 446
decision figures were the same under 10 hash seeds.
Nothing is left out. A markdown table of the same goes to stderr, with each round's hash seed
and order; `--runs PATH` keeps every run's figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
# Fields that name a row of a list (which layout, size, shape, policy it is about).
ROW_KEYS = ("layout", "gpus", "node_gpus", "request_gpus", "shape", "policy", "server")
# Figures that are better when higher (the last part of a figure's name): their ratios are
# taken base over branch, so that above 1 means worse for every figure the verdict lists.
HIGHER_IS_BETTER = ("placed", "feasible", "pods_per_second")
# A figure whose name has this in it is the quotient of two others (kueue_over_gputopo_p50,
# churn_over_static_p50, rebuild_over_derive): it moves as much when its denominator gets
# faster as when its numerator gets slower, and both are judged on their own, so it is compared
# and shown but left out of the verdict (`quotients` counts it).
QUOTIENT = "_over_"
# PYTHONHASHSEED takes 0..2**32-1; 0 turns hashing of str and bytes into a fixed, unsalted
# function, which is not how any process runs in production: the seeds are drawn above it.
HASH_SEEDS = range(1, 2**32)
SIDES = ("base", "branch", "again")
# With ASLR off the stack starts where the environment's strings end: an environment variable
# of a round's length moves it as ASLR would, but alike for every side of the round.
PAD = "BENCH_COMPARE_PAD"
# Each side runs through a link of the same length, so that its PYTHONPATH, sys.path and every
# module's __file__ are as long on all sides (with ASLR off their lengths move the stack and
# the heap, and a checkout one character longer was steadily slower or faster).
LINKS = {"base": "base", "branch": "head", "again": "copy"}

Runs = list[dict[str, float]]
Figure = dict[str, float | None]


@dataclass(frozen=True)
class Conditions:
    """How every bench process of a comparison is started, alike for all sides."""

    hash_seeds: bool  # the round's seed in PYTHONHASHSEED (False: each process draws its own)
    prefix: tuple[str, ...]  # a command to run under, such as setarch's -R (empty: as is)
    cpu: int | None  # the one CPU every side runs on (None: wherever the kernel puts it)


def round_seed(seed: int, i: int) -> int:
    """Round i's hash seed: the same for every side of the round, another for every round."""
    return random.Random(f"hash/{seed}/{i}").choice(HASH_SEEDS)


def round_orders(sides: Sequence[str], rounds: int, seed: int) -> list[tuple[str, ...]]:
    """The order of the sides in each round: every ordering once, shuffled, before any repeats.

    With 3 sides and a multiple of 6 rounds every side is first, second and third equally
    often, and after each other side equally often; with fewer rounds as near as it gets.
    """
    rng = random.Random(f"order/{seed}")
    orders: list[tuple[str, ...]] = []
    while len(orders) < rounds:
        cycle = list(itertools.permutations(sides))
        rng.shuffle(cycle)
        orders += cycle
    return orders[:rounds]


def round_pad(seed: int, i: int) -> int:
    """Round i's environment padding in bytes: every 16-byte stack alignment within a page."""
    return random.Random(f"pad/{seed}/{i}").randrange(4096)


def aslr_prefix() -> tuple[tuple[str, ...], str]:
    """setarch's "no address randomisation" for this machine when it works here (it fails in
    containers whose seccomp profile refuses personality(2)), and what was decided, in words."""
    prefix = ("setarch", platform.machine(), "-R")
    try:
        subprocess.run([*prefix, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return (), f"on: `{' '.join(prefix)}` does not work here ({type(e).__name__})"
    return prefix, f"off: {' '.join(prefix)}"


def run(
    checkout: Path,
    bench: list[str],
    script: Path | None = None,
    *,
    conditions: Conditions = Conditions(hash_seeds=False, prefix=(), cpu=None),
    hash_seed: int | None = None,
    pad: int = 0,
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("PYTHONHASHSEED", None)  # "random", Python's default, unless the round sets one
    if conditions.hash_seeds and hash_seed is not None:
        env["PYTHONHASHSEED"] = str(hash_seed)
    env.pop(PAD, None)
    if pad:
        env[PAD] = "x" * pad
    command = [str(script), *bench] if script else ["-m", "gputopo", "bench", *bench, "--json"]
    pin: Callable[[], None] | None = None
    if conditions.cpu is not None:
        cpu = conditions.cpu

        def pin() -> None:
            os.sched_setaffinity(0, {cpu})

    out = subprocess.run(
        [*conditions.prefix, sys.executable, *command],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=pin,
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


def _median(runs: Runs, key: str) -> float:
    return statistics.median(r[key] for r in runs if key in r)


def _ratio(top: float, bottom: float) -> float | None:
    return round(top / bottom, 3) if bottom else None


def per_round(top: Runs, bottom: Runs, key: str) -> list[float]:
    """top_i / bottom_i for every round i where both have the figure and bottom_i is not 0."""
    return [
        t[key] / b[key]
        for t, b in zip(top, bottom, strict=True)
        if key in t and key in b and b[key]
    ]


def paired_ratio(ratios: list[float]) -> float | None:
    """The median of per-round ratios: what is left of a difference once each round is
    compared with itself (load that drifts between rounds cancels)."""
    return round(statistics.median(ratios), 3) if ratios else None


def paired_noise(aa: list[float]) -> float | None:
    """The median over rounds of each round's A/A ratio taken the wider way up.

    In a round the two runs of the same code are interchangeable, so every choice of which is
    "the base" gives a paired A/A; the widest of them, either way up, is this median (it is
    never below the paired A/A or its inverse). None when a ratio is not positive.
    """
    if not aa or any(r <= 0 for r in aa):
        return None
    return round(statistics.median(max(r, 1 / r) for r in aa), 3)


def compare(base: Runs, branch: Runs, again: Runs | None = None) -> dict[str, Figure]:
    """Per figure present on both sides: medians over rounds, branch / base unpaired and
    paired, and with `again` (a second set of base runs, round for round) the A/A ratios and
    the noises they show. The run lists are in round order: index i of each is round i."""
    figures: dict[str, Figure] = {}
    for key in sorted(set(base[0]) & set(branch[0])):
        if key.rsplit(".", 1)[-1] in (*ROW_KEYS, "seed"):
            continue  # names a row, not a figure
        b, n = _median(base, key), _median(branch, key)
        up = key.rsplit(".", 1)[-1] in HIGHER_IS_BETTER
        figure: Figure = {"base": b, "branch": n, "ratio": _ratio(b, n) if up else _ratio(n, b)}
        if up:
            figure["higher_is_better"] = 1
        figure["paired_ratio"] = paired_ratio(
            per_round(base, branch, key) if up else per_round(branch, base, key)
        )
        if again is not None and any(key in r for r in again):
            a = _median(again, key)
            figure["aa"] = _ratio(b, a) if up else _ratio(a, b)
            figure["noise"] = noise([r[key] for r in (*base, *again) if key in r])
            aa = per_round(base, again, key) if up else per_round(again, base, key)
            figure["paired_aa"] = paired_ratio(aa)
            figure["paired_noise"] = paired_noise(aa)
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


def _over(ratio: float | None, threshold: float) -> bool:
    return ratio is not None and ratio > threshold


def _beyond(ratio: float | None, threshold: float, noises: list[float | None]) -> bool:
    """Above the threshold and every noise; a figure without a noise reading cannot be called
    noise: it counts as beyond."""
    if ratio is None or ratio <= threshold:
        return False
    known = [n for n in noises if n is not None]
    return len(known) < len(noises) or ratio > max(known)


def verdict(figures: dict[str, Figure], threshold: float) -> dict[str, Any]:
    """Every figure whose paired or unpaired ratio is above `threshold`, with both noises and
    whether it is beyond them under the paired rule and under the earlier unpaired one."""
    above: list[dict[str, Any]] = []
    quotients = 0
    for key, f in figures.items():
        if QUOTIENT in key.rsplit(".", 1)[-1]:
            quotients += 1
            continue
        ratio, paired = f["ratio"], f.get("paired_ratio")
        if not (_over(ratio, threshold) or _over(paired, threshold)):
            continue
        # Without an A/A there is no noise to judge by (the figure counts as beyond).
        noises: list[float | None] = [f.get("paired_noise")] if "noise" in f else [None]
        above.append(
            {
                "figure": key,
                "higher_is_better": bool(f.get("higher_is_better")),
                "base": f["base"],
                "branch": f["branch"],
                "ratio": ratio,
                "aa": f.get("aa"),
                "noise": f.get("noise"),
                "paired_ratio": paired,
                "paired_aa": f.get("paired_aa"),
                "paired_noise": f.get("paired_noise"),
                "beyond_noise": _beyond(paired, threshold, noises),
                "beyond_noise_unpaired": _beyond(ratio, threshold, [f.get("noise")]),
            }
        )

    return {
        "threshold": threshold,
        "compared": len(figures) - quotients,
        "quotients": quotients,
        "above_threshold": sum(1 for a in above if _over(a["paired_ratio"], threshold)),
        "beyond_noise": sum(1 for a in above if a["beyond_noise"]),
        "unpaired": {
            "above_threshold": sum(1 for a in above if _over(a["ratio"], threshold)),
            "beyond_noise": sum(1 for a in above if a["beyond_noise_unpaired"]),
        },
        # Beyond under both rules: within-round and between-round noise both exceeded.
        "beyond_both": sum(1 for a in above if a["beyond_noise"] and a["beyond_noise_unpaired"]),
        "above": above,
    }


def _cell(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:g}{suffix}"


def table(found: dict[str, Any]) -> str:
    """The verdict as a markdown table, beyond-noise rows first."""
    unpaired = found["unpaired"]
    lines = [
        f"{found['above_threshold']} of {found['compared']} figures above "
        f"{found['threshold']}x paired, {found['beyond_noise']} of them beyond their noise; "
        f"unpaired (ratio of medians against the split-halves noise): "
        f"{unpaired['above_threshold']} above, {unpaired['beyond_noise']} beyond; "
        f"{found['beyond_both']} beyond under both rules",
        "",
        "| figure | base | branch | ratio | A/A | noise | paired ratio | paired A/A "
        "| paired noise | beyond noise | beyond, unpaired |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted(
        found["above"],
        key=lambda a: (not a["beyond_noise"], -(a["paired_ratio"] or a["ratio"] or 0.0)),
    )
    for a in rows:
        lines.append(
            f"| `{a['figure']}`{' (higher is better)' if a.get('higher_is_better') else ''} "
            f"| {a['base']:g} | {a['branch']:g} | {_cell(a['ratio'], 'x')} | "
            f"{_cell(a['aa'])} | {_cell(a['noise'])} | {_cell(a['paired_ratio'], 'x')} | "
            f"{_cell(a['paired_aa'])} | {_cell(a['paired_noise'])} | "
            f"{'yes' if a['beyond_noise'] else 'no'} | "
            f"{'yes' if a['beyond_noise_unpaired'] else 'no'} |"
        )
    return "\n".join(lines)


def _copy(base: Path, scratch: Path) -> Path:
    """The base's files at another path (same directory name), without git's and caches."""
    twin = scratch / base.name
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", ".mypy_cache")
    shutil.copytree(base, twin, ignore=ignore, symlinks=True)
    return twin


@dataclass(frozen=True)
class Plan:
    """Where each side runs from, what it runs, and how every process is started."""

    checkouts: dict[str, Path]  # side -> checkout; "again" only with --aa
    bench: list[str]
    branch_only: list[str]
    script: Path | None
    conditions: Conditions


def _round(
    plan: Plan, order: tuple[str, ...], hash_seed: int, pad: int, *, swap: bool
) -> dict[str, Any]:
    """One round: every side once, in `order`, all with the round's hash seed and padding.
    With `swap` the two base runs trade roles (the fixed order's way of not always calling the
    earlier one the base)."""
    runs: dict[str, dict[str, float]] = {}
    for side in order:
        extra = plan.branch_only if side == "branch" else []
        runs[side] = flatten(
            run(
                plan.checkouts[side],
                plan.bench + extra,
                plan.script,
                conditions=plan.conditions,
                hash_seed=hash_seed,
                pad=pad,
            )
        )
    if swap and "again" in runs:
        runs["base"], runs["again"] = runs["again"], runs["base"]
    return runs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the base commit")
    parser.add_argument(
        "--branch",
        type=Path,
        default=HERE,
        help="checkout to compare with the base (default: this one); a copy of the base makes"
        " a same-code control",
    )
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
    parser.add_argument(
        "--seed",
        type=int,
        help="seed of the rounds' hash seeds and orders (default: drawn, and printed)",
    )
    parser.add_argument(
        "--random-hash-seed",
        action="store_true",
        help="let every process draw its own hash seed instead of the round's",
    )
    parser.add_argument(
        "--aslr", action="store_true", help="leave address randomisation on (no setarch -R)"
    )
    parser.add_argument(
        "--fixed-order",
        action="store_true",
        help="base, branch, base copy in every round (the two base runs swap roles) instead"
        " of a shuffled order",
    )
    parser.add_argument(
        "--real-paths",
        action="store_true",
        help="run each side from its own path instead of through links of one length",
    )
    parser.add_argument(
        "--pin-cpu",
        type=int,
        metavar="N",
        help="run every bench process on CPU N alone (one of this process's CPUs)",
    )
    parser.add_argument(
        "--runs",
        type=Path,
        metavar="PATH",
        help="write every run's figures there as JSON lines (round, side, hash seed), each"
        " round as it ends: the medians' inputs, and what a crash mid-run would keep",
    )
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- NAME [benchmark flags]")
    return parser


def _checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is not a positive number of rounds")
    for flag, path in (("--base", args.base), ("--branch", args.branch)):
        if not path.is_dir():
            parser.error(f"{flag}: {path} is not a directory")
    if args.pin_cpu is not None and args.pin_cpu not in os.sched_getaffinity(0):
        allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        parser.error(f"--pin-cpu: CPU {args.pin_cpu} is not one this process may use ({allowed})")


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    _checked(parser, args)
    if args.runs:
        args.runs.write_text("")  # this comparison's runs only
    bench = [a for a in args.bench if a != "--"]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    prefix, aslr = ((), "on: --aslr") if args.aslr else aslr_prefix()
    conditions = Conditions(hash_seeds=not args.random_hash_seed, prefix=prefix, cpu=args.pin_cpu)
    sides: tuple[str, ...] = SIDES if args.aa else SIDES[:2]
    fixed = [sides] * args.rounds
    orders = fixed if args.fixed_order else round_orders(sides, args.rounds, seed)
    seeds = [round_seed(seed, i) for i in range(args.rounds)]
    pads = [round_pad(seed, i) if prefix else 0 for i in range(args.rounds)]
    sides_runs: dict[str, Runs] = {side: [] for side in SIDES}
    rounds: list[dict[str, Any]] = []
    load = [os.getloadavg()]  # the machine's load, for the reader: ratios hold up, times do not
    print(f"seed {seed}; ASLR {aslr}; CPU {args.pin_cpu if args.pin_cpu is not None else 'any'}",
          file=sys.stderr)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-compare-aa-") as scratch:
        checkouts = {"base": args.base.resolve(), "branch": args.branch.resolve()}
        if args.aa:
            checkouts["again"] = _copy(checkouts["base"], Path(scratch))
        if not args.real_paths:
            (Path(scratch) / "at").mkdir()
            for side, checkout in list(checkouts.items()):
                checkouts[side] = Path(scratch) / "at" / LINKS[side]
                checkouts[side].symlink_to(checkout, target_is_directory=True)
        plan = Plan(
            checkouts=checkouts,
            bench=bench,
            branch_only=args.branch_only.split(),
            script=args.script.resolve() if args.script else None,
            conditions=conditions,
        )
        for i, (order, hash_seed, pad) in enumerate(zip(orders, seeds, pads, strict=True)):
            shown = hash_seed if conditions.hash_seeds else "random"
            print(
                f"round {i + 1}: hash seed {shown}, pad {pad}, order {', '.join(order)}",
                file=sys.stderr,
            )
            runs = _round(plan, order, hash_seed, pad, swap=args.fixed_order and i % 2 == 1)
            shown_seed = hash_seed if conditions.hash_seeds else None
            for side, figures in runs.items():
                sides_runs[side].append(figures)
                if args.runs:
                    line = {
                        "round": i + 1,
                        "side": side,
                        "hash_seed": shown_seed,
                        "figures": figures,
                    }
                    with args.runs.open("a") as out:
                        out.write(json.dumps(line) + "\n")
            rounds.append({"hash_seed": shown_seed, "pad": pad, "order": list(order)})
    load.append(os.getloadavg())
    again = sides_runs["again"] if args.aa else None
    figures = compare(sides_runs["base"], sides_runs["branch"], again)
    found = verdict(figures, args.threshold)
    print(table(found), file=sys.stderr)
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in figures.items()]
    head = json.dumps(
        {
            "bench": bench,
            "base": str(args.base.resolve()),
            "branch": str(args.branch.resolve()),
            "rounds": args.rounds,
            "aa": args.aa,
            "seed": seed,
            "hash_seeds": "per round" if conditions.hash_seeds else "random per process",
            "aslr": aslr,
            "order": "fixed" if args.fixed_order else "shuffled",
            "paths": "real" if args.real_paths else "links of one length",
            "pin_cpu": args.pin_cpu,
            "round_conditions": rounds,
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
