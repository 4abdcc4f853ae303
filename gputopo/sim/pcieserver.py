"""Synthetic PCIe servers of 16 to 32 GPUs with uneven paths, for benchmarks and tests.

DGX-2-class machines, L40S and RTX servers carry 16-20 GPUs behind trees of PCIe switches, and
no public `nvidia-smi topo -m` of such a machine is bundled (`gputopo.machines` holds only
recordings), so this builder states the tree instead. Per socket (two sockets, half the GPUs
each), GPUs sit in pairs under leaf switches (`PIX`); leaf switches hang under mid-level switches
in groups of three, then two, and a last odd leaf hangs straight off the root complex, so paths
are uneven: `PIX` inside a pair, `PXB` inside a mid switch, `NODE` inside the socket, `SYS`
across. Each mid switch (and a lone leaf) carries one RoCE NIC (`PXB` from its GPUs, `PIX` for
a lone leaf). Bandwidths are the nominal figures of `gputopo.nominal` for those kinds.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from gputopo.links import LinkKind
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import (
    DeviceKind,
    FabricPosition,
    Gpu,
    Link,
    Measurement,
    Nic,
    NicKind,
    NodeTopology,
    gpu,
    nic,
)

__all__ = [
    "MAX_TREE_GPUS",
    "measured_with_noise",
    "pcie_server",
    "pcie_tree",
    "switch_groups",
    "uneven_tree",
]

# The report bounds allow 128 GPUs per node (`gputopo.codec` limits).
MAX_TREE_GPUS = 128

NIC_MBPS = 200_000


def switch_groups(gpus: int) -> list[list[list[int]]]:
    """Per socket, the GPUs under each mid-level switch (or lone leaf), in order."""
    per_socket = gpus // 2
    sockets: list[list[list[int]]] = []
    for s in range(2):
        first = s * per_socket
        leaves = [
            list(range(g, min(g + 2, first + per_socket)))
            for g in range(first, first + per_socket, 2)
        ]
        mids: list[list[int]] = []
        size = 3
        while leaves:
            mids.append([g for leaf in leaves[:size] for g in leaf])
            leaves = leaves[size:]
            size = 2
        sockets.append(mids)
    return sockets


def pcie_server(name: str, *, gpus: int = 16, tiers: tuple[str, ...] = ()) -> NodeTopology:
    """A PCIe server of `gpus` GPUs (even, 4 to 32) with the tree of the module docstring."""
    if gpus % 2 or not 4 <= gpus <= 32:
        raise ValueError(f"gpus must be even and within 4..32, got {gpus}")
    leaves: list[list[list[int]]] = []
    for sock in switch_groups(gpus):
        leaves.append([[len(m[i : i + 2]) for i in range(0, len(m), 2)] for m in sock])
    return pcie_tree(name, sockets=leaves, tiers=tiers)


def uneven_tree(gpus: int, *, seed: int, sockets: int = 2) -> list[list[list[int]]]:
    """A deterministic uneven PCIe tree of `gpus` GPUs for `pcie_tree`: per socket, mid-level
    switches of one to four leaf switches, each leaf holding one to four GPUs (the worst shapes
    the report bounds allow are 128 GPUs on such trees, not the tidy ones real vendors build)."""
    rng = random.Random(seed)
    sizes = [gpus // sockets + (1 if s < gpus % sockets else 0) for s in range(sockets)]
    tree: list[list[list[int]]] = []
    for size in sizes:
        mids: list[list[int]] = []
        left = size
        while left:
            mid: list[int] = []
            for _ in range(rng.randint(1, 4)):
                if not left:
                    break
                take = min(left, rng.randint(1, 4))
                mid.append(take)
                left -= take
            mids.append(mid)
        tree.append(mids)
    return tree


def measured_with_noise(topo: NodeTopology, *, seed: int, measured_at: float = 0.0) -> NodeTopology:
    """`topo` with every GPU pair measured within 10 % of nominal (deterministic per `seed`):
    noise makes every bandwidth distinct, so the matrix is no tree and no two GPUs are twins
    (the in-node search's worst case). The measurements count while fresh: at `measured_at` 0
    only where no clock is given (`now=None`), not at a real clock such as an aggregator's."""
    rng = random.Random(seed)
    links = tuple(
        dataclasses.replace(
            lk,
            measured=Measurement(
                gbps=lk.nominal_gbps * rng.uniform(0.9, 1.1),
                method="test",
                measured_at=measured_at,
            ),
        )
        if lk.a.kind is DeviceKind.GPU and lk.b.kind is DeviceKind.GPU
        else lk
        for lk in topo.links
    )
    return dataclasses.replace(topo, links=links)


def pcie_tree(
    name: str,
    *,
    sockets: Sequence[Sequence[Sequence[int]]],
    tiers: tuple[str, ...] = (),
    nvlink_rings: Sequence[Sequence[int]] = (),
) -> NodeTopology:
    """A PCIe server from its tree: `sockets[s][m][l]` is how many GPUs hang under leaf switch
    `l` of mid-level switch `m` of socket `s` (`PIX` inside a leaf, `PXB` inside a mid switch,
    `NODE` inside a socket, `SYS` across). Each mid switch carries one RoCE NIC, `PIX` from the
    GPUs of a mid switch with a single leaf, else `PXB`. GPUs are numbered in tree order.

    Each group of `nvlink_rings` is an NVLink island whose GPUs are bridged in a ring (a pair by
    one bridge): islands of mixed sizes whose links are no tree, the hard case of a ring search.
    """
    bridged: set[tuple[int, int]] = set()
    for ring in nvlink_rings:
        for a, b in zip(ring, (*ring[1:], ring[0]), strict=True):
            if a != b:
                bridged.add((min(a, b), max(a, b)))
    where: list[tuple[int, int, int]] = []  # (socket, mid, leaf) per GPU
    for s, sock in enumerate(sockets):
        for m, mid in enumerate(sock):
            for leaf, count in enumerate(mid):
                where.extend([(s, m, leaf)] * count)
    gpus = len(where)
    if not 1 <= gpus <= MAX_TREE_GPUS:
        raise ValueError(f"a PCIe tree holds 1..{MAX_TREE_GPUS} GPUs, got {gpus}")
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            numa_node=where[i][0],
            pcie_generation=4,
            pcie_width=16,
        )
        for i in range(gpus)
    )
    links: list[Link] = []
    for a in range(gpus):
        for b in range(a + 1, gpus):
            if (a, b) in bridged:
                links.append(
                    Link(gpu(a), gpu(b), LinkKind.NVLINK, lanes=4, max_lanes=4, generation=4)
                )
            else:
                links.append(Link(gpu(a), gpu(b), _kind(where[a], where[b])))
    nic_list: list[Nic] = []
    for s, sock in enumerate(sockets):
        for m, mid in enumerate(sock):
            if not sum(mid):
                continue
            index = len(nic_list)
            nic_list.append(
                Nic(
                    index=index,
                    name=f"rdma{index}",
                    kind=NicKind.ROCE,
                    speed_mbps=NIC_MBPS,
                    numa_node=s,
                )
            )
            near = LinkKind.PIX if len(mid) == 1 else LinkKind.PXB
            for g in range(gpus):
                gs, gm, _ = where[g]
                if (gs, gm) == (s, m):
                    kind = near
                elif gs == s:
                    kind = LinkKind.NODE
                else:
                    kind = LinkKind.SYS
                links.append(Link(gpu(g), nic(index), kind))
    return with_nominal_bandwidth(
        NodeTopology(
            name=name,
            gpus=gpu_list,
            nics=tuple(nic_list),
            links=tuple(links),
            fabric=FabricPosition(tiers=tiers),
        )
    )


def _kind(a: tuple[int, int, int], b: tuple[int, int, int]) -> LinkKind:
    if a[0] != b[0]:
        return LinkKind.SYS
    if a[1] != b[1]:
        return LinkKind.NODE
    return LinkKind.PIX if a[2] == b[2] else LinkKind.PXB
