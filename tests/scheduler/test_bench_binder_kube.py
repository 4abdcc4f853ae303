"""`gputopo bench binder --json` on the real test API server, all three setups in one run: the
binder leaves no gang partly bound, where the default kube-scheduler leaves some."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputopo.app.benchmarks.binder import table
from gputopo.app.cli import main
from tests.aggregator.kubeutil import install_crds
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scheduler import find_scheduler
from tests.harness.kube_scope import KubeScope

pytestmark = [pytest.mark.slow]


def test_bench_binder_runs_three_setups_and_only_the_binder_leaves_no_partial_gang(
    kube_apiserver: KubeApiServer,
    kube_scope: KubeScope,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Installed for the scope (deleted after the test) so the bench's own install finds it.
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    argv = [
        "bench",
        "binder",
        f"--kubeconfig={kube_apiserver.kubeconfig_path}",
        f"--kube-scheduler={find_scheduler()}",
        "--queue=small",
        "--seconds=12",
        f"--prefix={kube_scope.name('bb')}",
        "--json",
    ]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        print()
        print(table(figures))
    setups = figures["setups"]
    assert list(setups) == ["binder", "extender", "default"]
    binder, default = setups["binder"], setups["default"]
    assert binder["partial_groups_end"] == 0
    assert binder["partial_gpus_end"] == 0
    assert binder["groups_fully_bound"] >= 1
    assert default["partial_groups_end"] > 0  # the failure the binder exists for
    assert binder["gang64_bind_seconds"] is not None


def test_bench_binder_names_a_bad_setup(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "binder", "--kubeconfig=x", "--setups=binder,nope"]) == 2
    assert "--setups" in capsys.readouterr().err
