"""The Reporter service over real gRPC on loopback: what it rejects, ignores and accepts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import grpc
import pytest

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.codec import delta_to_proto, timestamp, topology_to_proto
from gputopo.delta import NodeDelta
from gputopo.links import LinkHealth
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.builders import nvswitch_node

T = TypeVar("T")
NODE = nvswitch_node("n1", gpus=4, nics=2, tiers=("leaf-1", "spine-1"))
ACCEPTED = rpb.ReportResponse.STATUS_ACCEPTED
IGNORED = rpb.ReportResponse.STATUS_IGNORED
RESYNC = rpb.ReportResponse.STATUS_RESYNC


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))  # type: ignore[arg-type]


def snapshot_msg(
    seq: int, *, incarnation: int = 100, name: str = "n1", node: str | None = None
) -> rpb.ReportRequest:
    topo = topology_to_proto(NODE)
    topo.name = node if node is not None else name
    return rpb.ReportRequest(
        node_name=name,
        incarnation=incarnation,
        sequence=seq,
        snapshot=rpb.Snapshot(topology=topo),
    )


def delta_msg(seq: int, delta: NodeDelta, *, incarnation: int = 100) -> rpb.ReportRequest:
    return rpb.ReportRequest(
        node_name="n1", incarnation=incarnation, sequence=seq, delta=delta_to_proto(delta)
    )


def beat(seq: int, *, incarnation: int = 100) -> rpb.ReportRequest:
    return rpb.ReportRequest(
        node_name="n1", incarnation=incarnation, sequence=seq, heartbeat=rpb.Heartbeat()
    )


async def with_aggregator(
    body: Callable[[Aggregator, rgrpc.ReporterStub], Awaitable[None]],
) -> None:
    agg = Aggregator(AggregatorConfig())
    await agg.start()
    try:
        async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
            await body(agg, rgrpc.ReporterStub(channel))
    finally:
        await agg.stop(grace_s=0.1)


async def exchange(
    stub: rgrpc.ReporterStub, messages: list[rpb.ReportRequest]
) -> list[rpb.ReportResponse]:
    """Send messages one by one on one stream, reading each answer."""
    call = stub.Report()
    answers = []
    for msg in messages:
        await call.write(msg)
        answers.append(await call.read())
    await call.done_writing()
    return answers


def _bad(
    mutate: Callable[[rpb.ReportRequest], None], base: rpb.ReportRequest | None = None
) -> rpb.ReportRequest:
    msg = rpb.ReportRequest()
    msg.CopyFrom(base or snapshot_msg(1))
    mutate(msg)
    return msg


@dataclass(frozen=True)
class Malformed:
    id: str
    messages: list[rpb.ReportRequest]
    want_field: str


def _set_gpu_index(msg: rpb.ReportRequest) -> None:
    msg.snapshot.topology.gpus[2].index = 7


def _unknown_fabric_state(msg: rpb.ReportRequest) -> None:
    msg.snapshot.topology.gpus[0].fabric.state = 42  # type: ignore[assignment]


def _unknown_nic_kind(msg: rpb.ReportRequest) -> None:
    msg.snapshot.topology.nics[1].kind = 9  # type: ignore[assignment]


def _dangling_link(msg: rpb.ReportRequest) -> None:
    msg.snapshot.topology.links[0].b.index = 40


def _nan_bandwidth(msg: rpb.ReportRequest) -> None:
    msg.snapshot.topology.links[0].nominal_gbps = float("nan")


def _gap_delta() -> rpb.ReportRequest:
    delta = delta_to_proto(NodeDelta(gpus=(NODE.gpus[0],)))
    delta.gpus[0].index = 6  # the node has 4 GPUs: a new one must be index 4
    return rpb.ReportRequest(node_name="n1", incarnation=100, sequence=2, delta=delta)


def _delta_link_to_nowhere() -> rpb.ReportRequest:
    delta = delta_to_proto(NodeDelta(links=(NODE.links[0],)))
    delta.links[0].b.index = 9
    return rpb.ReportRequest(node_name="n1", incarnation=100, sequence=2, delta=delta)


def _sent_in_year_146_billion(msg: rpb.ReportRequest) -> None:
    msg.sent_at.seconds = 2**62


def _sent_with_negative_nanos(msg: rpb.ReportRequest) -> None:
    msg.sent_at.nanos = -1


def _measured_after_year_9999(msg: rpb.ReportRequest) -> None:
    link = msg.snapshot.topology.links[0]
    link.measured.gbps = 100.0
    link.measured.measured_at.seconds = 253402300800


def _probe(peer: str, latency: float) -> rpb.ReportRequest:
    delta = rpb.Delta()
    probe = delta.peer_probes.add(peer=peer)
    probe.measured.latency_us = latency
    return rpb.ReportRequest(node_name="n1", incarnation=100, sequence=2, delta=delta)


MALFORMED = [
    Malformed("no node name", [_bad(lambda m: m.ClearField("node_name"))], "node_name"),
    Malformed(
        "a node name Kubernetes cannot have",
        [_bad(lambda m: setattr(m, "node_name", "Node_1"))],
        "node_name",
    ),
    Malformed("no incarnation", [_bad(lambda m: setattr(m, "incarnation", 0))], "incarnation"),
    Malformed("sequence zero", [_bad(lambda m: setattr(m, "sequence", 0))], "sequence"),
    Malformed("no payload", [_bad(lambda m: m.ClearField("snapshot"))], "payload"),
    Malformed(
        "a probe address that is not host:port",
        [_bad(lambda m: setattr(m, "probe_address", "10.0.0.1"))],
        "probe_address",
    ),
    Malformed(
        "a probe address checked once on the stream, then changed to one that is not host:port",
        [
            _bad(lambda m: setattr(m, "probe_address", "10.0.0.1:9000")),
            _bad(lambda m: setattr(m, "probe_address", "10.0.0.1:99999"), beat(2)),
        ],
        "probe_address",
    ),
    Malformed(
        "a snapshot of another node",
        [snapshot_msg(1, node="n2")],
        "snapshot.topology.name",
    ),
    Malformed(
        "GPUs not numbered 0..n-1", [_bad(_set_gpu_index)], "snapshot.topology.gpus[2].index"
    ),
    Malformed(
        "an unknown fabric state",
        [_bad(_unknown_fabric_state)],
        "snapshot.topology.gpus[0].fabric.state",
    ),
    Malformed("an unknown NIC kind", [_bad(_unknown_nic_kind)], "snapshot.topology.nics[1].kind"),
    Malformed(
        "a link to a GPU that does not exist",
        [_bad(_dangling_link)],
        "snapshot.topology.links[0].b",
    ),
    Malformed(
        "a bandwidth that is not a number",
        [_bad(_nan_bandwidth)],
        "snapshot.topology.links[0].nominal_gbps",
    ),
    Malformed(
        "a send time no timestamp can hold",
        [_bad(_sent_in_year_146_billion)],
        "sent_at",
    ),
    Malformed(
        "a delta's send time with negative nanos",
        [
            snapshot_msg(1),
            _bad(_sent_with_negative_nanos, delta_msg(2, NodeDelta(problems=("x",)))),
        ],
        "sent_at",
    ),
    Malformed(
        "a measurement time past year 9999",
        [_bad(_measured_after_year_9999)],
        "snapshot.topology.links[0].measured.measured_at",
    ),
    Malformed(
        "a second node on the same stream",
        [snapshot_msg(1), snapshot_msg(2, name="n2")],
        "node_name",
    ),
    Malformed(
        "a delta that skips GPU indices", [snapshot_msg(1), _gap_delta()], "delta.gpus[0].index"
    ),
    Malformed(
        "a delta linking to a device the node lacks",
        [snapshot_msg(1), _delta_link_to_nowhere()],
        "delta.links[0].b",
    ),
    Malformed(
        "a probe of itself", [snapshot_msg(1), _probe("n1", 5.0)], "delta.peer_probes[0].peer"
    ),
    Malformed(
        "a probe with a negative latency",
        [snapshot_msg(1), _probe("n2", -1.0)],
        "delta.peer_probes[0].measured.latency_us",
    ),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c.id for c in MALFORMED])
def test_malformed_reports_end_the_stream_naming_the_field(case: Malformed) -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        call = stub.Report()
        for msg in case.messages[:-1]:
            await call.write(msg)
            assert (await call.read()).status == ACCEPTED
        await call.write(case.messages[-1])
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        details = info.value.details() or ""
        assert details.startswith(f"{case.want_field}:"), details
        # Nothing of the invalid message reached the state.
        rec = agg.state.record("n1")
        if len(case.messages) == 1:
            assert rec is None
        else:
            assert rec is not None
            assert (rec.sequence, rec.topology.gpu_count) == (1, 4)
        assert sum(agg.reporter.stats.rejected.values()) == 1

    run(with_aggregator(body))


def test_replayed_and_out_of_order_reports_are_ignored() -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        degraded = NodeDelta(links=(replace(NODE.links[0], health=LinkHealth.DEGRADED),))
        answers = await exchange(
            stub,
            [
                snapshot_msg(5),
                delta_msg(6, degraded),
                snapshot_msg(6),  # a replay of sequence 6, as a snapshot
                snapshot_msg(3),  # out of order: older than what was accepted
                beat(6),  # a duplicate
                snapshot_msg(99, incarnation=99),  # an earlier exporter process, late
                beat(7),
            ],
        )
        assert [a.status for a in answers] == [
            ACCEPTED,
            ACCEPTED,
            IGNORED,
            IGNORED,
            IGNORED,
            IGNORED,
            ACCEPTED,
        ]
        assert [a.acked_sequence for a in answers] == [5, 6, 0, 0, 0, 0, 7]
        rec = agg.state.record("n1")
        assert rec is not None
        assert rec.topology.links[0].health is LinkHealth.DEGRADED  # the replay did not undo it
        assert (rec.incarnation, rec.sequence) == (100, 7)

    run(with_aggregator(body))


def test_a_delta_without_its_snapshot_asks_for_one() -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        answers = await exchange(
            stub,
            [
                delta_msg(1, NodeDelta(problems=("x",))),  # nothing known yet
                snapshot_msg(2),
                delta_msg(1, NodeDelta(problems=("y",)), incarnation=101),  # restarted
                snapshot_msg(2, incarnation=101),
            ],
        )
        assert [a.status for a in answers] == [RESYNC, ACCEPTED, RESYNC, ACCEPTED]
        assert answers[0].message == "send a snapshot"

    run(with_aggregator(body))


def test_a_newer_stream_for_a_node_replaces_the_old_one_and_an_older_exporter_is_refused() -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        first = stub.Report()
        await first.write(snapshot_msg(1))
        assert (await first.read()).status == ACCEPTED
        second = stub.Report()  # the same exporter reconnected; the first is half-dead
        await second.write(beat(2))
        assert (await second.read()).status == ACCEPTED
        # Whatever still comes on the old stream ends it and is not applied.
        await first.write(delta_msg(3, NodeDelta(problems=("from the old stream",))))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await first.read()
        assert info.value.code() is grpc.StatusCode.ABORTED
        rec = agg.state.record("n1")
        assert rec is not None
        assert rec.sequence == 2
        stale = stub.Report()  # an exporter process older than the current one
        await stale.write(snapshot_msg(50, incarnation=99))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stale.read()
        assert info.value.code() is grpc.StatusCode.ALREADY_EXISTS
        await second.write(beat(3))
        assert (await second.read()).status == ACCEPTED
        assert agg.reporter.stats.superseded == 1
        assert agg.reporter.stats.refused == 1
        await second.done_writing()

    run(with_aggregator(body))


def test_freshness_is_measured_from_the_exporters_send_time() -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        msg = snapshot_msg(1)
        msg.sent_at.CopyFrom(timestamp(agg.clock() - 0.3))
        await exchange(stub, [msg])
        stats = agg.reporter.stats
        assert stats.freshness_count == 1
        assert 0.3 <= stats.freshness_sum < 5.0
        assert stats.freshness_buckets[-1] == 1  # within the last bucket (10 s)

    run(with_aggregator(body))


def test_probe_targets_are_sent_and_results_feed_the_inference() -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        calls = {}
        addresses = {"a1": "127.0.0.1:9001", "a2": "127.0.0.1:9002", "b1": "[::1]:9003"}
        first_targets = {}
        for name, address in addresses.items():
            topo = topology_to_proto(nvswitch_node(name, gpus=2, nics=1))
            call = stub.Report()
            await call.write(
                rpb.ReportRequest(
                    node_name=name,
                    incarnation=1,
                    sequence=1,
                    probe_address=address,
                    snapshot=rpb.Snapshot(topology=topo),
                )
            )
            first_targets[name] = {
                t.node_name: t.address for t in (await call.read()).probe_targets
            }
            calls[name] = call
        # Each node probes the peers known when it joined; the first had none yet.
        assert first_targets == {
            "a1": {},
            "a2": {"a1": "127.0.0.1:9001"},
            "b1": {"a1": "127.0.0.1:9001", "a2": "127.0.0.1:9002"},
        }
        a1 = {"node_name": "a1", "incarnation": 1, "probe_address": addresses["a1"]}
        await calls["a1"].write(rpb.ReportRequest(sequence=2, heartbeat=rpb.Heartbeat(), **a1))
        resp = await calls["a1"].read()
        assert {t.node_name for t in resp.probe_targets} == {"a2", "b1"}
        results = rpb.Delta()
        for peer, rtt in (("a2", 6.2), ("b1", 8.6)):
            probe = results.peer_probes.add(peer=peer)
            probe.measured.method = "tcp"
            probe.measured.latency_us = rtt
        await calls["a1"].write(rpb.ReportRequest(sequence=3, delta=results, **a1))
        assert (await calls["a1"].read()).status == ACCEPTED
        assert agg.probes.results == 2
        assert agg.probes.book.pair_count == 2
        for call in calls.values():
            await call.done_writing()

    run(with_aggregator(body))


def test_a_node_gone_stale_is_no_longer_a_probe_target() -> None:
    """Peers are not sent to probe a node that stopped reporting: its probes would fail, and as
    its group's representative it would hold up every newcomer's descent."""
    now = [1000.0]

    async def body() -> None:
        # Housekeeping stays out of the way: the test announces staleness itself.
        config = AggregatorConfig(stale_after_s=30, housekeeping_interval_s=3600)
        agg = Aggregator(config, clock=lambda: now[0])
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                stub = rgrpc.ReporterStub(channel)
                calls = {}
                for name, port in (("a1", 9001), ("b1", 9002)):
                    calls[name] = stub.Report()
                    await calls[name].write(
                        rpb.ReportRequest(
                            node_name=name,
                            incarnation=1,
                            sequence=1,
                            probe_address=f"127.0.0.1:{port}",
                            snapshot=rpb.Snapshot(
                                topology=topology_to_proto(nvswitch_node(name, gpus=2, nics=1))
                            ),
                        )
                    )
                    await calls[name].read()
                now[0] += 31  # both go silent; only a1 comes back
                assert agg.state.check_stale() == ["a1", "b1"]
                await calls["a1"].write(
                    rpb.ReportRequest(
                        node_name="a1",
                        incarnation=1,
                        sequence=2,
                        probe_address="127.0.0.1:9001",
                        heartbeat=rpb.Heartbeat(),
                    )
                )
                resp = await calls["a1"].read()
                assert resp.status == ACCEPTED
                assert [t.node_name for t in resp.probe_targets] == []
                for call in calls.values():
                    await call.done_writing()
        finally:
            await agg.stop(grace_s=0.1)

    run(body())


def test_a_forged_huge_incarnation_is_refused_and_the_real_exporter_keeps_its_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        real = time.time_ns()
        stream = stub.Report()
        await stream.write(snapshot_msg(1, incarnation=real))
        assert (await stream.read()).status == ACCEPTED
        for forged in (2**64 - 1, real + 3600 * 10**9):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await exchange(stub, [snapshot_msg(1, incarnation=forged)])
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "incarnation" in (info.value.details() or "")
        # Nothing of the forgery was applied: the real stream goes on as before.
        await stream.write(beat(2, incarnation=real))
        assert (await stream.read()).status == ACCEPTED
        rec = agg.state.record("n1")
        assert rec is not None
        assert (rec.incarnation, rec.sequence) == (real, 2)
        assert agg.reporter.stats.rejected["incarnation"] == 2
        await stream.done_writing()

    with caplog.at_level(logging.WARNING, logger="aggregator.ingest"):
        run(with_aggregator(body))
    refusals = [r.getMessage() for r in caplog.records if "incarnation" in r.getMessage()]
    assert len(refusals) == 2
    assert all("127.0.0.1" in line or "ipv6" in line for line in refusals), refusals


def test_an_exporter_gets_its_node_back_from_a_gone_stream_with_a_higher_incarnation() -> None:
    async def body(agg: Aggregator, stub: rgrpc.ReporterStub) -> None:
        real = time.time_ns()
        # A stream claiming a later start (within the allowed clock skew) came and went.
        forged = stub.Report()
        await forged.write(snapshot_msg(1, incarnation=real + 200 * 10**9, node="n1"))
        assert (await forged.read()).status == ACCEPTED
        await forged.done_writing()
        assert await forged.read() is grpc.aio.EOF
        await eventually_free(agg)
        # The real exporter reconnects: its first heartbeat asks for a snapshot, which is taken.
        answers = await exchange(
            stub,
            [
                beat(7, incarnation=real),
                snapshot_msg(8, incarnation=real),
                beat(9, incarnation=real),
            ],
        )
        assert [a.status for a in answers] == [RESYNC, ACCEPTED, ACCEPTED]
        rec = agg.state.record("n1")
        assert rec is not None
        assert (rec.incarnation, rec.sequence) == (real, 9)

    run(with_aggregator(body))


async def eventually_free(agg: Aggregator) -> None:
    """Wait until the server has finished the ended stream (its claim is released)."""
    for _ in range(200):
        if agg.reporter.stats.streams == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the ended stream was never released")
