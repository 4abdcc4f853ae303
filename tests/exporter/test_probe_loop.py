"""Exporter and aggregator together: the aggregator names peers, exporters probe them over TCP,
the results come back in deltas and land in the aggregator's probe book. Nothing stubbed: real
agents (on fake machines), a real aggregator, real sockets on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aggregator.server import Aggregator, AggregatorConfig
from exporter.probes.runner import ProbeSchedule
from tests.exporter.conftest import FakeNode
from tests.exporter.test_agent import fake_agent, run, until


def test_aggregator_named_peers_are_probed_and_their_results_reach_its_probe_book(
    fake_node: Callable[..., FakeNode],
) -> None:
    nodes = [fake_node("workstation-2x-rtx5090", node_name=f"ws-{i}") for i in range(3)]
    schedule = ProbeSchedule(interval_s=0.3, first_after_s=0.1, jitter=0.1)

    async def scenario() -> None:
        agg = Aggregator(AggregatorConfig(heartbeat_interval_s=0.2, probe_interval_s=0.2))
        await agg.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                for node in nodes:
                    await stack.enter_async_context(
                        fake_agent(node, agg.grpc_target, peer_probes=True, probe_schedule=schedule)
                    )
                await until(
                    lambda: agg.probes.results >= 3,
                    timeout_s=30,
                    what="peer probe results at the aggregator",
                )
                assert agg.probes.book.pair_count >= 2
                rtts = [agg.state.record(n.discovery.node_name) for n in nodes]
                assert all(r is not None and r.probe_address for r in rtts)
        finally:
            await agg.stop(grace_s=0.1)

    run(scenario(), timeout_s=60)
