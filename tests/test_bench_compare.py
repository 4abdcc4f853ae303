"""scripts/bench_compare.py: medians per side, the A/A noise of each figure, and a verdict that
lists every figure above the threshold and calls it beyond noise only when it is."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_compare.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compare", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench_compare = _load()


@dataclass(frozen=True)
class VerdictCase:
    id: str
    base: list[float]
    branch: list[float]
    again: list[float] | None
    want_listed: bool
    want_beyond_noise: bool | None = None
    want_noise: float | None = None


CASES = [
    VerdictCase(
        "a figure within 5 % is not listed",
        base=[10, 10, 10],
        branch=[10.4, 10.5, 10.4],
        again=[10, 10, 10],
        want_listed=False,
    ),
    VerdictCase(
        "slower than the base and steady between base runs: beyond noise",
        base=[10, 10, 10],
        branch=[12, 12, 12],
        again=[10, 10, 10.1],
        want_listed=True,
        want_beyond_noise=True,
        want_noise=1.0,
    ),
    VerdictCase(
        "a p99 that moves 30 % between two base runs: listed, but within its noise",
        base=[10, 10, 10],
        branch=[11, 11, 11],
        again=[13, 13, 13],
        want_listed=True,
        want_beyond_noise=False,
        want_noise=1.3,
    ),
    VerdictCase(
        "noise counts in both directions: the second base run faster by 20 %",
        base=[10, 10, 10],
        branch=[11, 11, 11],
        again=[8, 8, 8],
        want_listed=True,
        want_beyond_noise=False,
        want_noise=1.25,
    ),
    VerdictCase(
        "an A/A draw that happens to agree does not make a spread figure beyond noise",
        base=[10, 13, 11.5],
        branch=[12.5, 12.5, 12.5],
        again=[13, 10, 11.5],
        want_listed=True,
        want_beyond_noise=False,
        want_noise=1.3,  # the cut {10, 10, 11.5} against {13, 13, 11.5}; the A/A itself is 1.0
    ),
    VerdictCase(
        "without an A/A reading nothing can be called noise",
        base=[10, 10, 10],
        branch=[11, 11, 11],
        again=None,
        want_listed=True,
        want_beyond_noise=True,
    ),
    VerdictCase(
        "medians over rounds: one slow round of the branch does not list it",
        base=[10, 10, 10],
        branch=[10, 30, 10],
        again=[10, 10, 10],
        want_listed=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_verdict(case: VerdictCase) -> None:
    def runs(values: list[float]) -> list[dict[str, float]]:
        return [{"latency[nvl72/pd].p99_ms": v, "latency[nvl72/pd].gpus": 1008} for v in values]

    again = runs(case.again) if case.again is not None else None
    figures = bench_compare.compare(runs(case.base), runs(case.branch), again)
    assert list(figures) == ["latency[nvl72/pd].p99_ms"]  # the row's name is not a figure
    found = bench_compare.verdict(figures, 1.05)
    assert found["compared"] == 1
    assert found["above_threshold"] == int(case.want_listed)
    if not case.want_listed:
        assert found["above"] == []
        return
    (row,) = found["above"]
    assert row["beyond_noise"] is case.want_beyond_noise
    assert row["noise"] == case.want_noise
    assert found["beyond_noise"] == int(bool(case.want_beyond_noise))


@pytest.mark.parametrize(
    ("branch", "want_listed"),
    [([7.0, 7.0, 7.0], True), ([13.0, 13.0, 13.0], False), ([10.0, 10.0, 10.0], False)],
    ids=["lower-is-worse", "higher-is-not-listed", "unchanged"],
)
def test_a_figure_better_higher_is_worse_when_it_falls(
    branch: list[float], want_listed: bool
) -> None:
    """A gang's pods per second rises when the binder gets faster: base / branch is its ratio."""
    key = "stream.pods_per_second"
    runs = lambda values: [{key: v} for v in values]  # noqa: E731
    base = runs([10.0, 10.0, 10.0])
    figures = bench_compare.compare(base, runs(branch), runs([10.0, 10.0, 10.0]))
    assert figures[key]["higher_is_better"] == 1
    assert figures[key]["ratio"] == round(10.0 / branch[0], 3)
    assert figures[key]["paired_ratio"] == round(10.0 / branch[0], 3)
    found = bench_compare.verdict(figures, 1.05)
    assert [a["figure"] for a in found["above"]] == ([key] if want_listed else [])
    if want_listed:
        assert found["above"][0]["higher_is_better"] is True
        assert found["above"][0]["beyond_noise"] is True


def test_a_quotient_of_two_figures_is_compared_but_not_judged() -> None:
    """kueue_over_gputopo_p50 falls when kueue-bestfit gets faster: its two latencies are
    judged, the quotient is only shown."""
    quotient = "kueue_over_gputopo_p50[nvl72/1008/tp8].kueue_over_gputopo_p50"
    kueue = "latency[nvl72/1008/tp8/kueue-bestfit].p50_ms"
    base = [{quotient: 4.0, kueue: 4.0}] * 3
    branch = [{quotient: 2.0, kueue: 2.0}] * 3
    figures = bench_compare.compare(base, branch, base)
    assert figures[quotient]["ratio"] == 0.5
    found = bench_compare.verdict(figures, 1.05)
    assert (found["compared"], found["quotients"], found["above"]) == (1, 1, [])
    found = bench_compare.verdict(bench_compare.compare(branch, base, branch), 1.05)
    assert [a["figure"] for a in found["above"]] == [kueue]  # the latency, not its quotient


def test_noise_is_the_widest_cut_of_the_base_runs() -> None:
    assert bench_compare.noise([5.0, 5.0, 5.0, 5.0]) == 1.0
    assert bench_compare.noise([10.0, 12.0]) == 1.2
    # 2 of 4 runs slow: the cut that puts both on one side is 1.5x, whatever the A/A drew.
    assert bench_compare.noise([10.0, 15.0, 10.0, 15.0]) == 1.5
    assert bench_compare.noise([0.0, 0.0, 1.0, 1.0]) is None


def test_a_zero_base_has_no_ratio_and_is_not_listed() -> None:
    figures = bench_compare.compare([{"errors": 0.0}], [{"errors": 3.0}], [{"errors": 0.0}])
    assert figures["errors"] == {"base": 0.0, "branch": 3.0, "ratio": None, "aa": None,
                                 "noise": None, "paired_ratio": None, "paired_aa": None,
                                 "paired_noise": None}  # fmt: skip
    assert bench_compare.verdict(figures, 1.05)["above"] == []


# A benchmark script for both sides: the base side (run in the base checkout) counts its runs
# in a file, and reads a figure that alternates between runs; the branch side is slower in one.
FAKE_BENCH = """
import json, os, pathlib, sys
base = pathlib.Path.cwd().name == "base"  # the base checkout or its A/A copy
if base:
    with open(os.environ["FAKE_PATHS"], "a") as seen:
        seen.write(str(pathlib.Path.cwd()) + "\\n")
    counter = pathlib.Path(os.environ["FAKE_COUNTER"])
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    noisy = 10.0 if n in (1, 4) else 13.0
else:
    noisy = 11.0
print(json.dumps({"steady": 5.0, "slower": 10.0 if base else 12.0, "noisy": noisy,
                  "rows": [{"layout": "x", "p50_ms": 1.0}]}))
"""


# The comparison as it ran before paired rounds: each process its own hash seed and address
# layout, the sides always base, branch, base copy.
OLD_WAY = ["--random-hash-seed", "--aslr", "--fixed-order", "--real-paths"]


def test_interleaved_runs_with_aa_end_to_end(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    fake = tmp_path / "fake_bench.py"
    fake.write_text(FAKE_BENCH)
    counter = tmp_path / "count"
    paths = tmp_path / "paths"
    env = {**os.environ, "FAKE_COUNTER": str(counter), "FAKE_PATHS": str(paths)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--base", str(base), "--rounds", "2", "--aa",
         "--script", str(fake), *OLD_WAY],
        check=True, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    out: dict[str, Any] = json.loads(done.stdout)
    # Two base runs a round: base, branch, base again, the roles of the two swapping per round
    # (runs 1 and 4 count as the base, 2 and 3 as its A/A twin).
    assert counter.read_text() == "4"
    # The A/A twin is a copy of the base at another path, removed after the run.
    where = paths.read_text().split()
    assert where[0] == str(base)
    assert where[1] != str(base)
    assert where.count(str(base)) == 2
    assert not Path(where[1]).exists()
    assert len(out["load_1_5_15"]["start"]) == len(out["load_1_5_15"]["end"]) == 3
    figures = out["figures"]
    assert figures["steady"] == {"base": 5.0, "branch": 5.0, "ratio": 1.0, "aa": 1.0,
                                 "noise": 1.0, "paired_ratio": 1.0, "paired_aa": 1.0,
                                 "paired_noise": 1.0}  # fmt: skip
    assert figures["noisy"]["aa"] == 1.3
    # Paired: round 1 compares 11 with the base's 10 (its copy read 13), round 2 likewise with
    # the roles swapped, so both rounds' A/A is 1.3.
    assert figures["noisy"]["paired_ratio"] == 1.1
    assert figures["noisy"]["paired_noise"] == 1.3
    assert figures["rows[x].p50_ms"]["ratio"] == 1.0
    verdict = out["verdict"]
    rules = [(a["figure"], a["beyond_noise"], a["beyond_noise_unpaired"]) for a in verdict["above"]]
    assert rules == [("noisy", False, False), ("slower", True, True)]
    assert "2 of 4 figures above 1.05x paired, 1 of them beyond their noise" in done.stderr
    assert (
        "unpaired (ratio of medians against the split-halves noise): 2 above, 1 beyond; "
        "1 beyond under both rules"
    ) in done.stderr
    assert verdict["beyond_both"] == 1
    assert "| `slower` | 10 | 12 | 1.2x | 1 | 1 | 1.2x | 1 | 1 | yes | yes |" in done.stderr
    assert out["hash_seeds"] == "random per process"
    assert out["order"] == "fixed"
    assert out["aslr"] == "on: --aslr"
