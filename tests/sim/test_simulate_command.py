"""`gputopo simulate` end to end on small traces: every policy in one run, JSON, table, plots,
and errors that name the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputopo.app.cli import main
from gputopo.sim.engine import SIM_POLICIES

DATA = Path(__file__).parent.parent / "data" / "traces"
LINGJUN = DATA / "alibaba_lingjun2023_topo.csv"


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    out = capsys.readouterr()
    assert "gputopo simulate:" in out.err  # progress on stderr, JSON alone on stdout
    return json.loads(out.out)


def test_every_policy_replays_the_same_kalos_and_llm_jobs_on_lingjun(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = _json(
        capsys,
        [
            "--cluster",
            f"lingjun:{LINGJUN}",
            "--trace",
            f"kalos:{DATA / 'acme_kalos_converted_hyunnnchoi.csv'}",
            "--trace",
            "llm:40@2",
            "--limit",
            "70",
            "--backfill",
        ],
    )
    assert data["cluster"] == {"source": "lingjun:dgx-h100", "nodes": 847, "gpus": 6776}
    assert [p["policy"] for p in data["policies"]] == list(SIM_POLICIES)
    for p in data["policies"]:
        assert p["jobs"]["total"] == 70
        assert p["jobs"]["ran"] + sum(p["jobs"]["dropped"].values()) == 70
        assert p["jct_s"]["p99"] >= p["jct_s"]["p50"] > 0
        assert 0 < p["allocation"] <= 1
        assert p["comm_slowdown"]["mean"] >= 1
        assert p["series"]["time_s"]
        assert len(p["series"]["allocation"]) == len(p["series"]["time_s"])
    sources = data["job_time_model"]["bandwidth"]
    assert all(f["source"] for f in sources.values())


def test_openb_arrive_all_reports_allocation_and_fragmentation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = _json(
        capsys,
        [
            "--cluster",
            f"openb:{DATA / 'alibaba_v2023_openb_node_list_gpu_node_every25th.csv'}",
            "--trace",
            f"openb:{DATA / 'alibaba_v2023_openb_pod_list_multigpu50_head200.csv'}",
            "--policy",
            "gputopo",
            "--policy",
            "random",
        ],
    )
    for p in data["policies"]:
        # 193 GPU pods ask for more than the 49 nodes hold: the cluster fills.
        assert p["allocation"] > 0.8
        assert p["allocation_at_full_demand"] is not None
        assert p["jct_s"]["mean"] is None  # nobody leaves in arrive-all: no JCT
        assert p["fragmentation"]["gpus"] >= 0


def test_nvl72_table_compares_gputopo_with_each_baseline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["simulate", "--nvl72", "2", "--trace", "llm:30@1", "--policy", "gputopo"]
    argv += ["--policy", "default", "--plots", str(tmp_path / "plots")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "free NVLd" in out
    assert "vs default" in out
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["allocation.png", "free_domains.png", "jct_cdf.png"]
    assert all((tmp_path / "plots" / n).read_bytes()[:4] == b"\x89PNG" for n in pngs)


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        pytest.param(["--nvl72", "1"], "--trace", id="no trace"),
        pytest.param(["--trace", "llm:5"], "exactly one of --cluster and --nvl72", id="no cluster"),
        pytest.param(
            ["--nvl72", "1", "--trace", "llm:5", "--policy", "slurm"],
            "--policy: unknown slurm",
            id="unknown policy",
        ),
        pytest.param(
            ["--nvl72", "1", "--trace", "llm:5", "--comm-share", "train=x"],
            "--comm-share 'train=x'",
            id="bad comm share",
        ),
        pytest.param(
            ["--nvl72", "1", "--trace", "openb:/nonexistent.csv"],
            "--trace: /nonexistent.csv",
            id="missing trace file",
        ),
        pytest.param(
            ["--cluster", "lingjun:/nonexistent.csv", "--trace", "llm:5"],
            "--cluster: /nonexistent.csv",
            id="missing cluster file",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_option(
    argv: list[str], want: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["simulate", *argv])
    except SystemExit as exit_:  # argparse's own errors
        code = int(exit_.code or 0)
    assert code == 2
    assert want in capsys.readouterr().err
