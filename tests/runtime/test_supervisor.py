"""Root tasks cannot die in silence: a loop that ends on its own ends its process, non-zero.

Each process is run through its own command (`gputopo exporter|aggregator|scheduler`), in this
test's process, with one root loop replaced by one that raises: the command must stop and
return 1 instead of serving on without it. The scheduler is also run under leader election, the
case the review found (a dead binder behind a Lease still renewed): its Lease is released.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

import aggregator.server
import exporter.agent
import scheduler.binder
import scheduler.server
from gputopo.app.cli import main
from gputopo.runtime.kube import KubeClient
from gputopo.runtime.leader import LeaseConfig
from gputopo.runtime.supervisor import RootTaskDiedError, Supervisor
from scheduler.server import SchedulerProcess, SchedulerProcessConfig


async def _raise(*_: object) -> None:
    raise RuntimeError("a bug in a root loop")


async def _forever() -> None:
    await asyncio.Event().wait()


def test_a_cancelled_task_is_no_death_a_failed_or_finished_one_is() -> None:
    async def scenario() -> list[str]:
        seen = []
        tasks = Supervisor("p")
        stopped = tasks.spawn(_forever(), "stopped")
        await asyncio.sleep(0)
        stopped.cancel()
        stop = asyncio.Event()
        stop.set()
        await tasks.wait(stop)  # a cancellation asked for is no death: returns
        seen.append("cancelled: served on")
        tasks.spawn(asyncio.sleep(0), "finished")
        with pytest.raises(RootTaskDiedError, match="root task 'finished' returned"):
            await tasks.wait()
        seen.append("returned: died")
        again = Supervisor("p")
        again.spawn(_raise(), "buggy")
        with pytest.raises(RootTaskDiedError, match="'buggy' raised RuntimeError") as died:
            await again.watch(_forever())  # the process's own loop is cancelled
        assert isinstance(died.value.error, RuntimeError)
        seen.append("raised: died")
        await again.cancel()
        return seen

    assert asyncio.run(scenario()) == ["cancelled: served on", "returned: died", "raised: died"]


def test_the_exporter_exits_non_zero_when_a_root_loop_dies(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(exporter.agent.Agent, "_discovery_loop", _raise)
    argv = ["exporter", "--simulate", "dgx-h100", "--node-name", "n1", "--insecure"]
    assert main([*argv, "--http-port", "0", "--probe-port", "0", "--no-gpu-probes"]) == 1
    assert "root task 'exporter-discovery' raised RuntimeError" in capsys.readouterr().err


def test_the_aggregator_exits_non_zero_when_a_root_loop_dies(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(aggregator.server.Aggregator, "_housekeep", _raise)
    argv = ["aggregator", "--grpc-port", "0", "--http-port", "0", "--insecure"]
    assert main([*argv, "--anonymous-exporters"]) == 1
    assert "root task 'housekeeping' raised RuntimeError" in capsys.readouterr().err


_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_scheduler_exits_non_zero_when_its_binder_dies(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The binder is replaced before it makes any call: no API server is needed.
    monkeypatch.setattr(scheduler.binder.Binder, "run", _raise)
    (tmp_path / "kubeconfig").write_text(_KUBECONFIG)
    argv = ["scheduler", "--kubeconfig", str(tmp_path / "kubeconfig"), "--insecure"]
    argv += ["--aggregator", "127.0.0.1:9", "--no-leader-election", "--http-port", "0"]
    assert main(argv) == 1
    assert "root task 'binder' raised RuntimeError" in capsys.readouterr().err


class _Elector:
    """Leads at once and renews forever, as a healthy Lease holder does; records its release."""

    released: ClassVar[list[str]] = []

    def __init__(self, *_: object, on_started: Any, **__: object) -> None:
        self._started = on_started

    async def run(self) -> None:
        await self._started()
        await _forever()

    async def release(self) -> None:
        _Elector.released.append("lease")


class _NoKube:
    """A Kubernetes client nothing may call: the binder's informers take its methods when built,
    and the binder (patched to raise) never runs them."""

    def __getattr__(self, name: str) -> Any:
        async def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"KubeClient.{name} called")

        return refuse


def test_a_leading_scheduler_whose_binder_dies_gives_up_its_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler.binder.Binder, "run", _raise)
    monkeypatch.setattr(scheduler.server, "LeaderElector", _Elector)
    config = SchedulerProcessConfig(
        aggregator="127.0.0.1:9", lease=LeaseConfig(namespace="ns"), http_port=None
    )
    process = SchedulerProcess(config, cast(KubeClient, _NoKube()))
    with pytest.raises(RootTaskDiedError, match="'binder' raised"):
        asyncio.run(process.run())
    assert _Elector.released == ["lease"]
