"""The topology cache's age counts from when its bytes exist (issue 25).

`test_the_topology_is_built_once_until_the_state_changes` failed 5 times in 5 on a machine where
a 2,000-node build took longer than `max_age_s`: the entry was stamped when its build began, so
it was already stale when the next GET came. Here the build's duration is a fake clock's, so
the check does not depend on this machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aggregator.http import TopologyCache
from aggregator.state import ClusterState
from tests.builders import nvswitch_node


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def cache(clock: Clock, build_s: float) -> tuple[TopologyCache, ClusterState]:
    state = ClusterState(clock=clock)
    state.add_static(nvswitch_node("n1", gpus=8))

    async def slow_off_loop(work: Callable[[], bytes]) -> bytes:
        await asyncio.sleep(0)
        clock.now += build_s  # the build takes this long, in the fake clock's time
        return work()

    return TopologyCache(state, clock=clock, off_loop=slow_off_loop, max_age_s=2.0), state


def test_bytes_built_slower_than_max_age_are_served_until_they_are_max_age_old() -> None:
    clock = Clock()
    topo, _ = cache(clock, build_s=5.0)

    async def go() -> None:
        first = await topo.get(include_links=False)
        clock.now += 1.5
        assert await topo.get(include_links=False) == first
        assert topo.builds == 1
        clock.now += 1.0  # 2.5 s after the bytes were ready: past max_age_s
        await topo.get(include_links=False)
        assert topo.builds == 2

    asyncio.run(go())


def test_requests_during_a_long_build_share_it() -> None:
    clock = Clock()
    topo, _ = cache(clock, build_s=5.0)

    async def go() -> None:
        bodies = await asyncio.gather(*(topo.get(include_links=True) for _ in range(4)))
        assert len(set(bodies)) == 1
        assert topo.builds == 1

    asyncio.run(go())


def test_a_new_state_generation_builds_again_at_once() -> None:
    clock = Clock()
    topo, state = cache(clock, build_s=0.1)

    async def go() -> None:
        await topo.get(include_links=False)
        state.add_static(nvswitch_node("n2", gpus=8))
        await topo.get(include_links=False)
        assert topo.builds == 2

    asyncio.run(go())
