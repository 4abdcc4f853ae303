"""`gputopo bench binder --json` on the real test API server, all three setups in one run: the
binder leaves no gang partly bound, where the default kube-scheduler leaves some."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputopo.app.benchmarks._binder_kube import bench_nodes, prepare_nodes
from gputopo.app.benchmarks.binder import table
from gputopo.app.cli import main
from gputopo.runtime.kube import KubeClient
from tests.aggregator.kubeutil import install_crds, run
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


def test_bench_binder_throughput_binds_every_pod_on_its_own_nodes_beside_a_stray_node(
    kube_apiserver: KubeApiServer,
    kube_scope: KubeScope,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A small stream (5 gangs x 2 x 2 GPUs, a big gang of 8 x 1) through the binder and the
    default kube-scheduler in one run; a foreign Ready Node with free GPUs is on the server
    (it crashed the bench before) and receives no pod."""
    install_crds(kube_scope, "coscheduling-podgroups.yaml")
    stray = kube_scope.name("stray-01")

    async def make_stray() -> None:
        kube = KubeClient(kube_apiserver.api_client())
        try:
            await prepare_nodes(kube, [bench_nodes(stray, 1)[0]])
        finally:
            kube.close()

    run(make_stray(), timeout_s=30)
    argv = [
        "bench",
        "binder",
        "--mode=throughput",
        f"--kubeconfig={kube_apiserver.kubeconfig_path}",
        f"--kube-scheduler={find_scheduler()}",
        "--gangs=5",
        "--pods=2",
        "--gpus=2",
        "--big-pods=8",
        "--seconds=60",
        f"--prefix={kube_scope.name('bt')}",
        "--json",
    ]
    try:
        assert main(argv) == 0
        out = capsys.readouterr()
        figures = json.loads(out.out)
        assert "pods bound" in out.err  # progress on stderr, figures alone on stdout
        assert list(figures["setups"]) == ["binder", "default"]
        for setup, got in figures["setups"].items():
            assert got["stream"]["pods_bound"] == 10, setup
            assert got["stream"]["gangs_whole"] == 5, setup
            assert got["stream"]["pods_per_second"] > 0, setup
            assert got["big_gang"]["pods_bound"] == 8, setup

        async def on_stray() -> int:
            kube = KubeClient(kube_apiserver.api_client())
            try:
                page = await kube.request(
                    "GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={stray}-00"}
                )
                await kube.delete_node(f"{stray}-00")
                return len(page.get("items") or [])
            finally:
                kube.close()

        assert run(on_stray(), timeout_s=30) == 0
    finally:
        with capsys.disabled():
            print()
