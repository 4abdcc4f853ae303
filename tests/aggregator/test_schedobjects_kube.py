"""Scheduler objects pass their CRDs' schemas on a real API server, and the writer owns only its
own objects."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
import yaml

from aggregator.exports import KAI_TOPOLOGY, KUEUE_TOPOLOGY, VOLCANO_HYPERNODE, ObjectKind
from aggregator.server import KubeOptions
from gputopo.runtime.kube import KubeClient, KubeError
from gputopo.topology import FabricPosition
from tests.aggregator.kubeutil import (
    aggregator,
    eventually,
    exporters,
    fast_publisher,
    install_crds,
    run,
)
from tests.builders import fabric_cluster
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

CRD_FILES = ("kueue-topologies.yaml", "kai-topologies.yaml", "volcano-hypernodes.yaml")
KUEUE_IN_USE = "kueue.x-k8s.io/resource-in-use"
KINDS = {"kueue": KUEUE_TOPOLOGY, "kai": KAI_TOPOLOGY, "volcano": VOLCANO_HYPERNODE}


def export(fmt: str) -> list[dict[str, Any]]:
    """What `gputopo export FORMAT` prints, run as users run it."""
    code = "import sys; from gputopo.app.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run(
        [sys.executable, "-c", code, "export", fmt], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("fmt", ["kueue", "kai", "volcano"])
def test_exported_objects_of_the_demo_cluster_pass_the_crd_schema(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, fmt: str
) -> None:
    install_crds(kube_scope, *CRD_FILES)
    objects = export(fmt)
    assert objects
    kind = KINDS[fmt]

    async def body() -> None:
        client = KubeClient(kube_apiserver.api_client())
        try:
            for obj in objects:
                # Server-side dry run: full validation against the CRD schema, nothing stored.
                created = await client.create_object(
                    kind.group_version, kind.plural, obj, dry_run=True
                )
                assert created["spec"] == obj["spec"]
            bad = {**objects[0], "spec": {"levels": []} if fmt != "volcano" else {"tier": -1}}
            with pytest.raises(KubeError) as info:
                await client.create_object(kind.group_version, kind.plural, bad, dry_run=True)
            assert info.value.status == 422
        finally:
            client.close()

    run(body())


async def _objects(client: KubeClient, kind: ObjectKind) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o for o in await client.list_objects(kind.group_version, kind.plural)
    }


def test_the_writer_creates_updates_and_deletes_only_its_own_objects(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    install_crds(kube_scope, *CRD_FILES)
    topologies = fabric_cluster(
        spines=2, leaves_per_spine=1, nodes_per_leaf=2, prefix=kube_scope.name("g")
    )
    foreign = {
        "apiVersion": KUEUE_TOPOLOGY.group_version,
        "kind": "Topology",
        "metadata": {"name": "someone-elses", "labels": kube_scope.labels},
        "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]},
    }

    async def body() -> None:
        client = KubeClient(kube_apiserver.api_client())
        await client.create_object(KUEUE_TOPOLOGY.group_version, KUEUE_TOPOLOGY.plural, foreign)
        options = KubeOptions(
            publish_labels=False,
            publisher=fast_publisher(),
            scheduler_objects=("kueue", "kai", "volcano"),
        )
        async with aggregator(kube_apiserver, options=options) as agg:
            writer = agg.scheduler_objects
            assert writer is not None
            writer.settle_s = 0.1
            async with exporters(agg, topologies) as sim:

                async def written() -> bool:
                    hns = await _objects(client, VOLCANO_HYPERNODE)
                    return len(hns) == 2 + 2 + 1  # two leaves, two spines, one core

                await eventually(written, timeout_s=20, what="HyperNodes written")
                kueue = await _objects(client, KUEUE_TOPOLOGY)
                assert set(kueue) == {"gputopo-fabric", "someone-elses"}
                assert [lv["nodeLabel"] for lv in kueue["gputopo-fabric"]["spec"]["levels"]] == [
                    "gputopo.io/core",
                    "gputopo.io/spine",
                    "gputopo.io/leaf",
                    "kubernetes.io/hostname",
                ]
                kai = await _objects(client, KAI_TOPOLOGY)
                assert set(kai) == {"gputopo-fabric"}
                # Kueue marks a Topology a ClusterQueue uses with its in-use finalizer; deleting
                # it then only marks it (409 "being deleted" on every later create).
                ours = kueue["gputopo-fabric"]
                ours["metadata"]["finalizers"] = [KUEUE_IN_USE]
                ours = await client.replace_object(
                    KUEUE_TOPOLOGY.group_version, KUEUE_TOPOLOGY.plural, ours
                )
                # The fabric flattens to one tier: Kueue's v1beta2 levels change in place (the
                # hostname level stays lowest), KAI's are immutable (delete and create), and
                # HyperNodes above the leaves go away.
                for t in topologies:
                    sim.update(replace(t, fabric=FabricPosition(tiers=(t.fabric.tiers[0],))))

                async def flattened() -> bool:
                    hns = await _objects(client, VOLCANO_HYPERNODE)
                    return sorted(h["spec"]["tier"] for h in hns.values()) == [1, 1]

                await eventually(flattened, timeout_s=20, what="HyperNodes follow the fabric")
                kueue = await _objects(client, KUEUE_TOPOLOGY)
                assert [lv["nodeLabel"] for lv in kueue["gputopo-fabric"]["spec"]["levels"]] == [
                    "gputopo.io/leaf",
                    "kubernetes.io/hostname",
                ]
                after = kueue["gputopo-fabric"]["metadata"]
                assert after["uid"] == ours["metadata"]["uid"], "updated in place, not recreated"
                assert after["finalizers"] == [KUEUE_IN_USE], "Kueue's finalizer is kept"
                assert "deletionTimestamp" not in after
                kai_after = (await _objects(client, KAI_TOPOLOGY))["gputopo-fabric"]
                assert kai_after["metadata"]["uid"] != kai["gputopo-fabric"]["metadata"]["uid"]
                assert len(kai_after["spec"]["levels"]) == 2
                # Let the scope's cleanup delete it, as Kueue would once no queue uses it.
                after["finalizers"] = []
                await client.replace_object(
                    KUEUE_TOPOLOGY.group_version,
                    KUEUE_TOPOLOGY.plural,
                    {**kueue["gputopo-fabric"], "metadata": after},
                )
                assert kueue["someone-elses"]["spec"] == foreign["spec"], "not ours: untouched"
        client.close()

    run(body())
