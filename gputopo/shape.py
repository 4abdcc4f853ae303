"""The inside of a node as placement sees it: its GPU-to-GPU bandwidth matrix, link kinds, NUMA
nodes, nearest NICs and NVLink rates, as one interned value per distinct machine.

Thousands of nodes of one model share one `NodeShape` object (hashed by identity), so the intra-
node answers placement caches per (shape, free GPUs) are computed once per model, not per node.
Measured link bandwidth counts while fresh (`now`); degraded links count at what they carry and
down links at nothing, as `Link.bandwidth_gbps` says.

A shape is computed once per reported topology and then looked up (`node_shape`): a 128-GPU
report has about 11,000 links, and reading them costs milliseconds, which a Place must not pay
again for every new snapshot clock. The clock only matters through which measurements are still
fresh, so the lookup keeps one shape per set of fresh measurements.
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from gputopo import bandwidth
from gputopo.links import LinkHealth, LinkKind
from gputopo.topology import (
    DEFAULT_MEASUREMENT_MAX_AGE_S,
    DeviceKind,
    Gpu,
    Link,
    Nic,
    NodeTopology,
)

__all__ = ["NodeShape", "measurement_expiry", "node_shape"]


class NodeShape:
    """What placement needs to know about the inside of a node, shared by identical nodes.

    `bw[i][j]` is the GB/s GPU i and j reach (0 on the diagonal or when unknown), `kind[i][j]`
    their link kind, `nics[i]` the nearest up NICs of GPU i as (NIC index, GB/s that GPU reaches
    through it), `nvlink_gbps[i]` GPU i's total NVLink bandwidth (what it reaches across a
    multi-node NVLink fabric). Shapes are interned: equal signatures are one object, hashed by
    identity, so `(shape, free mask)` is a cheap dictionary key. `bw_array` and `kind_array` are
    `bw` and `kind` (as integers) in read-only numpy arrays, for the vectorised parts of the
    in-node search.
    """

    __slots__ = (
        "__weakref__",
        "bw",
        "bw_array",
        "gpu_count",
        "islands",
        "kind",
        "kind_array",
        "nic_names",
        "nics",
        "numa",
        "nvlink_gbps",
        "signature",
    )

    def __init__(
        self,
        signature: tuple[object, ...],
        *,
        bw_array: np.ndarray,
        kind_array: np.ndarray,
    ) -> None:
        n, bw, kind, numa, nics, nic_names, nvl = signature
        self.signature = signature
        self.gpu_count: int = n  # type: ignore[assignment]
        self.bw: tuple[tuple[float, ...], ...] = bw  # type: ignore[assignment]
        self.kind: tuple[tuple[LinkKind, ...], ...] = kind  # type: ignore[assignment]
        self.numa: tuple[int | None, ...] = numa  # type: ignore[assignment]
        self.nics: tuple[tuple[tuple[int, float], ...], ...] = nics  # type: ignore[assignment]
        self.nic_names: tuple[str, ...] = nic_names  # type: ignore[assignment]
        self.nvlink_gbps: tuple[float, ...] = nvl  # type: ignore[assignment]
        array = bw_array.copy()
        array.flags.writeable = False
        self.bw_array: np.ndarray = array
        kinds = kind_array.copy()
        kinds.flags.writeable = False
        self.kind_array: np.ndarray = kinds
        self.islands = self._islands()

    def _islands(self) -> tuple[frozenset[int], ...]:
        """The NVLink islands: GPUs joined by up NVLinks, directly or through others."""
        n = self.gpu_count
        nvlink = LinkKind.NVLINK
        label = list(range(n))
        for a, row in enumerate(self.kind):
            if row.count(nvlink) < 2:  # only the diagonal (a PCIe-only GPU): a scan in C
                continue
            for b in range(a + 1, n):
                if row[b] is nvlink and self.bw[a][b] > 0:
                    # union by smallest member: relabel one island into the other
                    la, lb = label[a], label[b]
                    if la != lb:
                        keep, drop = min(la, lb), max(la, lb)
                        label = [keep if x == drop else x for x in label]
        groups: dict[int, set[int]] = {}
        for g in range(n):
            groups.setdefault(label[g], set()).add(g)
        return tuple(sorted((frozenset(s) for s in groups.values()), key=min))

    @property
    def full_mask(self) -> int:
        """The mask with every GPU free."""
        return (1 << self.gpu_count) - 1

    def __repr__(self) -> str:
        return f"NodeShape({self.gpu_count} GPUs, id={id(self):#x})"


_SHAPES: weakref.WeakValueDictionary[tuple[object, ...], NodeShape] = weakref.WeakValueDictionary()


@dataclass(slots=True)
class _Seen:
    """The shapes of one reported topology, one per set of fresh measurements.

    Kept on the topology (`NodeTopology._shape_memo`), so clones of one machine (a simulated
    cluster, an inventory import: shallow copies sharing `gpus`, `nics` and `links`) read it
    once, and it goes when the last of them does. The entry holds the tuples it was computed
    from, so a copy whose devices were swapped afterwards is read afresh. `taken` are the
    measurement times (`measured_at`) of its links, ascending: at any clock the stale ones are
    a prefix of them, so the length of that prefix names the fresh set.
    """

    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    links: tuple[Link, ...]
    taken: tuple[float, ...]
    shapes: dict[int, NodeShape] = field(default_factory=dict)


def node_shape(topology: NodeTopology, *, now: float | None = None) -> NodeShape:
    """The interned shape of a node (see `NodeShape`); `now` ages out stale measurements."""
    gpus, nics, links = topology.gpus, topology.nics, topology.links
    memo = topology._shape_memo  # the field is this function's
    seen = memo.get("seen")
    if (
        not isinstance(seen, _Seen)
        or seen.gpus is not gpus
        or seen.nics is not nics
        or seen.links is not links
    ):
        taken = sorted(
            lk.measured.measured_at
            for lk in links
            if lk.measured is not None and lk.measured.gbps > 0
        )
        seen = memo["seen"] = _Seen(gpus, nics, links, tuple(taken))
    stale = _stale_count(seen.taken, now)
    found = seen.shapes.get(stale)
    if found is None:
        signature, bw, kinds = _signature(topology, now)
        found = _SHAPES.get(signature)
        if found is None:
            found = NodeShape(signature, bw_array=bw, kind_array=kinds)
            _SHAPES[signature] = found
        seen.shapes[stale] = found
    return found


def _stale_count(taken: Sequence[float], now: float | None) -> int:
    """How many of the measurement times `taken` (ascending) are stale at `now`, by the very
    test `Link.bandwidth_gbps` applies (`now - measured_at > max age`, monotone in the time)."""
    if now is None or not taken:
        return 0
    max_age = DEFAULT_MEASUREMENT_MAX_AGE_S
    return bisect.bisect_left(taken, True, key=lambda at: not now - at > max_age)


def _column(links: Sequence[Link], name: str, dtype: type) -> np.ndarray:
    """One field of every link as an array (the loop runs in C: `attrgetter` and `fromiter`)."""
    return np.fromiter(map(attrgetter(name), links), dtype=dtype, count=len(links))


def _signature(
    topology: NodeTopology, now: float | None
) -> tuple[tuple[object, ...], np.ndarray, np.ndarray]:
    """The shape's defining value (what `NodeShape` documents), its bandwidth and kind matrices.

    A 128-GPU node has about 11,000 links: their fields are read into arrays column by column
    and the GPU pairs written into the matrix in one assignment, about ten times faster than a
    Python loop over the links. Bandwidths are rounded to the MB/s (`_round3`), so that noise
    below it does not split a model into shapes."""
    n = topology.gpu_count
    links = topology.links
    gpu, nic = int(DeviceKind.GPU), int(DeviceKind.NIC)
    a_kind = _column(links, "a.kind", int)
    b_kind = _column(links, "b.kind", int)
    a_index = _column(links, "a.index", int)
    b_index = _column(links, "b.index", int)
    gbps_all = _bandwidths(links, now)
    kind_all = _column(links, "kind", int)
    pairs = np.flatnonzero((a_kind == gpu) & (b_kind == gpu) & (a_index < n) & (b_index < n))
    bw = np.zeros((n, n), dtype=np.float64)
    kind_of = np.full((n, n), int(LinkKind.SYS), dtype=np.int64)
    if len(pairs):
        gbps = _round3(gbps_all[pairs])
        kinds = kind_all[pairs]
        a, b = a_index[pairs], b_index[pairs]
        bw[a, b] = gbps
        bw[b, a] = gbps
        kind_of[a, b] = kinds
        kind_of[b, a] = kinds
    np.fill_diagonal(kind_of, int(LinkKind.NVLINK))
    members = {int(k): k for k in LinkKind}
    # GPU-NIC links: which GPU, which NIC (the other end), and only NICs that exist and are up
    gpu_end = np.where(a_kind == gpu, a_index, b_index)
    nic_end = np.where(a_kind == gpu, b_index, a_index)
    up = np.array([nic.up for nic in topology.nics] + [False], dtype=bool)
    known = (nic_end >= 0) & (nic_end < len(topology.nics))
    to_nic = np.flatnonzero(
        (((a_kind == gpu) & (b_kind == nic)) | ((b_kind == gpu) & (a_kind == nic)))
        & (gpu_end < n)
        & known
        & up[np.where(known, nic_end, len(topology.nics))]
    )
    signature = (
        n,
        tuple(map(tuple, bw.tolist())),
        tuple(tuple(map(members.__getitem__, row)) for row in kind_of.tolist()),
        tuple(g.numa_node for g in topology.gpus),
        _nearest_nics(
            topology,
            n,
            gpus=gpu_end[to_nic],
            nics=nic_end[to_nic],
            kinds=kind_all[to_nic],
            paths=gbps_all[to_nic],
        ),
        tuple(nic.name for nic in topology.nics),
        tuple(
            bandwidth.nvlink_gbps(lanes=g.nvlink_lanes, generation=g.nvlink_generation or None)
            if g.health is not LinkHealth.DOWN
            else 0.0
            for g in topology.gpus
        ),
    )
    return signature, bw, kind_of


def _bandwidths(links: Sequence[Link], now: float | None) -> np.ndarray:
    """`Link.bandwidth_gbps(now=now)` of every link, as an array (the same tests, vectorised:
    a fresh measurement above 0, else the nominal figure; nothing on a DOWN link)."""
    gbps = _column(links, "nominal_gbps", float)
    measured = [i for i, m in enumerate(map(attrgetter("measured"), links)) if m is not None]
    if measured:
        taken = [links[i].measured for i in measured]
        value = np.fromiter((m.gbps for m in taken if m is not None), float, len(taken))
        fresh = value > 0
        if now is not None:
            at = np.fromiter((m.measured_at for m in taken if m is not None), float, len(taken))
            fresh &= (now - at) <= DEFAULT_MEASUREMENT_MAX_AGE_S
        index = np.array(measured, dtype=np.intp)
        gbps[index[fresh]] = value[fresh]
    gbps[_column(links, "health", int) == int(LinkHealth.DOWN)] = 0.0
    return gbps


# Past this, x * 1000 may not be exact to well under 1e-6 and `_round3` asks Python.
_ROUND_EXACT_BELOW = float(2**40)


def _round3(values: np.ndarray) -> np.ndarray:
    """`round(x, 3)` of each value, bit for bit as Python rounds (the signature must not depend
    on how it was computed): rint(x * 1000) / 1000 is the double nearest the right decimal
    unless x * 1000 lies within rounding error of a half, and those (and huge or non-finite
    values) are rounded by Python."""
    scaled = values * 1000.0
    out = np.rint(scaled) / 1000.0
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, not near a half, and odd below
        near_half = np.abs(np.abs(scaled - np.trunc(scaled)) - 0.5) < 1e-6
    odd = near_half | ~(np.abs(scaled) < _ROUND_EXACT_BELOW)
    for i in np.flatnonzero(odd).tolist():
        out[i] = round(float(values[i]), 3)
    return out


def _nearest_nics(
    topology: NodeTopology,
    n: int,
    *,
    gpus: np.ndarray,
    nics: np.ndarray,
    kinds: np.ndarray,
    paths: np.ndarray,
) -> tuple[tuple[tuple[int, float], ...], ...]:
    """Each GPU's nearest up NICs (best link kind) as (NIC index, GB/s through it: the NIC's
    line rate, or the path's bandwidth when that is known and lower), from the GPU-NIC links
    to up NICs given column by column."""
    best = np.full(n + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, gpus, kinds)
    near = np.flatnonzero(kinds == best[gpus])
    near = near[np.lexsort((nics[near], gpus[near]))]
    out: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for g, idx, path in zip(
        gpus[near].tolist(), nics[near].tolist(), paths[near].tolist(), strict=True
    ):
        line = bandwidth.nic_gbps(topology.nics[idx].speed_mbps)
        out[g].append((idx, round(min(line, path) if path > 0 else line, 3)))
    return tuple(map(tuple, out))


def measurement_expiry(topology: NodeTopology, max_age_s: float) -> float:
    """When the first fresh measurement of a node goes stale (inf when none will)."""
    times = [
        lk.measured.measured_at + max_age_s
        for lk in topology.links
        if lk.measured is not None and lk.measured.gbps > 0
    ]
    return min(times, default=math.inf)
