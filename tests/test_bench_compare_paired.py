"""scripts/bench_compare.py's paired rounds: every side of a round starts alike (one hash seed,
no address randomisation, the same CPU when asked), the order of the sides is shuffled, and a
figure is judged by the median of its per-round ratios against the same of the base's copy."""

from __future__ import annotations

import itertools
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.test_bench_compare import OLD_WAY, SCRIPT, bench_compare

# personality(2)'s ADDR_NO_RANDOMIZE, what `setarch -R` sets (linux/personality.h).
ADDR_NO_RANDOMIZE = 0x0040000


@dataclass(frozen=True)
class PairedCase:
    id: str
    base: list[float]
    branch: list[float]
    again: list[float]
    want_paired_ratio: float
    want_paired_noise: float | None
    want_noise: float | None
    want_beyond: bool
    want_beyond_unpaired: bool


CASES = [
    PairedCase(
        "load that drifts between rounds cancels: a steady 8 % slower branch is beyond noise"
        " paired, while the split halves call it noise",
        base=[10, 20, 30],
        branch=[10.8, 21.6, 32.4],
        again=[10.1, 20.2, 30.3],
        want_paired_ratio=1.08,
        want_paired_noise=1.01,
        want_noise=2.97,  # {10, 10.1, 20} against {20.2, 30, 30.3}
        want_beyond=True,
        want_beyond_unpaired=False,
    ),
    PairedCase(
        "the same code 20 % apart within a round, either way up, is noise the split halves miss",
        base=[10, 10, 10],
        branch=[11.5, 11.5, 11.5],
        again=[12, 8, 10],  # A/A 1.2, 0.8, 1.0: its median 1.0, the wider way up 1.2, 1.25, 1
        want_paired_ratio=1.15,
        want_paired_noise=1.2,
        want_noise=1.0,
        want_beyond=False,
        want_beyond_unpaired=True,
    ),
    PairedCase(
        "slower in every round beside a steady A/A: beyond both noises",
        base=[10, 10, 10],
        branch=[12, 12, 12],
        again=[10, 10, 10.1],
        want_paired_ratio=1.2,
        want_paired_noise=1.0,
        want_noise=1.0,
        want_beyond=True,
        want_beyond_unpaired=True,
    ),
    PairedCase(
        "one slow round of the branch: the median of per-round ratios does not list it",
        base=[10, 10, 10],
        branch=[10, 30, 10],
        again=[10, 10, 10],
        want_paired_ratio=1.0,
        want_paired_noise=1.0,
        want_noise=1.0,
        want_beyond=False,
        want_beyond_unpaired=False,
    ),
    PairedCase(
        "a round whose base reads 0 is left out of the pairs; a split with a 0 median has no"
        " noise, so the unpaired rule cannot call it noise",
        base=[0, 10, 10],
        branch=[5, 11, 11],
        again=[0, 10, 10],
        want_paired_ratio=1.1,
        want_paired_noise=1.0,
        want_noise=None,
        want_beyond=True,
        want_beyond_unpaired=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_paired_ratio_and_noise(case: PairedCase) -> None:
    def runs(values: list[float]) -> list[dict[str, float]]:
        return [{"p50_ms": v} for v in values]

    figures = bench_compare.compare(runs(case.base), runs(case.branch), runs(case.again))
    figure = figures["p50_ms"]
    assert figure["paired_ratio"] == case.want_paired_ratio
    assert figure["paired_noise"] == case.want_paired_noise
    assert figure["noise"] == case.want_noise
    found = bench_compare.verdict(figures, 1.05)
    listed = [a for a in found["above"] if a["figure"] == "p50_ms"]
    if not (case.want_beyond or case.want_beyond_unpaired) and case.want_paired_ratio <= 1.05:
        assert listed == [] or listed[0]["paired_ratio"] <= 1.05
        assert found["beyond_noise"] == found["unpaired"]["beyond_noise"] == 0
        return
    (row,) = listed
    assert (row["beyond_noise"], row["beyond_noise_unpaired"]) == (
        case.want_beyond,
        case.want_beyond_unpaired,
    )
    assert found["beyond_noise"] == int(case.want_beyond)
    assert found["unpaired"]["beyond_noise"] == int(case.want_beyond_unpaired)
    assert found["beyond_both"] == int(case.want_beyond and case.want_beyond_unpaired)


def test_paired_noise_is_never_below_the_paired_aa_either_way_up() -> None:
    for aa in ([1.2, 0.8, 1.0], [0.9, 0.95, 0.97], [1.1, 1.3, 0.7, 1.0, 1.05]):
        noise = bench_compare.paired_noise(aa)
        median = bench_compare.paired_ratio(aa)
        assert noise is not None
        assert median is not None
        assert noise >= max(median, 1 / median) - 0.001  # both rounded to 3 places
    assert bench_compare.paired_noise([]) is None
    assert bench_compare.paired_noise([1.0, 0.0]) is None


def test_round_seeds_differ_between_rounds_and_repeat_with_the_seed() -> None:
    seeds = [bench_compare.round_seed(22, i) for i in range(200)]
    assert len(set(seeds)) == 200
    assert all(1 <= s < 2**32 for s in seeds)  # PYTHONHASHSEED's range, without 0
    assert seeds == [bench_compare.round_seed(22, i) for i in range(200)]
    assert seeds != [bench_compare.round_seed(23, i) for i in range(200)]


def test_orders_go_through_every_permutation_before_one_repeats() -> None:
    sides = ("base", "branch", "again")
    orders = bench_compare.round_orders(sides, 12, seed=5)
    for cycle in (orders[:6], orders[6:]):
        assert sorted(cycle) == sorted(itertools.permutations(sides))
    # Over a whole cycle each side is at each position, and follows each other side, equally.
    positions = Counter((side, i) for order in orders[:6] for i, side in enumerate(order))
    assert set(positions.values()) == {2}
    follows = Counter(pair for order in orders[:6] for pair in itertools.pairwise(order))
    assert set(follows.values()) == {2}
    assert orders != bench_compare.round_orders(sides, 12, seed=6)
    assert sorted(bench_compare.round_orders(sides[:2], 2, seed=5)) == [
        ("base", "branch"),
        ("branch", "base"),
    ]


# A benchmark that reports how it was started: where it ran, its hash seed and what a string
# hashes to under it, its personality (ASLR) and the CPUs it may run on. It logs the same to a
# file, one line a run, so the test sees the order of the runs.
CONDITIONS_BENCH = """
import json, os, pathlib, sys
personality = pathlib.Path("/proc/self/personality")
seen = {
    "where": str(pathlib.Path.cwd()),
    "seed": os.environ.get("PYTHONHASHSEED"),
    "hash": hash("gputopo"),
    "personality": int(personality.read_text(), 16) if personality.exists() else None,
    "cpus": sorted(os.sched_getaffinity(0)),
    "path": os.environ["PYTHONPATH"],
    "pad": len(os.environ.get("BENCH_COMPARE_PAD", "")),
    "environment": sum(len(k) + len(v) + 2 for k, v in os.environ.items()),
}
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(seen) + "\\n")
print(json.dumps({"steady": 5.0}))
"""


def _compare(tmp_path: Path, *flags: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """bench_compare over CONDITIONS_BENCH with `flags`: its JSON, the runs' log, its stderr."""
    for side in ("base", "branch"):
        (tmp_path / side).mkdir(exist_ok=True)
    fake = tmp_path / "conditions_bench.py"
    fake.write_text(CONDITIONS_BENCH)
    log = tmp_path / "log"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--base", str(tmp_path / "base"),
         "--branch", str(tmp_path / "branch"), "--aa", "--script", str(fake), *flags],
        check=True, capture_output=True, text=True, timeout=120,
        env={**os.environ, "FAKE_LOG": str(log), "PYTHONHASHSEED": "1"},
    )  # fmt: skip
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    return json.loads(done.stdout), runs, done.stderr


def _side(tmp_path: Path, where: str) -> str:
    if where == str(tmp_path / "base"):
        return "base"
    return "branch" if where == str(tmp_path / "branch") else "again"


def _setarch_works() -> bool:
    try:
        done = subprocess.run(["setarch", platform.machine(), "-R", "true"], check=False)
    except OSError:
        return False
    return done.returncode == 0


def _own_personality() -> int | None:
    own = Path("/proc/self/personality")
    return int(own.read_text(), 16) if own.exists() else None


def test_every_side_of_a_round_starts_alike(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    written = tmp_path / "runs.jsonl"
    written.write_text("a line of an earlier comparison\n")
    out, runs, stderr = _compare(
        tmp_path, "--rounds", "6", "--seed", "22", "--pin-cpu", str(cpu), "--runs", str(written)
    )
    rounds = out["round_conditions"]
    assert len(runs) == 18
    assert out["branch"] == str(tmp_path / "branch")
    # One seed a round, shared by its three runs (so they hash alike), another every round.
    seeds = [r["hash_seed"] for r in rounds]
    assert seeds == [bench_compare.round_seed(22, i) for i in range(6)]
    assert len(set(seeds)) == 6
    for i, (conditions, three) in enumerate(
        zip(rounds, [runs[j : j + 3] for j in range(0, 18, 3)], strict=True)
    ):
        assert [run["seed"] for run in three] == [str(conditions["hash_seed"])] * 3
        assert len({run["hash"] for run in three}) == 1
        assert [_side(tmp_path, run["where"]) for run in three] == conditions["order"]
        pad = conditions["pad"]
        assert f"round {i + 1}: hash seed {conditions['hash_seed']}, pad {pad}, order" in stderr
        # Each side through a link of one length to its checkout, in an environment of one
        # size: the round's pad on top of it.
        assert [run["pad"] for run in three] == [pad] * 3
        assert len({len(run["path"]) for run in three}) == 1
        assert len({run["environment"] for run in three}) == 1
        # (the links are gone with the run; the cwd, which the kernel resolves, is the checkout)
        assert [Path(run["path"]).name for run in three] == [
            bench_compare.LINKS[side] for side in conditions["order"]
        ]
    # The order rotates: over 6 rounds every permutation of the three sides once.
    assert sorted(tuple(r["order"]) for r in rounds) == sorted(
        itertools.permutations(("base", "branch", "again"))
    )
    assert all(run["cpus"] == [cpu] for run in runs)
    # --runs keeps every run's figures, labelled, and only this comparison's.
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    assert [(line["round"], line["side"], line["hash_seed"]) for line in lines] == [
        (i + 1, side, r["hash_seed"]) for i, r in enumerate(rounds) for side in r["order"]
    ]
    assert all(line["figures"] == {"steady": 5.0} for line in lines)
    # ASLR off where setarch works here (the JSON says which); the runs' personality agrees.
    off = out["aslr"].startswith("off: setarch")
    assert off == _setarch_works()
    # The pad stands in for the stack's randomisation where ASLR is off: one per round.
    assert [r["pad"] for r in rounds] == [
        bench_compare.round_pad(22, i) if off else 0 for i in range(6)
    ]
    assert out["paths"] == "links of one length"
    for run in runs:
        if run["personality"] is not None:
            assert bool(run["personality"] & ADDR_NO_RANDOMIZE) == (
                off or bool((_own_personality() or 0) & ADDR_NO_RANDOMIZE)
            )


def test_the_old_way_leaves_each_process_as_python_starts_it(tmp_path: Path) -> None:
    out, runs, stderr = _compare(tmp_path, "--rounds", "2", *OLD_WAY)
    assert (out["hash_seeds"], out["aslr"], out["order"]) == (
        "random per process",
        "on: --aslr",
        "fixed",
    )
    # No PYTHONHASHSEED reaches the bench, not even the caller's: each process draws its own.
    assert all(run["seed"] is None for run in runs)
    assert all(run["pad"] == 0 and run["path"] == run["where"] for run in runs)
    assert [_side(tmp_path, run["where"]) for run in runs] == ["base", "branch", "again"] * 2
    assert all(run["personality"] == _own_personality() for run in runs)
    assert "hash seed random" in stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--branch", "/nonexistent/checkout"], "--branch: /nonexistent/checkout is not a"),
        (["--pin-cpu", "100000"], "--pin-cpu: CPU 100000 is not one this process may use"),
        (["--rounds", "0"], "--rounds: 0 is not a positive number of rounds"),
    ],
)
def test_bad_options_are_refused_naming_the_flag(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--base", str(tmp_path), *flags, "--", "placement"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr
