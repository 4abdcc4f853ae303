"""The inside of a node as placement sees it: its GPU-to-GPU bandwidth matrix, link kinds, NUMA
nodes, nearest NICs and NVLink rates, as one interned value per distinct machine.

Thousands of nodes of one model share one `NodeShape` object (hashed by identity), so the intra-
node answers placement caches per (shape, free GPUs) are computed once per model, not per node.
Measured link bandwidth counts while fresh (`now`); degraded links count at what they carry and
down links at nothing, as `Link.bandwidth_gbps` says.
"""

from __future__ import annotations

import math
import weakref

from gputopo import bandwidth
from gputopo.links import LinkHealth, LinkKind
from gputopo.topology import DeviceKind, Link, NodeTopology

__all__ = ["NodeShape", "measurement_expiry", "node_shape"]


class NodeShape:
    """What placement needs to know about the inside of a node, shared by identical nodes.

    `bw[i][j]` is the GB/s GPU i and j reach (0 on the diagonal or when unknown), `kind[i][j]`
    their link kind, `nics[i]` the nearest up NICs of GPU i as (NIC index, GB/s that GPU reaches
    through it), `nvlink_gbps[i]` GPU i's total NVLink bandwidth (what it reaches across a
    multi-node NVLink fabric). Shapes are interned: equal signatures are one object, hashed by
    identity, so `(shape, free mask)` is a cheap dictionary key.
    """

    __slots__ = (
        "__weakref__",
        "bw",
        "gpu_count",
        "islands",
        "kind",
        "nic_names",
        "nics",
        "numa",
        "nvlink_gbps",
        "signature",
    )

    def __init__(self, signature: tuple[object, ...]) -> None:
        n, bw, kind, numa, nics, nic_names, nvl = signature
        self.signature = signature
        self.gpu_count: int = n  # type: ignore[assignment]
        self.bw: tuple[tuple[float, ...], ...] = bw  # type: ignore[assignment]
        self.kind: tuple[tuple[LinkKind, ...], ...] = kind  # type: ignore[assignment]
        self.numa: tuple[int | None, ...] = numa  # type: ignore[assignment]
        self.nics: tuple[tuple[tuple[int, float], ...], ...] = nics  # type: ignore[assignment]
        self.nic_names: tuple[str, ...] = nic_names  # type: ignore[assignment]
        self.nvlink_gbps: tuple[float, ...] = nvl  # type: ignore[assignment]
        self.islands = self._islands()

    def _islands(self) -> tuple[frozenset[int], ...]:
        parent = list(range(self.gpu_count))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for a in range(self.gpu_count):
            for b in range(a + 1, self.gpu_count):
                if self.kind[a][b] is LinkKind.NVLINK and self.bw[a][b] > 0:
                    ra, rb = find(a), find(b)
                    if ra != rb:
                        parent[max(ra, rb)] = min(ra, rb)
        groups: dict[int, set[int]] = {}
        for g in range(self.gpu_count):
            groups.setdefault(find(g), set()).add(g)
        return tuple(sorted((frozenset(s) for s in groups.values()), key=min))

    @property
    def full_mask(self) -> int:
        """The mask with every GPU free."""
        return (1 << self.gpu_count) - 1

    def __repr__(self) -> str:
        return f"NodeShape({self.gpu_count} GPUs, id={id(self):#x})"


_SHAPES: weakref.WeakValueDictionary[tuple[object, ...], NodeShape] = weakref.WeakValueDictionary()


# Shapes of recently seen device tuples, by identity: nodes cloned from one machine (a
# simulated cluster, an inventory import) share their `gpus`, `nics` and `links` tuples, and
# the signature costs about half a millisecond a node (a minute at 1M GPUs). The entry holds
# the tuples it was computed from, so an id is never mistaken for a recycled one.
_BY_PARTS: dict[tuple[int, int, int, float | None], tuple[object, object, object, NodeShape]] = {}
_BY_PARTS_MAX = 256


def node_shape(topology: NodeTopology, *, now: float | None = None) -> NodeShape:
    """The interned shape of a node (see `NodeShape`); `now` ages out stale measurements."""
    gpus, nics, links = topology.gpus, topology.nics, topology.links
    key = (id(gpus), id(nics), id(links), now)
    seen = _BY_PARTS.get(key)
    if seen is not None and seen[0] is gpus and seen[1] is nics and seen[2] is links:
        return seen[3]
    signature = _signature(topology, now)
    found = _SHAPES.get(signature)
    if found is None:
        found = NodeShape(signature)
        _SHAPES[signature] = found
    if len(_BY_PARTS) >= _BY_PARTS_MAX:
        _BY_PARTS.clear()
    _BY_PARTS[key] = (gpus, nics, links, found)
    return found


def _link_gbps(link: Link, now: float | None) -> float:
    return round(link.bandwidth_gbps(now=now), 3)


def _signature(topology: NodeTopology, now: float | None) -> tuple[object, ...]:
    n = topology.gpu_count
    bw = [[0.0] * n for _ in range(n)]
    kind = [[LinkKind.SYS] * n for _ in range(n)]
    nic_links: list[list[Link]] = [[] for _ in range(n)]
    for link in topology.links:
        a, b = link.a, link.b
        if a.kind is DeviceKind.GPU and b.kind is DeviceKind.GPU:
            if a.index < n and b.index < n:
                gbps = _link_gbps(link, now)
                bw[a.index][b.index] = bw[b.index][a.index] = gbps
                kind[a.index][b.index] = kind[b.index][a.index] = link.kind
        elif a.kind is DeviceKind.GPU and b.kind is DeviceKind.NIC and a.index < n:
            nic_links[a.index].append(link)
        elif b.kind is DeviceKind.GPU and a.kind is DeviceKind.NIC and b.index < n:
            nic_links[b.index].append(link)
    for i in range(n):
        kind[i][i] = LinkKind.NVLINK
    nics: list[tuple[tuple[int, float], ...]] = []
    for g in range(n):
        up = []
        for link in nic_links[g]:
            ref = link.b if link.b.kind is DeviceKind.NIC else link.a
            if 0 <= ref.index < len(topology.nics) and topology.nics[ref.index].up:
                up.append((link.kind, ref.index, link))
        if not up:
            nics.append(())
            continue
        best = min(k for k, _, _ in up)
        near = []
        for k, idx, link in sorted(up, key=lambda t: (t[0], t[1])):
            if k != best:
                continue
            line = bandwidth.nic_gbps(topology.nics[idx].speed_mbps)
            path = link.bandwidth_gbps(now=now)
            near.append((idx, round(min(line, path) if path > 0 else line, 3)))
        nics.append(tuple(near))
    nvl = tuple(
        bandwidth.nvlink_gbps(lanes=g.nvlink_lanes, generation=g.nvlink_generation or None)
        if g.health is not LinkHealth.DOWN
        else 0.0
        for g in topology.gpus
    )
    return (
        n,
        tuple(tuple(r) for r in bw),
        tuple(tuple(r) for r in kind),
        tuple(g.numa_node for g in topology.gpus),
        tuple(nics),
        tuple(nic.name for nic in topology.nics),
        nvl,
    )


def measurement_expiry(topology: NodeTopology, max_age_s: float) -> float:
    """When the first fresh measurement of a node goes stale (inf when none will)."""
    times = [
        lk.measured.measured_at + max_age_s
        for lk in topology.links
        if lk.measured is not None and lk.measured.gbps > 0
    ]
    return min(times, default=math.inf)
