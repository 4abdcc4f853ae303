"""Builders for test objects: small synthetic machines and clusters with readable parameters.

Recorded machines (gputopo.machines) are the fakes of real hardware; these builders make the
shapes a test needs explicit in one line (an NVSwitch node, a PCIe server with bridged pairs)
without depending on a recording's quirks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.links import LinkKind
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import (
    FabricPosition,
    Gpu,
    Link,
    Nic,
    NicKind,
    NodeTopology,
    gpu,
    nic,
)


def nvswitch_node(
    name: str,
    *,
    gpus: int = 8,
    lanes: int = 18,
    generation: int = 4,
    nics: int = 8,
    nic_mbps: int = 400_000,
    numa_nodes: int = 2,
    tiers: Sequence[str] = (),
    domain: str = "",
) -> NodeTopology:
    """An HGX-style node: every GPU pair NVLink through NVSwitch, one NIC per GPU on its switch."""
    per_numa = max(gpus // numa_nodes, 1)
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            numa_node=i // per_numa,
            nvlink_generation=generation,
            nvlink_lanes=lanes,
            nvlink_max_lanes=lanes,
            pcie_generation=5,
            pcie_width=16,
        )
        for i in range(gpus)
    )
    nic_list = tuple(
        Nic(
            index=i,
            name=f"mlx5_{i}",
            kind=NicKind.INFINIBAND,
            speed_mbps=nic_mbps,
            numa_node=i * gpus // max(nics, 1) // per_numa,
        )
        for i in range(nics)
    )
    links: list[Link] = [
        Link(
            gpu(a),
            gpu(b),
            LinkKind.NVLINK,
            lanes=lanes,
            max_lanes=lanes,
            generation=generation,
            via_switch=True,
        )
        for a in range(gpus)
        for b in range(a + 1, gpus)
    ]
    links += _nic_links(gpu_list, nic_list, gpus_per_nic=max(gpus // max(nics, 1), 1))
    return with_nominal_bandwidth(
        NodeTopology(
            name=name,
            gpus=gpu_list,
            nics=nic_list,
            links=tuple(links),
            fabric=FabricPosition(tiers=tuple(tiers), accelerator_domain=domain),
        )
    )


def pcie_node(
    name: str,
    *,
    gpus: int = 8,
    bridged_pairs: Iterable[tuple[int, int]] = (),
    bridge_lanes: int = 12,
    nics: int = 1,
    numa_nodes: int = 2,
    tiers: Sequence[str] = (),
) -> NodeTopology:
    """A PCIe server: GPUs behind switches per NUMA node, optional NVLink bridges between pairs."""
    per_numa = max(gpus // numa_nodes, 1)
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            numa_node=i // per_numa,
            nvlink_generation=4,
            pcie_generation=5,
            pcie_width=16,
        )
        for i in range(gpus)
    )
    bridges = {tuple(sorted(p)) for p in bridged_pairs}
    links: list[Link] = []
    for a in range(gpus):
        for b in range(a + 1, gpus):
            if (a, b) in bridges:
                links.append(
                    Link(
                        gpu(a),
                        gpu(b),
                        LinkKind.NVLINK,
                        lanes=bridge_lanes,
                        max_lanes=bridge_lanes,
                        generation=4,
                    )
                )
            elif a // 2 == b // 2:
                links.append(Link(gpu(a), gpu(b), LinkKind.PIX))
            elif a // per_numa == b // per_numa:
                links.append(Link(gpu(a), gpu(b), LinkKind.NODE))
            else:
                links.append(Link(gpu(a), gpu(b), LinkKind.SYS))
    nic_list = tuple(
        Nic(index=i, name=f"eth{i}", kind=NicKind.ETHERNET, speed_mbps=100_000, numa_node=0)
        for i in range(nics)
    )
    links += _nic_links(gpu_list, nic_list, gpus_per_nic=gpus)
    return with_nominal_bandwidth(
        NodeTopology(
            name=name,
            gpus=gpu_list,
            nics=nic_list,
            links=tuple(links),
            fabric=FabricPosition(tiers=tuple(tiers)),
        )
    )


def _nic_links(gpus: Sequence[Gpu], nics: Sequence[Nic], *, gpus_per_nic: int) -> list[Link]:
    links = []
    for g in gpus:
        for n in nics:
            if g.index // gpus_per_nic == n.index:
                kind = LinkKind.PIX
            elif g.numa_node == n.numa_node:
                kind = LinkKind.NODE
            else:
                kind = LinkKind.SYS
            links.append(Link(gpu(g.index), nic(n.index), kind))
    return links


def snapshot(
    nodes: Iterable[NodeTopology],
    *,
    used: Mapping[str, Iterable[int]] | None = None,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    stale: Iterable[str] = (),
) -> ClusterSnapshot:
    """A snapshot where every GPU is free except `used[node]`."""
    used = used or {}
    labels = labels or {}
    stale_set = set(stale)
    return ClusterSnapshot(
        NodeState(
            topology=t,
            free=frozenset(range(t.gpu_count)) - frozenset(used.get(t.name, ())),
            labels=dict(labels.get(t.name, {})),
            placeable=t.name not in stale_set,
            reason="stale" if t.name in stale_set else "",
        )
        for t in nodes
    )


def fabric_cluster(
    *,
    spines: int = 2,
    leaves_per_spine: int = 2,
    nodes_per_leaf: int = 4,
    gpus: int = 8,
    core: str = "core",
    prefix: str = "node",
) -> list[NodeTopology]:
    """NVSwitch nodes under a leaf/spine/core tree, named `<prefix>-<spine><leaf>-<n>`.

    Tiers are closest first: (`leaf-<s>-<l>`, `spine-<s>`, core).
    """
    nodes = []
    for s in range(spines):
        for leaf in range(leaves_per_spine):
            for n in range(nodes_per_leaf):
                nodes.append(
                    nvswitch_node(
                        f"{prefix}-{s}{leaf}-{n}",
                        gpus=gpus,
                        nics=min(gpus, 8),
                        tiers=(f"leaf-{s}-{leaf}", f"spine-{s}", core),
                    )
                )
    return nodes
