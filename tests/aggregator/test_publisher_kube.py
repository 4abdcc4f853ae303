"""The label publisher against the real kube-apiserver of tests/harness."""

from __future__ import annotations

import asyncio
import io
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from aggregator.labels import LabelScheme
from aggregator.server import KubeOptions
from gputopo.machines import with_gpu_fabric
from gputopo.runtime.kube import FIELD_MANAGER, MERGE_PATCH, KubeClient, NodeObject
from gputopo.topology import NodeTopology
from tests.aggregator.kubeutil import (
    aggregator,
    create_nodes,
    eventually,
    exporters,
    fast_publisher,
    read_nodes,
    resource_versions,
    run,
)
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

SCHEME = LabelScheme()
OWN_KEYS = {
    "fabric.topograph.run/tier-0",
    "fabric.topograph.run/tier-1",
    "fabric.topograph.run/tier-2",
    "gputopo.io/leaf",
    "gputopo.io/spine",
    "gputopo.io/core",
    "gputopo.io/nvlink-domain-size",
    "gputopo.io/interconnect",
    "gputopo.io/gpu-count",
    "gputopo.io/numa-count",
    "gputopo.io/nic-count",
    "gputopo.io/degraded-links",
    "gputopo.io/stale",
    "gputopo.io/topology-generation",
    "gputopo.io/topology-source",
    "gputopo.io/topology-confidence",
}
UUID = "9277d399-0674-44a9-b64e-d85bb19ce2b0"


def cluster(scope: KubeScope, *, spines: int, leaves: int, nodes: int) -> list[NodeTopology]:
    topologies = fabric_cluster(
        spines=spines, leaves_per_spine=leaves, nodes_per_leaf=nodes, gpus=8, prefix=scope.name("g")
    )
    # The last leaf is one NVL72-style rack: its nodes share a multi-node NVLink domain.
    rack = {t.name for t in topologies if t.fabric.tiers[0] == topologies[-1].fabric.tiers[0]}
    return [
        with_gpu_fabric(t, cluster_uuid=UUID, clique_id=1) if t.name in rack else t
        for t in topologies
    ]


def expected(topo: NodeTopology, rack_gpus: int) -> dict[str, str]:
    leaf, spine, core = topo.fabric.tiers
    in_rack = topo.gpus[0].fabric is not None
    out = {
        "fabric.topograph.run/tier-0": leaf,
        "fabric.topograph.run/tier-1": spine,
        "fabric.topograph.run/tier-2": core,
        "gputopo.io/leaf": leaf,
        "gputopo.io/spine": spine,
        "gputopo.io/core": core,
        "gputopo.io/gpu-count": "8",
        "gputopo.io/nic-count": "8",
        "gputopo.io/stale": "false",
        "gputopo.io/topology-generation": "1",
        "gputopo.io/interconnect": "mnnvl" if in_rack else "nvswitch",
        "gputopo.io/nvlink-domain-size": str(rack_gpus if in_rack else 8),
    }
    if in_rack:
        out["accelerator.topograph.run/domain"] = UUID
        out["accelerator.topograph.run/sub-domain"] = f"{UUID}.1"
    return out


def owned(node: NodeObject) -> set[str]:
    return set(node.labels_of(FIELD_MANAGER))


def test_200_simulated_nodes_converge_and_foreign_labels_stay(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    topologies = cluster(kube_scope, spines=2, leaves=5, nodes=20)
    assert len(topologies) == 200
    names = [t.name for t in topologies]
    # Someone else's labels, including two keys this aggregator would like to write.
    foreign = {"team": "ml", "gputopo.io/numa-count": "42"}
    special = names[3]

    async def body() -> None:
        await create_nodes(kube_apiserver, names, labels=foreign)
        client = KubeClient(kube_apiserver.api_client())
        await client.request(  # topograph's own label, set before gputopo runs
            "PATCH",
            f"/api/v1/nodes/{special}",
            query={"fieldManager": "topograph"},
            body={"metadata": {"labels": {"fabric.topograph.run/tier-0": "set-by-topograph"}}},
            content_type=MERGE_PATCH,
        )
        client.close()
        options = KubeOptions(publisher=fast_publisher(settle_s=0.5))
        async with aggregator(kube_apiserver, options=options) as agg, exporters(agg, topologies):
            assert agg.publisher is not None
            await agg.publisher.wait_idle(60)
            # One patch per node, plus a few for the rack's trays: on a first start the rack's
            # NVLink domain size grows while its trays report (settling coalesces most of it).
            rack = sum(1 for t in topologies if t.gpus[0].fabric is not None)
            assert 200 <= agg.publisher.stats.patches <= 200 + 2 * rack
            nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
            rack_gpus = 8 * sum(1 for t in topologies if t.gpus[0].fabric is not None)
            for topo in topologies:
                node = nodes[topo.name]
                want = expected(topo, rack_gpus)
                if topo.name == special:
                    want["fabric.topograph.run/tier-0"] = "set-by-topograph"
                assert {k: node.labels.get(k) for k in want} == want, topo.name
                assert node.labels["team"] == "ml"
                assert node.labels["gputopo.io/numa-count"] == "42", "a foreign label was changed"
                mine = OWN_KEYS - {"gputopo.io/numa-count"}
                if topo.name == special:
                    mine -= {"fabric.topograph.run/tier-0"}
                if topo.gpus[0].fabric is not None:
                    mine |= {
                        "accelerator.topograph.run/domain",
                        "accelerator.topograph.run/sub-domain",
                    }
                assert owned(node) == mine, topo.name
                assert node.annotations[SCHEME.fingerprint_annotation]
            assert agg.publisher.stats.foreign["gputopo.io/numa-count"] >= 200
            # The exporters' own tiers outrank the foreign topograph label; the conflict is kept.
            rec = agg.state.record(special)
            assert rec is not None
            assert rec.resolution is not None
            assert [c.ignored_source for c in rec.resolution.conflicts] == ["labels/topograph"]

    run(body())


def test_a_restart_patches_nothing_when_nothing_changed(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    topologies = cluster(kube_scope, spines=1, leaves=3, nodes=6)
    names = [t.name for t in topologies]

    # The first labelling waits a second for the rack's trays to report: on a loaded machine
    # they straggle past the default 0.1 s, and a tray labelled while its rack was half known is
    # (rightly) relabelled, which this first count is not about.
    patient = KubeOptions(publisher=fast_publisher(settle_s=1.0))

    async def body() -> None:
        await create_nodes(kube_apiserver, names)
        async with (
            aggregator(kube_apiserver, options=patient) as first,
            exporters(first, topologies),
        ):
            assert first.publisher is not None
            await first.publisher.wait_idle(30)
            assert first.publisher.stats.patches == len(names)
        before = await resource_versions(kube_apiserver, kube_scope.prefix)
        # A new aggregator process: empty state, rebuilt from the streams and the Node objects.
        # The rack's nodes report one by one; the warm-up keeps the NVLink domain size (which
        # depends on all of them) from being relabelled while the rack is half known.
        async with aggregator(kube_apiserver) as second:
            assert second.publisher is not None
            await second.publisher.synced.wait()
            for topo in topologies:
                async with exporters(second, [topo]):
                    await asyncio.sleep(0.02)
            async with exporters(second, topologies):
                await second.publisher.wait_idle(30)
                assert second.publisher.stats.warm
                assert second.publisher.stats.planned == 0
                assert second.publisher.stats.patches == 0
        after = await resource_versions(kube_apiserver, kube_scope.prefix)
        assert after == before

    run(body())


def test_the_nvlink_domain_size_follows_the_rack_as_its_trays_join(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    trays = [t for t in cluster(kube_scope, spines=1, leaves=1, nodes=4) if t.gpus[0].fabric]
    assert len(trays) == 4

    async def body() -> None:
        await create_nodes(kube_apiserver, [t.name for t in trays])
        async with aggregator(kube_apiserver) as agg:
            assert agg.publisher is not None
            for joined in range(1, len(trays) + 1):
                # Each tray joins and is labelled before the next: the earlier trays' domain
                # size must grow with it although they did not report anything new.
                async with exporters(agg, trays[joined - 1 : joined]):
                    await agg.publisher.wait_idle(30)
                nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
                sizes = {
                    nodes[t.name].labels.get("gputopo.io/nvlink-domain-size")
                    for t in trays[:joined]
                }
                assert sizes == {str(8 * joined)}, (joined, sizes)

    run(body())


def test_a_node_that_stops_reporting_is_labelled_stale(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    topologies = cluster(kube_scope, spines=1, leaves=1, nodes=2)
    quiet, talker = topologies

    async def body() -> None:
        await create_nodes(kube_apiserver, [t.name for t in topologies])
        options = KubeOptions(publisher=fast_publisher())
        async with (
            aggregator(kube_apiserver, options=options, stale_after_s=1.0) as agg,
            exporters(agg, [talker]),
        ):
            async with exporters(agg, [quiet]):
                assert agg.publisher is not None
                await agg.publisher.wait_idle(30)

            async def quiet_is_stale() -> bool:
                nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
                return nodes[quiet.name].labels.get("gputopo.io/stale") == "true"

            await eventually(quiet_is_stale, timeout_s=10, what="the silent node labelled stale")
            nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
            assert nodes[talker.name].labels["gputopo.io/stale"] == "false"
            assert not agg.state.snapshot().node(quiet.name).placeable

    run(body())


def test_a_label_another_manager_changes_is_theirs_and_never_reverted(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, caplog: pytest.LogCaptureFixture
) -> None:
    """The label war of issue 12: topograph set its own tier key (and a person one of ours) after
    gputopo had applied them. The server hands those keys to their new managers; gputopo leaves
    them, says whose they are, and reads them; the rest stays gputopo's."""
    (topo,) = cluster(kube_scope, spines=1, leaves=1, nodes=1)
    tier0 = "fabric.topograph.run/tier-0"

    async def body() -> None:
        await create_nodes(kube_apiserver, [topo.name])
        options = KubeOptions(publisher=fast_publisher(settle_s=0.2))
        async with aggregator(kube_apiserver, options=options) as agg, exporters(agg, [topo]):
            publisher = agg.publisher
            assert publisher is not None
            await publisher.wait_idle(30)
            before = (await read_nodes(kube_apiserver, kube_scope.prefix))[topo.name]
            assert tier0 in owned(before)
            assert "gputopo.io/gpu-count" in owned(before)
            assert before.label_managers[tier0] == {FIELD_MANAGER}  # applied, by gputopo alone
            client = KubeClient(kube_apiserver.api_client())
            await client.request(
                "PATCH",
                f"/api/v1/nodes/{topo.name}",
                query={"fieldManager": "topograph"},
                body={"metadata": {"labels": {tier0: "set-by-topograph"}}},
                content_type=MERGE_PATCH,
            )
            await client.request(
                "PATCH",
                f"/api/v1/nodes/{topo.name}",
                query={"fieldManager": "kubectl-edit"},
                body={"metadata": {"labels": {"gputopo.io/gpu-count": "3", "team": "infra"}}},
                content_type=MERGE_PATCH,
            )

            async def told() -> bool:
                return publisher.stats.foreign[tier0] > 0

            await eventually(told, timeout_s=20, what="the publisher to see topograph's key")
            await publisher.wait_idle(30)
            await asyncio.sleep(1.5)  # longer than settling: a revert would have happened
            node = (await read_nodes(kube_apiserver, kube_scope.prefix))[topo.name]
            assert node.labels[tier0] == "set-by-topograph"
            assert node.labels["gputopo.io/gpu-count"] == "3"
            assert node.label_managers[tier0] == {"topograph"}
            assert node.label_managers["gputopo.io/gpu-count"] == {"kubectl-edit"}
            assert owned(node) == owned(before) - {tier0, "gputopo.io/gpu-count"}
            for key in owned(node):  # the rest is kept
                assert node.labels[key] == before.labels[key], key
            assert "belongs to topograph; gputopo leaves it and reads it as a source" in caplog.text
            # Read as a source: the labels source now names topograph's value for the leaf.
            rec = agg.state.record(topo.name)
            assert rec is not None
            assert rec.resolution is not None
            assert "labels/topograph" in [c.ignored_source for c in rec.resolution.conflicts]

            # Acting on a view that is out of date (it still believes gpu-count is gputopo's
            # and wrong): the conditional apply gets 409, the publisher reads the node again,
            # finds the key is someone else's, and sends nothing.
            stale_view = replace(before, labels={**before.labels, "gputopo.io/gpu-count": "7"})
            conflicts = publisher.stats.conflicts
            publisher.cache[topo.name] = stale_view
            await publisher.reconcile(topo.name)
            assert publisher.stats.conflicts > conflicts
            node = (await read_nodes(kube_apiserver, kube_scope.prefix))[topo.name]
            assert node.labels["gputopo.io/gpu-count"] == "3"
            assert node.labels["team"] == "infra"
            client.close()

    with caplog.at_level(logging.INFO, logger="aggregator.publisher"):
        run(body())


def test_dry_run_prints_the_patches_and_writes_nothing(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    topologies = cluster(kube_scope, spines=1, leaves=1, nodes=2)

    async def body() -> None:
        await create_nodes(kube_apiserver, [t.name for t in topologies])
        before = await resource_versions(kube_apiserver, kube_scope.prefix)
        out = io.StringIO()
        options = KubeOptions(publisher=fast_publisher(dry_run=True))
        async with (
            aggregator(kube_apiserver, options=options, out=out) as agg,
            exporters(agg, topologies),
        ):
            assert agg.publisher is not None
            await agg.publisher.wait_idle(30)
            assert agg.publisher.stats.patches == 0
            assert agg.publisher.stats.planned == 2
        after = await resource_versions(kube_apiserver, kube_scope.prefix)
        assert after == before
        lines = out.getvalue().splitlines()
        for topo in topologies:
            assert f"{topo.name}: +gputopo.io/gpu-count=8" in lines
            assert f"{topo.name}: +fabric.topograph.run/tier-0={topo.fabric.tiers[0]}" in lines

    run(body())


def test_throttling_by_the_api_server_is_waited_out(tmp_path: Path) -> None:
    # A server of its own that admits one mutating request at a time and answers 429 to the
    # rest. system:masters is exempt from that limit, so the aggregator runs as alice, bound to
    # cluster-admin.
    extra = ["--max-mutating-requests-inflight=1", "--enable-priority-and-fairness=false"]
    with KubeApiServer.start(workdir=tmp_path, extra_args=extra) as kube:
        topologies = fabric_cluster(spines=1, leaves_per_spine=4, nodes_per_leaf=20, prefix="t")
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "alice-cluster-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        }
        with kube.json_session() as session:
            path = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
            assert session.request("POST", path, body=binding).ok

        async def body() -> None:
            await create_nodes(kube, [t.name for t in topologies])
            options = KubeOptions(publisher=fast_publisher(workers=24, qps=5000.0, burst=5000))
            alice = kube.token_for("alice")
            async with (
                aggregator(kube, options=options, token=alice) as agg,
                exporters(agg, topologies),
            ):
                assert agg.publisher is not None
                await agg.publisher.wait_idle(60)
                stats = agg.publisher.stats
                assert stats.patches == len(topologies)
                assert stats.throttled > 0, "the server never throttled: the test proved nothing"
                assert stats.errors == 0
            nodes = await read_nodes(kube, "t-")
            assert all(n.labels.get("gputopo.io/gpu-count") == "8" for n in nodes.values())

        run(body())
