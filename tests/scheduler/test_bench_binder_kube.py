"""`gputopo bench binder` on the real test API server, all three setups in one run: the binder
leaves no gang partly bound, where the default kube-scheduler leaves some."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gputopo.app.benchmarks.binder import measure, queue, table
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scheduler import find_scheduler
from tests.harness.kube_scope import KubeScope

pytestmark = [pytest.mark.slow]


def test_bench_binder_runs_three_setups_and_only_the_binder_leaves_no_partial_gang(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    figures = asyncio.run(
        asyncio.wait_for(
            measure(
                str(kube_apiserver.kubeconfig_path),
                find_scheduler(),
                queue("small"),
                setups=("binder", "extender", "default"),
                nodes=12,
                seconds=12.0,
                prefix=kube_scope.name("bb"),
            ),
            timeout=280,
        )
    )
    print(json.dumps(figures, indent=2))
    print(table(figures))
    setups = figures["setups"]
    assert set(setups) == {"binder", "extender", "default"}
    binder, default = setups["binder"], setups["default"]
    assert binder["partial_groups_end"] == 0
    assert binder["partial_gpus_peak"] == 0
    assert binder["groups_fully_bound"] >= 1
    assert default["partial_groups_end"] > 0  # the failure the binder exists for
    assert binder["gang64_bind_seconds"] is not None
