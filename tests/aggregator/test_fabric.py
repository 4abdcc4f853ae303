"""Inter-node sources and their precedence: inventory > NVML > labels > probes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from aggregator.fabric import (
    FabricSources,
    SourceFacts,
    facts_from_labels,
    facts_from_nvml,
    resolve,
)
from aggregator.state import ClusterState
from gputopo.inventory import parse_inventory
from gputopo.machines import with_gpu_fabric
from gputopo.topology import FabricPosition, FabricState, GpuFabric
from tests.builders import nvswitch_node

UUID = "9277d399-0674-44a9-b64e-d85bb19ce2b0"


@dataclass(frozen=True)
class LabelCase:
    id: str
    labels: dict[str, str]
    want_source: str
    want_tiers: tuple[str, ...] = ()
    want_domain: str = ""
    want_sub_domain: str = ""


LABEL_CASES = [
    LabelCase(
        "topograph v1 tiers, closest first, and its accelerator keys",
        {
            "fabric.topograph.run/tier-0": "leaf-a",
            "fabric.topograph.run/tier-1": "spine-a",
            "fabric.topograph.run/tier-2": "core",
            "accelerator.topograph.run/domain": "nvl-1",
            "accelerator.topograph.run/sub-domain": "nvl-1.0",
        },
        "labels/topograph",
        ("leaf-a", "spine-a", "core"),
        "nvl-1",
        "nvl-1.0",
    ),
    LabelCase(
        "topograph tiers stop at the first missing level",
        {"fabric.topograph.run/tier-0": "l", "fabric.topograph.run/tier-2": "c"},
        "labels/topograph",
        ("l",),
    ),
    LabelCase(
        "EKS numbers layers from the top: the deepest present is the leaf",
        {
            "topology.k8s.aws/network-node-layer-1": "nn-top",
            "topology.k8s.aws/network-node-layer-2": "nn-mid",
            "topology.k8s.aws/network-node-layer-3": "nn-leaf",
        },
        "labels/eks",
        ("nn-leaf", "nn-mid", "nn-top"),
    ),
    LabelCase(
        "EKS four-layer instance types have their leaf at layer 4",
        {f"topology.k8s.aws/network-node-layer-{i}": f"nn{i}" for i in range(1, 5)},
        "labels/eks",
        ("nn4", "nn3", "nn2", "nn1"),
    ),
    LabelCase(
        "EKS UltraServer id is the NVLink domain",
        {"topology.k8s.aws/ultraserver-id": "us-1"},
        "labels/eks",
        (),
        "us-1",
    ),
    LabelCase(
        "GKE sub-block inside block",
        {
            "cloud.google.com/gce-topology-block": "b1",
            "cloud.google.com/gce-topology-subblock": "sb1",
            "cloud.google.com/gce-topology-host": "h1",
        },
        "labels/gke",
        ("sb1", "b1"),
    ),
    LabelCase(
        "OKE RDMA blocks and the GPU memory fabric with its rack",
        {
            "oci.oraclecloud.com/rdma.local_block_id": "lb",
            "oci.oraclecloud.com/rdma.network_block_id": "nb",
            "oci.oraclecloud.com/rdma.hpc_island_id": "hi",
            "oci.oraclecloud.com/host.gpu_memory_fabric_id": "gmf",
            "oci.oraclecloud.com/host.rack_id": "r7",
        },
        "labels/oke",
        ("lb", "nb", "hi"),
        "gmf",
        "gmf.r7",
    ),
    LabelCase(
        "CoreWeave leaf group and superpod, NVLink domain",
        {
            "ib.coreweave.cloud/leafgroup": "lg3",
            "ib.coreweave.cloud/superpod": "sp1",
            "ds.coreweave.com/nvlink.domain": "nvl-9",
        },
        "labels/coreweave",
        ("lg3", "sp1"),
        "nvl-9",
    ),
    LabelCase(
        "topograph before v1",
        {
            "network.topology.nvidia.com/leaf": "l",
            "network.topology.nvidia.com/spine": "s",
            "network.topology.nvidia.com/core": "c",
            "network.topology.nvidia.com/accelerator": "a",
        },
        "labels/topograph-v0",
        ("l", "s", "c"),
        "a",
    ),
    LabelCase(
        "GFD's clique: domain is the cluster UUID, sub-domain the whole value",
        {"nvidia.com/gpu.clique": f"{UUID}.32766"},
        "labels/gfd",
        (),
        UUID,
        f"{UUID}.32766",
    ),
]


@pytest.mark.parametrize("case", LABEL_CASES, ids=[c.id for c in LABEL_CASES])
def test_labels_written_by_others_are_read(case: LabelCase) -> None:
    (facts,) = facts_from_labels(case.labels)
    assert facts.source == case.want_source
    assert facts.confidence == "medium"
    assert facts.tiers == case.want_tiers
    assert (facts.accelerator_domain, facts.accelerator_sub_domain) == (
        case.want_domain,
        case.want_sub_domain,
    )


def test_unrelated_labels_say_nothing() -> None:
    assert facts_from_labels({"kubernetes.io/hostname": "n1", "nvidia.com/gpu.count": "8"}) == []


def test_gfd_clique_wins_the_accelerator_over_topograph_as_in_topograph() -> None:
    labels = {
        "nvidia.com/gpu.clique": f"{UUID}.1",
        "accelerator.topograph.run/domain": "other",
        "fabric.topograph.run/tier-0": "leaf",
    }
    res = resolve(facts_from_labels(labels))
    assert res.fabric.accelerator_domain == UUID
    assert res.fabric.tiers == ("leaf",)
    assert res.chosen == {"accelerator": "labels/gfd", "tiers": "labels/topograph"}
    assert [c.ignored_source for c in res.conflicts] == ["labels/topograph"]


def test_nvml_gives_the_domain_when_every_registered_gpu_agrees() -> None:
    tray = with_gpu_fabric(nvswitch_node("t", gpus=4, nics=0), cluster_uuid=UUID, clique_id=7)
    facts = facts_from_nvml(tray)
    assert facts == SourceFacts(
        "nvml", "high", accelerator_domain=UUID, accelerator_sub_domain=f"{UUID}.7"
    )
    split = replace(
        tray,
        gpus=(
            replace(tray.gpus[0], fabric=GpuFabric(UUID, 8, FabricState.COMPLETED)),
            *tray.gpus[1:],
        ),
    )
    assert facts_from_nvml(split) is None, "GPUs in two cliques: GFD writes no label either"
    unregistered = replace(
        tray,
        gpus=tuple(
            replace(g, fabric=GpuFabric(UUID, 7, FabricState.IN_PROGRESS)) for g in tray.gpus
        ),
    )
    assert facts_from_nvml(unregistered) is None


INVENTORY = """
switches:
  core: {switches: [spine-1]}
  spine-1: {switches: [leaf-1]}
blocks:
  - switch: leaf-1
    nodes: [n1]
    annotations: {accelerator.topology.test/domain: inv-nvl}
"""


@dataclass(frozen=True)
class PrecedenceCase:
    id: str
    inventory: bool
    nvml: bool
    labels: dict[str, str]
    probes: tuple[str, ...]
    want_tiers: tuple[str, ...]
    want_domain: str
    want_tiers_from: str
    want_conflicts: int


PRECEDENCE = [
    PrecedenceCase(
        "the inventory beats every other source",
        inventory=True,
        nvml=True,
        labels={"fabric.topograph.run/tier-0": "label-leaf"},
        probes=("probe-leaf",),
        want_tiers=("leaf-1", "spine-1", "core"),
        want_domain="inv-nvl",
        want_tiers_from="inventory",
        want_conflicts=3,  # labels' and probes' tiers, NVML's domain
    ),
    PrecedenceCase(
        "NVML gives the domain, labels the tiers",
        inventory=False,
        nvml=True,
        labels={"fabric.topograph.run/tier-0": "label-leaf"},
        probes=("probe-leaf",),
        want_tiers=("label-leaf",),
        want_domain=UUID,
        want_tiers_from="labels/topograph",
        want_conflicts=1,
    ),
    PrecedenceCase(
        "probes only where nothing else knows",
        inventory=False,
        nvml=False,
        labels={},
        probes=("probe-leaf", "probe-spine"),
        want_tiers=("probe-leaf", "probe-spine"),
        want_domain="",
        want_tiers_from="probes",
        want_conflicts=0,
    ),
]


@pytest.mark.parametrize("case", PRECEDENCE, ids=[c.id for c in PRECEDENCE])
def test_sources_merge_by_precedence(case: PrecedenceCase) -> None:
    sources = FabricSources(inventory=parse_inventory(INVENTORY) if case.inventory else None)
    sources.set_probe_tiers({"n1": case.probes} if case.probes else {})
    node = nvswitch_node("n1", gpus=4, nics=0)
    if case.nvml:
        node = with_gpu_fabric(node, cluster_uuid=UUID, clique_id=3)
    res = sources.resolve_node("n1", node, case.labels)
    assert res.fabric.tiers == case.want_tiers
    assert res.fabric.accelerator_domain == case.want_domain
    assert res.chosen.get("tiers") == case.want_tiers_from
    assert len(res.conflicts) == case.want_conflicts, [str(c) for c in res.conflicts]
    confidence = {"inventory": "high", "probes": "low"}.get(case.want_tiers_from, "medium")
    assert res.fabric.confidence == confidence


def test_the_state_merges_sources_and_never_reads_its_own_labels_back() -> None:
    state = ClusterState(clock=lambda: 0.0)
    state.apply_snapshot(nvswitch_node("n1", gpus=2, nics=0), incarnation=1, sequence=1)
    assert state.snapshot().node("n1").topology.fabric.tiers == ()
    ours = {"fabric.topograph.run/tier-0": "from-us"}
    state.set_labels("n1", ours, owned=frozenset(ours))
    assert state.snapshot().node("n1").topology.fabric.tiers == (), "our own label is no source"
    theirs = {"fabric.topograph.run/tier-0": "from-topograph"}
    state.set_labels("n1", theirs)
    topo = state.snapshot().node("n1").topology
    assert topo.fabric.tiers == ("from-topograph",)
    rec = state.record("n1")
    assert rec is not None
    assert rec.reported is not None
    assert rec.reported.fabric.tiers == (), "the report itself is kept as it came"


def test_an_exporters_own_fabric_report_counts_under_the_source_it_names() -> None:
    node = nvswitch_node("n1", gpus=2, nics=0)
    node = replace(
        node, fabric=FabricPosition(tiers=("imds-leaf",), source="aws", confidence="high")
    )
    res = FabricSources().resolve_node("n1", node, {"fabric.topograph.run/tier-0": "x"})
    assert res.fabric.tiers == ("imds-leaf",)
    assert res.chosen["tiers"] == "aws"
    assert res.fabric.confidence == "high"
