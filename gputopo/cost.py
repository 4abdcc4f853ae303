"""The communication cost model: how long a collective or a transfer takes on given links.

Pure formulas, table-tested against their definitions and published measurements. Bandwidth in
GB/s per direction, sizes in bytes, latency in microseconds, results in seconds.

- Ring all-reduce of S bytes on n ranks: ``t = 2(n-1)/n * S/B + 2(n-1) * a`` with B the bottleneck
  bandwidth along the ring and a the per-hop latency. nccl-tests' bus bandwidth is
  ``busbw = algbw * 2(n-1)/n`` with ``algbw = S/t``, so for large S, busbw -> B.
- Hierarchical all-reduce over m nodes of g GPUs: reduce-scatter inside each node
  (``(g-1)/g * S/B_intra``), all-reduce of each GPU's S/g shard across nodes over its NIC
  (``2(m-1)/m * (S/g)/B_nic``), all-gather inside the node (same as reduce-scatter). This is
  what NCCL's tree/ring algorithms converge to on rail-optimised fabrics.
- All-to-all: every rank sends (n-1)/n of its S bytes; the slowest injection path bounds it.
  Across nodes the part of the traffic that leaves a node goes through its NICs.
- Pipeline: a stage hands S bytes to its neighbour: ``S/B + a``.
- Transfer (KV cache): ``bytes / B``.

Gangs whose nodes hold different numbers of GPUs (`NodeLoad`, `uneven_*`): each node's share of
the collective is bounded by its own egress, so every node is costed on its own GPU count and
figures and the slowest node sets the time. A node with g_i GPUs, each getting r_i GB/s of its
NICs (the slowest GPU's share), pushes 2(m-1)/m * S through g_i * r_i in an all-reduce, whatever
the largest node's g is; in an all-to-all its g_i GPUs each send (n - g_i)/n * S off the node.
Worked by hand (the table tests repeat it): a 12-GPU gang, 8 GPUs on node A and 4 on node B,
rings of 360 GB/s, 50 GB/s of NIC per GPU, S = 1 GB, no latency:

- all-reduce: inside, 2 * 7/8 * 1 GB / 360 GB/s = 4.861 ms on A (4.167 ms on B); across,
  2 * 1/2 * (1/8 GB) / 50 GB/s = 2.5 ms on A and 2 * 1/2 * (1/4 GB) / 50 = 5.0 ms on B; total
  4.861 + 5.0 = 9.861 ms (a model using A's g = 8 for both said 7.361 ms, below B's own floor
  of 2(m-1)/m * S / (4 * 50 GB/s) = 5.0 ms of network time);
- all-to-all: B's GPUs each send 8/12 GB off the node at 50 GB/s: 13.33 ms (A's: 6.67 ms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "TIME_BUCKET_RATIO",
    "NodeLoad",
    "algbw_gbps",
    "allreduce_busbw_gbps",
    "alltoall_seconds",
    "egress_floor_seconds",
    "hierarchical_allreduce_seconds",
    "pipeline_seconds",
    "ring_allreduce_seconds",
    "time_bucket",
    "transfer_seconds",
    "uneven_allreduce_seconds",
    "uneven_alltoall_seconds",
]

# Predicted times within 5 % of each other count as equal: the model is not more precise than
# that, and ties are then broken by what keeps the cluster less fragmented.
TIME_BUCKET_RATIO = 1.05

_GB = 1e9
_US = 1e-6


def ring_allreduce_seconds(
    *, size_bytes: int, ranks: int, bus_gbps: float, hop_latency_us: float = 0.0
) -> float:
    """Time of a ring all-reduce; 0 for one rank, infinite when the ring has no bandwidth."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    if bus_gbps <= 0:
        return math.inf
    n = ranks
    return 2 * (n - 1) / n * size_bytes / (bus_gbps * _GB) + 2 * (n - 1) * hop_latency_us * _US


def hierarchical_allreduce_seconds(
    *,
    size_bytes: int,
    gpus_per_node: int,
    nodes: int,
    intra_gbps: float,
    inter_gbps_per_gpu: float,
    intra_latency_us: float = 0.0,
    inter_latency_us: float = 0.0,
) -> float:
    """Time of a reduce-scatter / inter-node all-reduce / all-gather all-reduce.

    `inter_gbps_per_gpu` is the network bandwidth one GPU gets for its shard (its NIC's rate
    divided among the GPUs that share that NIC, and capped by the fabric between the nodes).
    With one node this is the intra-node ring; with one GPU per node, the inter-node ring.
    """
    if nodes <= 1:
        return ring_allreduce_seconds(
            size_bytes=size_bytes,
            ranks=gpus_per_node,
            bus_gbps=intra_gbps,
            hop_latency_us=intra_latency_us,
        )
    if size_bytes <= 0:
        return 0.0
    if inter_gbps_per_gpu <= 0 or (gpus_per_node > 1 and intra_gbps <= 0):
        return math.inf
    g, m = max(gpus_per_node, 1), nodes
    intra = 0.0
    if g > 1:
        # reduce-scatter + all-gather inside the node
        intra = 2 * (
            (g - 1) / g * size_bytes / (intra_gbps * _GB) + (g - 1) * intra_latency_us * _US
        )
    shard = size_bytes / g
    inter = (
        2 * (m - 1) / m * shard / (inter_gbps_per_gpu * _GB) + 2 * (m - 1) * inter_latency_us * _US
    )
    return intra + inter


def alltoall_seconds(
    *,
    size_bytes: int,
    ranks: int,
    gpus_per_node: int,
    intra_gbps: float,
    inter_gbps_per_gpu: float,
    intra_latency_us: float = 0.0,
    inter_latency_us: float = 0.0,
    shared: bool = False,
) -> float:
    """Time of an all-to-all where every rank holds `size_bytes` to scatter over all ranks.

    Inside a node the share for local peers goes over the intra-node links; the share for remote
    peers leaves through the NIC. Both run at once, so the slower of the two bounds the step.
    With `shared` (the nodes are one multi-node NVLink domain) local and remote traffic leave
    the GPU through the same NVLink ports, so they add up on the slower of the two rates.
    """
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    g = max(1, min(gpus_per_node, ranks))
    local = (g - 1) / ranks * size_bytes
    remote = (ranks - g) / ranks * size_bytes
    if shared:
        rate = min(intra_gbps, inter_gbps_per_gpu) if remote else intra_gbps
        if rate <= 0:
            return math.inf
        hops = intra_latency_us * (g - 1) + inter_latency_us * (ranks - g)
        return (local + remote) / (rate * _GB) + hops * _US
    t_local = local / (intra_gbps * _GB) if local else 0.0
    if local and intra_gbps <= 0:
        return math.inf
    t_remote = 0.0
    if remote:
        if inter_gbps_per_gpu <= 0:
            return math.inf
        t_remote = remote / (inter_gbps_per_gpu * _GB) + inter_latency_us * _US * (ranks - g)
    return max(t_local + intra_latency_us * _US * (g - 1), t_remote)


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's part of a multi-node collective: `gpus` ranks on it, the bottleneck of the
    best ring through them (`intra_gbps`, inf for one GPU), the network rate each of them gets
    (`net_gbps_per_gpu`, the slowest GPU's share of its NIC or multi-node NVLink), and how many
    nodes look exactly like this one (`count`)."""

    gpus: int
    intra_gbps: float
    net_gbps_per_gpu: float
    count: int = 1


def _nodes(loads: Sequence[NodeLoad]) -> int:
    return sum(x.count for x in loads if x.gpus > 0)


def uneven_allreduce_seconds(
    *,
    size_bytes: int,
    loads: Sequence[NodeLoad],
    intra_latency_us: float = 0.0,
    inter_latency_us: float = 0.0,
) -> float:
    """Hierarchical all-reduce over nodes of different sizes (see the module docstring).

    Reduce-scatter and all-gather inside every node at once (the slowest node counts), then
    the inter-node all-reduce in which each node pushes 2(m-1)/m of the message through its own
    GPUs' network shares (the slowest node counts). With identical nodes this is exactly
    `hierarchical_allreduce_seconds`.
    """
    loads = [x for x in loads if x.gpus > 0]
    m = _nodes(loads)
    if m <= 1:
        only = loads[0] if loads else NodeLoad(0, math.inf, 0.0)
        return ring_allreduce_seconds(
            size_bytes=size_bytes,
            ranks=only.gpus,
            bus_gbps=only.intra_gbps,
            hop_latency_us=intra_latency_us,
        )
    if size_bytes <= 0:
        return 0.0
    intra = inter = 0.0
    for x in loads:
        g = x.gpus
        if g > 1:
            if x.intra_gbps <= 0:
                return math.inf
            intra = max(
                intra,
                2
                * (
                    (g - 1) / g * size_bytes / (x.intra_gbps * _GB)
                    + (g - 1) * intra_latency_us * _US
                ),
            )
        if x.net_gbps_per_gpu <= 0:
            return math.inf
        inter = max(inter, 2 * (m - 1) / m * size_bytes / g / (x.net_gbps_per_gpu * _GB))
    return intra + inter + 2 * (m - 1) * inter_latency_us * _US


def uneven_alltoall_seconds(
    *,
    size_bytes: int,
    loads: Sequence[NodeLoad],
    intra_latency_us: float = 0.0,
    inter_latency_us: float = 0.0,
    shared: bool = False,
) -> float:
    """All-to-all over nodes of different sizes: `alltoall_seconds` for every node with its own
    GPU count and figures (the ranks are all the nodes' GPUs), the slowest node counting."""
    loads = [x for x in loads if x.gpus > 0]
    ranks = sum(x.gpus * x.count for x in loads)
    worst = 0.0
    for x in loads:
        worst = max(
            worst,
            alltoall_seconds(
                size_bytes=size_bytes,
                ranks=ranks,
                gpus_per_node=x.gpus,
                intra_gbps=x.intra_gbps,
                inter_gbps_per_gpu=x.net_gbps_per_gpu,
                intra_latency_us=intra_latency_us,
                inter_latency_us=inter_latency_us,
                shared=shared,
            ),
        )
    return worst


def egress_floor_seconds(*, size_bytes: int, egress_gbps: Sequence[float]) -> float:
    """The least time any all-reduce over these nodes can take on the network: each node must
    push 2(m-1)/m of the message through its egress (`egress_gbps[i]`: the sum of its GPUs'
    network shares), so the slowest node's egress bounds it from below."""
    m = len(egress_gbps)
    if m <= 1 or size_bytes <= 0:
        return 0.0
    if min(egress_gbps) <= 0:
        return math.inf
    return max(2 * (m - 1) / m * size_bytes / (e * _GB) for e in egress_gbps)


def pipeline_seconds(
    *, size_bytes: int, neighbour_gbps: float, hop_latency_us: float = 0.0
) -> float:
    """Time for one stage to hand `size_bytes` to its neighbour."""
    if size_bytes <= 0:
        return 0.0
    if neighbour_gbps <= 0:
        return math.inf
    return size_bytes / (neighbour_gbps * _GB) + hop_latency_us * _US


def transfer_seconds(*, size_bytes: int, gbps: float) -> float:
    """Time to move `size_bytes` at `gbps`."""
    if size_bytes <= 0:
        return 0.0
    return math.inf if gbps <= 0 else size_bytes / (gbps * _GB)


def algbw_gbps(*, size_bytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: bytes over time."""
    return size_bytes / seconds / _GB if seconds > 0 else 0.0


def allreduce_busbw_gbps(*, size_bytes: int, ranks: int, seconds: float) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (0 for one rank)."""
    if ranks <= 1:
        return 0.0
    return algbw_gbps(size_bytes=size_bytes, seconds=seconds) * 2 * (ranks - 1) / ranks


def time_bucket(seconds: float) -> int:
    """A bucket index such that times within TIME_BUCKET_RATIO of each other mostly share one.

    Zero and negative times share the lowest bucket; infinite times the highest.
    """
    if seconds <= 0:
        return -(10**9)
    if math.isinf(seconds):
        return 10**9
    return math.floor(math.log(seconds) / math.log(TIME_BUCKET_RATIO))
