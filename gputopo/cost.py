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
"""

from __future__ import annotations

import math

__all__ = [
    "TIME_BUCKET_RATIO",
    "algbw_gbps",
    "allreduce_busbw_gbps",
    "alltoall_seconds",
    "hierarchical_allreduce_seconds",
    "pipeline_seconds",
    "ring_allreduce_seconds",
    "time_bucket",
    "transfer_seconds",
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
