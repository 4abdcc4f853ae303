"""Roles by certificate name: the exporters' certificate reports and does nothing else, and a
reservation is explained only to its holder or an operator (issue 25).

The exporters' shared certificate used to Place and Commit a TP-8 (a commitment never expires),
and any certificate could Explain another's reservation. Real sockets, real certificates, over
gRPC and the HTTP mirror; the table itself is pure and tested without sockets first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from aggregator.roles import METHOD_ROLES, Role, Roles
from aggregator.server import Aggregator, AggregatorConfig
from gputopo.codec import topology_to_proto
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient
from gputopo.runtime.tls import TlsFiles, ssl_client_context
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.builders import fabric_cluster, nvswitch_node
from tests.harness.certs import TestCA

TP8 = request_from_mapping({"job": "tp8", "groups": [{"name": "tp", "gpus_per_pod": 8}]})
PLACE = "/gputopo.v1.Placement/Place"
EXPLAIN = "/gputopo.v1.Placement/Explain"
REPORT = "/gputopo.v1.Reporter/Report"


OPEN = Roles.of(enforced=False)
DEFAULT = Roles.of(enforced=True)
NAMED = Roles.of(enforced=True, placement_clients=["gputopo-scheduler"])
OPS = Roles.of(enforced=True, operators=["ops", "gputopo-exporter"])
CASES = [
    # (table, method, caller, holder of the reservation explained, allowed, story)
    (OPEN, PLACE, "gputopo-exporter", None, True, "plain text: no roles"),
    (DEFAULT, REPORT, "gputopo-exporter", None, True, "the exporter reports"),
    (DEFAULT, PLACE, "gputopo-exporter", None, False, "the exporter may not place"),
    (DEFAULT, PLACE, "system:node:a1", None, False, "nor may a node certificate"),
    (DEFAULT, PLACE, "gputopo-scheduler", None, True, "any other name places by default"),
    (NAMED, PLACE, "someone", None, False, "only named placement clients once some are"),
    (NAMED, PLACE, "gputopo-scheduler", None, True, "a named placement client places"),
    (DEFAULT, EXPLAIN, "alice", "alice", True, "the holder explains"),
    (DEFAULT, EXPLAIN, "bob", "alice", False, "another does not"),
    (OPS, EXPLAIN, "ops", "alice", True, "an operator does"),
    (OPS, PLACE, "gputopo-exporter", None, True, "an operator is one even if an exporter too"),
]


@pytest.mark.parametrize(
    ("roles", "method", "caller", "holder", "allowed"),
    [pytest.param(*case[:5], id=case[5]) for case in CASES],
)
def test_the_role_table(
    roles: Roles, method: str, caller: str, holder: str | None, allowed: bool
) -> None:
    assert (roles.denial(method, caller, holder=holder) is None) is allowed


TEAM = Roles.of(enforced=True, placement_clients=["group:ml-platform", "gputopo-scheduler"])
GROUP_OPS = Roles.of(enforced=True, operators=["group:sre"])
GROUP_EXPORTERS = Roles.of(enforced=True, exporter_clients=["group:gputopo-nodes"])
GROUP_CASES = [
    # (table, method, caller, its certificate's groups, holder, allowed, story)
    (TEAM, PLACE, "alice", {"ml-platform"}, None, True, "a member of a named group places"),
    (TEAM, PLACE, "bob", {"web"}, None, False, "a certificate of another group does not"),
    (TEAM, PLACE, "bob", set(), None, False, "nor one without a group"),
    (TEAM, PLACE, "gputopo-scheduler", set(), None, True, "names and groups mix in one list"),
    (TEAM, PLACE, "ml-platform", set(), None, False, "a group entry is no common name"),
    (TEAM, PLACE, "group:ml-platform", set(), None, False, "nor is a CN spelled like one"),
    (TEAM, EXPLAIN, "carol", {"ml-platform"}, "alice", False, "a group member is no holder"),
    (GROUP_OPS, EXPLAIN, "dave", {"sre", "web"}, "alice", True, "an operator by group explains"),
    (GROUP_EXPORTERS, PLACE, "n1-agent", {"gputopo-nodes"}, None, False, "exporters by group"),
    (GROUP_EXPORTERS, REPORT, "n1-agent", {"gputopo-nodes"}, None, True, "... still report"),
    (
        GROUP_EXPORTERS,
        PLACE,
        "gputopo-exporter",
        set(),
        None,
        True,
        "the list replaces the default",
    ),
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case[6]) for case in GROUP_CASES])
def test_the_role_table_by_certificate_group(case: tuple[Any, ...]) -> None:
    roles, method, caller, groups, holder, allowed, _ = case
    why = roles.denial(method, caller, holder=holder, groups=frozenset(groups))
    assert (why is None) is allowed, why


def test_every_rpc_of_the_protos_has_a_role() -> None:
    from gputopo.v1 import placement_pb2, reporter_pb2

    services = (
        placement_pb2.DESCRIPTOR.services_by_name["Placement"],
        reporter_pb2.DESCRIPTOR.services_by_name["Reporter"],
    )
    names = {f"/{svc.full_name}/{m.name}" for svc in services for m in svc.methods}
    assert names == set(METHOD_ROLES)
    assert METHOD_ROLES[REPORT] is Role.REPORT


class Certs:
    def __init__(self, tmp: Path) -> None:
        ca = TestCA("gputopo-ca")
        self.server = ca.issue(tmp / "server", "localhost")
        self.exporter = ca.issue(tmp / "exporter", "gputopo-exporter")
        self.alice = ca.issue(tmp / "alice", "gputopo-scheduler")
        self.bob = ca.issue(tmp / "bob", "another-client")
        self.ops = ca.issue(tmp / "ops", "gputopo-operator")
        self.member = ca.issue(tmp / "member", "carol", organizations=["ml-platform"])
        self.outsider = ca.issue(tmp / "outsider", "dave", organizations=["web"])


def serve(tmp: Path, body: Callable[[Aggregator, Certs], Awaitable[None]], **config: Any) -> None:
    certs = Certs(tmp)

    async def go() -> None:
        agg = Aggregator(
            AggregatorConfig(
                http_port=0,
                tls=certs.server,
                operators=("gputopo-operator",),
                require_node_identity=False,
                **config,
            )
        )
        for topo in fabric_cluster(spines=1, leaves_per_spine=1, nodes_per_leaf=2, gpus=8):
            agg.state.add_static(topo)
        await agg.start()
        try:
            await body(agg, certs)
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(go(), timeout=60))


def channel(agg: Aggregator, tls: TlsFiles) -> grpc.aio.Channel:
    return grpcio.channel(f"localhost:{agg.grpc_port}", tls=tls)


def test_the_exporter_certificate_reports_but_may_not_place_commit_or_explain(
    tmp_path: Path,
) -> None:
    async def body(agg: Aggregator, certs: Certs) -> None:
        async with channel(agg, certs.exporter) as e, channel(agg, certs.alice) as a:
            exporter, alice = PlacementClient(e), PlacementClient(a)
            rid = (await alice.place(TP8)).reservation.id  # type: ignore[union-attr]
            for call in (
                exporter.place(TP8),
                exporter.commit(rid, owner="x"),
                exporter.release(rid),
                exporter.explain(rid),
            ):
                with pytest.raises(PlacementCallError) as err:
                    await call
                assert err.value.status == "PERMISSION_DENIED"
                assert "may Report only" in err.value.message
            held = agg.state.reservation(rid)
            assert held is not None
            assert not held.committed
            # ... while its Report is applied
            topo = topology_to_proto(nvswitch_node("n-new", gpus=8))
            call = rgrpc.ReporterStub(e).Report()
            await call.write(
                rpb.ReportRequest(
                    node_name="n-new",
                    incarnation=1,
                    sequence=1,
                    snapshot=rpb.Snapshot(topology=topo),
                )
            )
            assert (await call.read()).status == rpb.ReportResponse.STATUS_ACCEPTED
            await call.done_writing()
            assert agg.state.record("n-new") is not None

    serve(tmp_path, body)


def test_a_reservation_is_explained_to_its_holder_and_operators_only(tmp_path: Path) -> None:
    async def body(agg: Aggregator, certs: Certs) -> None:
        async with (
            channel(agg, certs.alice) as a,
            channel(agg, certs.bob) as b,
            channel(agg, certs.ops) as o,
        ):
            alice, bob, ops = PlacementClient(a), PlacementClient(b), PlacementClient(o)
            rid = (await alice.place(TP8)).reservation.id  # type: ignore[union-attr]
            assert (await alice.explain(rid)).placed
            assert (await ops.explain(rid)).placed
            with pytest.raises(PlacementCallError) as err:
                await bob.explain(rid)
            assert err.value.status == "PERMISSION_DENIED"
            assert "held by 'gputopo-scheduler'" in err.value.message
            # the HTTP mirror asks the same table
            url = f"https://localhost:{agg.http_port}/api/v1/placement/explain"
            for tls, want in ((certs.bob, 403), (certs.alice, 200), (certs.exporter, 403)):
                ssl = ssl_client_context(tls)
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(url, json={"reservation_id": rid}, ssl=ssl) as resp,
                ):
                    assert resp.status == want, (tls.cert, await resp.text())

    serve(tmp_path, body)


def test_a_placement_client_named_by_group_places_over_grpc_and_https(tmp_path: Path) -> None:
    """`--placement-client group:ml-platform`: a certificate with O=ml-platform places, one
    with another Organization is refused, over gRPC and the HTTP mirror alike."""

    async def body(agg: Aggregator, certs: Certs) -> None:
        async with channel(agg, certs.member) as m, channel(agg, certs.outsider) as o:
            assert (await PlacementClient(m).place(TP8, dry_run=True)).result.placed
            with pytest.raises(PlacementCallError) as err:
                await PlacementClient(o).place(TP8, dry_run=True)
            assert err.value.status == "PERMISSION_DENIED"
            assert "not a placement client" in err.value.message
        url = f"https://localhost:{agg.http_port}/api/v1/placement/place"
        request = {"request": {"groups": [{"name": "tp", "gpus_per_pod": 8}]}, "dry_run": True}
        for tls, want in ((certs.outsider, 403), (certs.member, 200)):
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, json=request, ssl=ssl_client_context(tls)) as resp,
            ):
                assert resp.status == want, (tls.cert, await resp.text())

    serve(tmp_path, body, placement_clients=("group:ml-platform",))


def test_a_node_agent_may_not_watch_the_topology_either(tmp_path: Path) -> None:
    """WatchTopology, a server stream, is read like GetTopology: not by a node agent's
    certificate, and by any other."""

    async def body(agg: Aggregator, certs: Certs) -> None:
        async with channel(agg, certs.exporter) as e, channel(agg, certs.bob) as b:
            refused = pgrpc.PlacementStub(e).WatchTopology(ppb.WatchTopologyRequest())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await refused.read()
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "may Report only" in str(err.value.details())
            watch = pgrpc.PlacementStub(b).WatchTopology(ppb.WatchTopologyRequest())
            first = await watch.read()
            assert first.type == ppb.TopologyEvent.TYPE_NODE_UPDATED
            watch.cancel()

    serve(tmp_path, body)


def test_a_node_agent_may_not_read_the_topology_over_https_either(tmp_path: Path) -> None:
    """The HTTP reads (`/api/v1/topology`, nodes, holders, summary) are GetTopology's role: a
    node agent's certificate is refused with the reason, any other reads."""

    async def body(agg: Aggregator, certs: Certs) -> None:
        base = f"https://localhost:{agg.http_port}/api/v1"
        node = agg.state.node_names[0]
        for path in ("/topology", f"/nodes/{node}", f"/nodes/{node}/holders", "/summary"):
            for tls, want in ((certs.exporter, 403), (certs.bob, 200), (certs.ops, 200)):
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(base + path, ssl=ssl_client_context(tls)) as resp,
                ):
                    text = await resp.text()
                    assert resp.status == want, (path, tls.cert, text)
                    if want == 403:
                        assert "may Report only" in text

    serve(tmp_path, body)
