"""Bandwidth between placed GPUs: inside a node along its links, between nodes over NVLink
domains or NICs. The cost model turns these figures into time.

Inside a node, a ring's bandwidth is the bottleneck link of the best ring through the chosen
GPUs (a bottleneck travelling-salesman problem, exact for the <= 16 GPUs of a node). Between
nodes, two GPUs talk over NVLink when both sit in one multi-node NVLink domain, else each over its
nearest NIC, whose line rate is shared by the GPUs of the same job that use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from gputopo import bandwidth
from gputopo.cluster import ClusterSnapshot
from gputopo.links import LinkKind
from gputopo.request import Scope
from gputopo.topology import NodeTopology, gpu
from gputopo.topology import nic as nic_ref

__all__ = [
    "best_ring",
    "best_ring_of_matrix",
    "gpu_nvlink_gbps",
    "nic_share_gbps",
    "pair_gbps",
    "pair_kind",
    "span_of",
]


def pair_gbps(topology: NodeTopology, a: int, b: int) -> float:
    """Bandwidth between two GPUs of one node (0 when nothing is known)."""
    link = topology.gpu_link(a, b)
    return link.bandwidth_gbps() if link is not None else 0.0


def pair_kind(topology: NodeTopology, a: int, b: int) -> LinkKind:
    """How two GPUs of one node are connected (SYS when unknown)."""
    link = topology.gpu_link(a, b)
    return link.kind if link is not None else LinkKind.SYS


def best_ring(topology: NodeTopology, gpus: Sequence[int]) -> tuple[tuple[int, ...], float]:
    """The ring through `gpus` whose slowest hop is fastest, and that hop's bandwidth.

    Returns the GPUs in ring order (starting at the smallest index) and the bottleneck GB/s.
    One GPU is a ring of infinite bandwidth (nothing to send); two GPUs share one link.
    """
    ordered = tuple(sorted(gpus))
    if len(ordered) <= 1:
        return ordered, float("inf")
    matrix = tuple(
        tuple(pair_gbps(topology, a, b) if a != b else 0.0 for b in ordered) for a in ordered
    )
    order, gbps = best_ring_of_matrix(matrix)
    return tuple(ordered[i] for i in order), gbps


@lru_cache(maxsize=65536)
def best_ring_of_matrix(matrix: tuple[tuple[float, ...], ...]) -> tuple[tuple[int, ...], float]:
    """Bottleneck Hamiltonian cycle by threshold search and a subset DP.

    1. Try the distinct bandwidths from the highest down as a threshold.
    2. For each, ask whether a Hamiltonian cycle exists using only links at or above it
       (Held-Karp reachability over subsets: O(2^n n^2), n <= 16).
    3. The first threshold that admits a cycle is the answer; rebuild the cycle from the DP.
    Equal bandwidth everywhere (an NVSwitch node) short-circuits to the identity order.
    """
    n = len(matrix)
    if n == 2:
        return (0, 1), matrix[0][1]
    values = sorted({matrix[i][j] for i in range(n) for j in range(n) if i != j}, reverse=True)
    if len(values) == 1:
        return tuple(range(n)), values[0]
    for threshold in values:
        cycle = _hamiltonian_cycle(matrix, threshold)
        if cycle is not None:
            return cycle, threshold
    return tuple(range(n)), 0.0


def _hamiltonian_cycle(
    matrix: tuple[tuple[float, ...], ...], threshold: float
) -> tuple[int, ...] | None:
    n = len(matrix)
    ok = [[matrix[i][j] >= threshold and i != j for j in range(n)] for i in range(n)]
    full = (1 << n) - 1
    # reach[mask] = bitset of end vertices v such that a path from 0 visiting `mask` ends at v
    reach = [0] * (1 << n)
    reach[1] = 1
    for mask in range(1, full + 1):
        ends = reach[mask]
        if not ends or not mask & 1:
            continue
        for v in range(n):
            if not ends >> v & 1:
                continue
            for w in range(n):
                if not mask >> w & 1 and ok[v][w]:
                    reach[mask | 1 << w] |= 1 << w
    last = next((v for v in range(1, n) if reach[full] >> v & 1 and ok[v][0]), None)
    if last is None:
        return None
    # Walk back: find a predecessor of `last` in mask without it, and so on.
    path = [last]
    mask, v = full, last
    while v != 0:
        prev_mask = mask & ~(1 << v)
        v = next(u for u in range(n) if reach[prev_mask] >> u & 1 and ok[u][v])
        mask = prev_mask
        path.append(v)
    path.reverse()
    return tuple(path[:-1]) if path[0] == path[-1] else tuple(path)


def gpu_nvlink_gbps(topology: NodeTopology, gpu_index: int) -> float:
    """A GPU's total NVLink bandwidth: what it reaches across a multi-node NVLink fabric."""
    g = topology.gpus[gpu_index]
    return bandwidth.nvlink_gbps(lanes=g.nvlink_lanes, generation=g.nvlink_generation or None)


def nic_share_gbps(topology: NodeTopology, gpus: Sequence[int]) -> dict[int, tuple[float, str]]:
    """Network bandwidth each GPU of a job's set gets, and through which NIC.

    Each GPU uses its nearest up NIC; when several are equally near, GPUs are dealt over them
    round robin (as NCCL spreads channels). GPUs of the set that end up on one NIC share its
    line rate equally. A GPU with no NIC gets 0.
    """
    use: dict[int, int] = {}
    load: dict[int, int] = {}
    for g in sorted(gpus):
        near = topology.nearest_nics(g)
        if not near:
            continue
        choice = min(near, key=lambda n: (load.get(n, 0), n))
        use[g] = choice
        load[choice] = load.get(choice, 0) + 1
    out: dict[int, tuple[float, str]] = {}
    for g in gpus:
        if g not in use:
            out[g] = (0.0, "no NIC")
            continue
        nic = topology.nics[use[g]]
        line = bandwidth.nic_gbps(nic.speed_mbps)
        link = topology.link(gpu(g), nic_ref(nic.index))
        path = link.bandwidth_gbps() if link is not None and link.bandwidth_gbps() > 0 else line
        out[g] = (min(line, path) / load[use[g]], nic.name)
    return out


def span_of(snapshot: ClusterSnapshot, nodes: Sequence[str]) -> Scope:
    """The narrowest scope that holds all the given nodes."""
    unique = sorted(set(nodes))
    if len(unique) <= 1:
        return Scope.NODE
    for scope in (Scope.NVLINK, Scope.LEAF, Scope.SPINE, Scope.CORE, Scope.ZONE):
        ids = {snapshot.domain_of(n, scope) for n in unique}
        if len(ids) == 1 and None not in ids and "" not in ids:
            return scope
    return Scope.CLUSTER
