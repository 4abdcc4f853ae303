"""Leader election against the real API server, on fake loop time (`tests.looptime`).

The handover after a crash is bounded by the lease (client-go's rules, `gputopo.runtime.leader`):
the follower takes over once the record it last saw has not changed for `lease_duration_s`,
checking every `retry_period_s`. On real time that bound cannot be asserted tightly on a loaded
machine; on loop time the waits take no real time and what the test reads is exact, while every
API call is real (the loop's clock stands still while a call is in flight), so the durations
the command ships (5 / 3 / 1 s) and client-go's (15 / 10 / 2 s) are checked as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from gputopo.app.commands.aggregator import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S
from gputopo.runtime.kube import KubeClient
from gputopo.runtime.leader import LeaderElector, LeaseConfig
from tests import looptime
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

pytestmark = pytest.mark.kube


async def _until(check: Callable[[], bool], *, within_s: float) -> float:
    """Loop seconds until `check` holds (polled every 0.1 s of loop time), to the microsecond:
    loop time is a sum of float jumps, and a handover at the bound, 1.1 s, read as
    1.1000000000000014 failed `took <= retry + 0.1`."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while not check():
        if loop.time() - began > within_s:
            raise AssertionError(f"not within {within_s} s of loop time")
        await asyncio.sleep(0.1)
    return round(loop.time() - began, 6)


SHIPPED = (LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S)  # `gputopo aggregator`'s flags
CLIENT_GO = (15.0, 10.0, 2.0)  # LeaseConfig's defaults


def _config(scope: KubeScope, timing: tuple[float, float, float] = SHIPPED) -> LeaseConfig:
    lease, renew, retry = timing
    return LeaseConfig(
        namespace=scope.namespace,
        name=scope.name("lease"),
        lease_duration_s=lease,
        renew_deadline_s=renew,
        retry_period_s=retry,
    )


@pytest.mark.parametrize("timing", [SHIPPED, CLIENT_GO], ids=["shipped", "client-go"])
@pytest.mark.parametrize("crash", [True, False], ids=["a crash", "a clean stop"])
def test_a_follower_takes_over_when_the_lease_runs_out_or_is_released(
    kube_apiserver: KubeApiServer,
    kube_scope: KubeScope,
    crash: bool,
    timing: tuple[float, float, float],
) -> None:
    cfg = _config(kube_scope, timing)
    lease, retry = cfg.lease_duration_s, cfg.retry_period_s

    async def body() -> float:
        kube = KubeClient(kube_apiserver.api_client())
        a = LeaderElector(kube, cfg, identity="a")
        b = LeaderElector(kube, cfg, identity="b")
        ta = asyncio.create_task(a.run())
        tb: asyncio.Task[None] | None = None
        try:
            await _until(lambda: a.is_leader, within_s=retry)
            tb = asyncio.create_task(b.run())
            await asyncio.sleep(5 * lease)  # far longer than a lease: a keeps renewing
            assert a.is_leader
            assert not b.is_leader, "two leaders"
            assert b.leader == "a"
            if not crash:
                await a.release()
            ta.cancel()  # a crash: no release, no more renewals
            return await _until(lambda: b.is_leader, within_s=3 * lease)
        finally:
            for task in (ta, tb):
                if task is not None:
                    task.cancel()
            await asyncio.gather(ta, *([tb] if tb else []), return_exceptions=True)
            kube.close()

    took = looptime.run(body())
    print(f"handover after {'a crash' if crash else 'a release'}: {took:.2f} s of loop time")
    if crash:
        # b saw a's last renewal at most one retry after it happened (and a renewed at most one
        # retry before the crash); it takes over at its first check a lease after that.
        assert lease - retry <= took <= lease + 2 * retry, took
    else:
        assert took <= retry + 0.1, took  # the next check finds the lease free


def test_a_leader_whose_lease_another_took_steps_down_at_its_next_renewal(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    """The Lease names another holder (written behind the leader's back): the leader's next
    renewal reads it and stops leading, one retry period later at most."""
    cfg = _config(kube_scope)

    async def body() -> tuple[float, str]:
        kube = KubeClient(kube_apiserver.api_client())
        a = LeaderElector(kube, cfg, identity="a")
        ta = asyncio.create_task(a.run())
        try:
            await _until(lambda: a.is_leader, within_s=cfg.retry_period_s)
            # another writer holds the Lease now (a's next renewal reads it held and loses)
            current = await kube.get_lease(cfg.namespace, cfg.name)
            assert current is not None
            await kube.replace_lease(cfg.namespace, cfg.name, replace(current, holder="other"))
            took = await _until(lambda: not a.is_leader, within_s=cfg.lease_duration_s)
            return took, a.leader
        finally:
            ta.cancel()
            await asyncio.gather(ta, return_exceptions=True)
            kube.close()

    took, leader = looptime.run(body())
    assert leader == "other"
    assert took <= cfg.retry_period_s + 0.1, took
