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

from gputopo.links import LinkKind
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import FabricPosition, Gpu, Link, Nic, NicKind, NodeTopology, gpu, nic

__all__ = ["pcie_server", "switch_groups"]

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
    per_socket = gpus // 2
    mids = switch_groups(gpus)
    mid_of = {g: (s, i) for s, sock in enumerate(mids) for i, m in enumerate(sock) for g in m}
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            numa_node=i // per_socket,
            pcie_generation=4,
            pcie_width=16,
        )
        for i in range(gpus)
    )
    links: list[Link] = []
    for a in range(gpus):
        for b in range(a + 1, gpus):
            if a // 2 == b // 2:
                kind = LinkKind.PIX
            elif mid_of[a] == mid_of[b]:
                kind = LinkKind.PXB
            elif a // per_socket == b // per_socket:
                kind = LinkKind.NODE
            else:
                kind = LinkKind.SYS
            links.append(Link(gpu(a), gpu(b), kind))
    nic_list: list[Nic] = []
    for s, sock in enumerate(mids):
        for m in sock:
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
            near = LinkKind.PIX if len(m) <= 2 else LinkKind.PXB
            for g in range(gpus):
                if g in m:
                    kind = near
                elif g // per_socket == s:
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
