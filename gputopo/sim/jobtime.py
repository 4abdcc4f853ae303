"""How long a job runs where it was placed: an independent model, not gputopo's cost model.

Why a second model: gputopo's policy chooses by `gputopo.cost`; grading its choices with the same
formulas would measure the model's agreement with itself. This module shares no code or figure
with it. It reads only facts of the placement (which GPUs on which nodes, the link kind nvidia-smi
would print between two GPUs, the NICs of a node, the leaf and NVLink domain of a node) and turns
them into time with `BANDWIDTH`, a table of *measured* NCCL bus bandwidths, each with its source.

The model, per job:

1. The trace gives the run time D on an ideal placement. A share s of it (`COMM_SHARE`, per job
   class, changeable with `gputopo simulate --comm-share CLASS=S`) is communication; the rest is
   compute and does not depend on placement.
2. Communication is split over the job's collectives: a training gang's tensor-parallel groups
   (consecutive ranks, `SimJob.tp`) carry `TP_SHARE` of it when TP > 1, its data-parallel
   all-reduce over the whole gang the rest; a serving graph's engines (TP inside each) carry half
   and the prefill-to-decode KV transfers the other half.
3. Each collective gets the bus bandwidth of its placement (`bus_gbps`) and of the best placement
   the cluster could give it (`ideal_gbps`); its time scales by ideal / placed.
4. Run time = D * ((1 - s) + s * slowdown), slowdown = the share-weighted mean of those ratios.

Bus bandwidth of a set of GPUs (`bus_gbps`):

- on one node: the figure of the slowest hop of the best ring through the GPUs, by link kind
  (NVSwitch, direct NVLink, PCIe switch, host bridge, across the CPU interconnect);
- inside one multi-node NVLink domain (GB200 NVL72): the MNNVL figure;
- otherwise hierarchical, as NCCL runs it: each part (a node, or the GPUs in one NVLink domain)
  reaches the network through one NIC per GPU at most, so the part gives rails x per-rail figure;
  the collective runs at the slowest part's min(intra-part, network) and never above the best
  network all-reduce measured; crossing leaves divides by the spine oversubscription (1.0, a
  non-blocking Clos, unless the CLI says otherwise).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gputopo.links import LinkKind
from gputopo.placement.result import PodPlacement
from gputopo.sim.traces import JobClass, SimJob
from gputopo.topology import NodeTopology

__all__ = [
    "BANDWIDTH",
    "COMM_SHARE",
    "TP_SHARE",
    "Figure",
    "JobTime",
    "JobTimeModel",
]


@dataclass(frozen=True, slots=True)
class Figure:
    """A measured NCCL bus bandwidth (GB/s) and where it was measured."""

    gbps: float
    what: str
    source: str


# Every figure is a bus bandwidth (nccl-tests `busbw`, GB/s) at large messages, read from a public
# measurement; `source` names it so a reader can check it.
BANDWIDTH: Mapping[str, Figure] = MappingProxyType(
    {
        "nvswitch": Figure(
            370.0,
            "all-reduce, ring, 8x H100 SXM on NVSwitch in one node (NVLink SHARP gives ~480; "
            "the ring figure is what every placement of fewer GPUs gets too)",
            "NVIDIA/nccl-tests#212 (sjeaugey: ~370 GB/s effective NVLink busBw with "
            "NCCL_ALGO=RING, ~480 with NVLS on 8 GPUs)",
        ),
        "nvlink_direct": Figure(
            116.0,
            "all-reduce, 2 GPUs joined by a direct NVLink (H100 PCIe with NVLink bridge)",
            "NVIDIA/nccl#1161 (all_reduce_perf -g 2 on NVLink-bridged H100 PCIe: 116 GB/s busbw)",
        ),
        "pcie_switch": Figure(
            36.0,
            "all-reduce, 4 PCIe GPUs behind PCIe switches of one socket, P2P on",
            "NVIDIA/nccl-tests#74 (4x A40 on one EPYC socket with P2P: busbw a bit above 36.6)",
        ),
        "pcie_host": Figure(
            35.0,
            "all-reduce, 4 PCIe GPUs on one socket's host bridge",
            "NVIDIA/nccl#1639 (4x RTX 5090 on one socket: busbw 35 GB/s)",
        ),
        "cpu_interconnect": Figure(
            28.0,
            "all-reduce, 8 PCIe GPUs across the two sockets' interconnect",
            "NVIDIA/nccl#1639 (8x RTX 5090 over 2 sockets: busbw 28 GB/s)",
        ),
        "mnnvl": Figure(
            835.0,
            "all-reduce, 72 GB200 GPUs of one NVL72 rack over multi-node NVLink",
            "coreweave/nccl-tests#43 (full NVL72 rack all_reduce_perf: 835-847 GB/s busbw at "
            "4-8 GiB)",
        ),
        "ib_ndr_rail": Figure(
            40.0,
            "all-reduce across nodes, per GPU-NIC rail, 400 Gb/s NDR (8x H100 + 8x 400G nodes "
            "reach 320 GB/s busbw on more than 2 nodes: 320 / 8 rails)",
            "NVIDIA/nccl#1221 (8x H100, 8x 400G, more than 2 nodes: busbw 320 GB/s)",
        ),
        "ib_hdr_rail": Figure(
            24.0,
            "all-reduce across nodes, per NIC, 200 Gb/s HDR (3 nodes of 8x A100 with 4 HDR NICs: "
            "peak ~96 GB/s busbw / 4)",
            "NVIDIA/nccl-tests#119 (3x 8x A100, 4x HDR 200G: average 84.8, peak ~96 GB/s)",
        ),
        "ib_edr_rail": Figure(
            12.2,
            "all-reduce across nodes, per NIC, 100 Gb/s (EDR)",
            "NVIDIA/nccl-tests#29 (sjeaugey: 12.2 GB/s for a 100 Gbps card is as good as it gets)",
        ),
        "mnnvl_ib_rail": Figure(
            49.0,
            "all-reduce across GB200 NVLink partitions on different racks over IB, per GPU of a "
            "partition (3 partitions of 8 GPUs: ring 394 GB/s / 8)",
            "NVIDIA/nccl#1801 (GB200, 3 NVL8 partitions on different racks, ring: 393.7 GB/s)",
        ),
        "network_cap": Figure(
            394.0,
            "the best network-crossing all-reduce busbw in these sources; no placement that "
            "leaves an NVLink domain is modelled faster",
            "NVIDIA/nccl#1801 (the same GB200 NVL8 x 3 ring run)",
        ),
    }
)

# Share of a job's run time (on an ideal placement) that is communication, per class. These are
# stated assumptions, not measurements (the README says so); `--comm-share` changes them.
COMM_SHARE: Mapping[JobClass, float] = MappingProxyType(
    {
        JobClass.POD: 0.10,
        JobClass.SMALL: 0.10,
        JobClass.FINETUNE: 0.20,
        JobClass.PRETRAIN: 0.30,
        JobClass.TRAIN: 0.30,
        JobClass.SERVE: 0.20,
    }
)
# Of a training gang's communication, the part its tensor-parallel groups carry (when TP > 1).
TP_SHARE = 0.6

_PAIR_FIGURE = {
    LinkKind.NVLINK: "nvlink_direct",
    LinkKind.C2C: "nvlink_direct",
    LinkKind.PIX: "pcie_switch",
    LinkKind.PXB: "pcie_switch",
    LinkKind.PHB: "pcie_host",
    LinkKind.NODE: "pcie_host",
    LinkKind.SYS: "cpu_interconnect",
}


def _gbps(key: str) -> float:
    return BANDWIDTH[key].gbps


@dataclass(frozen=True, slots=True)
class JobTime:
    """A job's modelled run time and what its placement did to it."""

    seconds: float
    slowdown: float  # communication time placed / ideal (1.0: as good as it gets)
    tp_groups: int = 0
    tp_groups_across_nodes: int = 0
    kv_pairs: int = 0
    kv_across_pci_root: int = 0
    kv_across_node: int = 0
    kv_across_leaf: int = 0


@dataclass
class JobTimeModel:
    """The model over one cluster's nodes (see the module docstring)."""

    nodes: Mapping[str, NodeTopology]
    comm_share: Mapping[JobClass, float] = field(default_factory=lambda: dict(COMM_SHARE))
    spine_oversubscription: float = 1.0
    _ideal: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False)
    # Intra-node figures per (machine, GPUs); clones of one template share their links tuple,
    # which the nodes mapping keeps alive, so its id is a stable key.
    _intra: dict[tuple[int, tuple[int, ...]], float] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        for job_class, share in self.comm_share.items():
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"comm share of {job_class}: {share} is not in [0, 1]")
        if self.spine_oversubscription < 1.0:
            raise ValueError("spine oversubscription must be at least 1.0")
        # Node shapes the ideal placement may use: one representative per distinct machine.
        reps: dict[int, NodeTopology] = {}
        for topo in self.nodes.values():
            reps.setdefault(id(topo.links), topo)
        self._reps = tuple(reps.values())
        self._domain_gpus: dict[str, int] = {}
        for topo in self.nodes.values():
            dom = topo.fabric.accelerator_sub_domain or topo.fabric.accelerator_domain
            if dom:
                self._domain_gpus[dom] = self._domain_gpus.get(dom, 0) + topo.gpu_count
        self._max_domain = max(self._domain_gpus.values(), default=0)
        self._max_node = max((t.gpu_count for t in self._reps), default=0)

    # --- bandwidth of a placement ---------------------------------------------------------

    def _domain(self, node: str) -> str:
        fabric = self.nodes[node].fabric
        return fabric.accelerator_sub_domain or fabric.accelerator_domain

    def _leaf(self, node: str) -> tuple[str, ...]:
        return self.nodes[node].fabric.tiers

    def intra_gbps(self, node: str, gpus: Sequence[int]) -> float:
        """Bus bandwidth of GPUs on one node (its best ring's slowest hop)."""
        topo = self.nodes[node]
        if self._domain(node):
            return _gbps("mnnvl")
        key = (id(topo.links), tuple(sorted(gpus)))
        found = self._intra.get(key)
        if found is None:
            found = self._intra[key] = _intra(topo, key[1])
        return found

    def _rail_gbps(self, node: str) -> float:
        if self._domain(node):
            return _gbps("mnnvl_ib_rail")
        speeds = [n.speed_mbps for n in self.nodes[node].nics if n.up]
        speed = max(speeds, default=0)
        if speed >= 400_000:
            return _gbps("ib_ndr_rail")
        if speed >= 200_000:
            return _gbps("ib_hdr_rail")
        # 100 Gb/s and below (or no RDMA NIC: the same 100 Gb/s class host network) scale by speed.
        return _gbps("ib_edr_rail") * max(speed, 100_000) / 100_000

    def _rails(self, node: str, gpus: int) -> int:
        nics = sum(1 for n in self.nodes[node].nics if n.up) or 1
        return min(gpus, nics) if not self._domain(node) else gpus

    def bus_gbps(self, placed: Mapping[str, Sequence[int]]) -> float:
        """Bus bandwidth of a collective over GPUs placed on nodes (see the module docstring)."""
        nodes = [n for n, g in placed.items() if g]
        if not nodes:
            return math.inf
        if len(nodes) == 1:
            return self.intra_gbps(nodes[0], placed[nodes[0]])
        domains = {self._domain(n) for n in nodes}
        if len(domains) == 1 and "" not in domains:
            return _gbps("mnnvl")
        # Parts: a multi-node NVLink domain's GPUs together, else a node's.
        parts: dict[str, list[str]] = {}
        for n in nodes:
            parts.setdefault(self._domain(n) or f"node/{n}", []).append(n)
        worst = _gbps("network_cap")
        for members in parts.values():
            count = sum(len(placed[n]) for n in members)
            if len(members) == 1:
                intra = self.intra_gbps(members[0], placed[members[0]]) if count > 1 else math.inf
            else:
                intra = _gbps("mnnvl")
            rails = sum(self._rails(n, len(placed[n])) for n in members)
            network = rails * min(self._rail_gbps(n) for n in members)
            worst = min(worst, intra, network)
        if len({self._leaf(n)[:1] for n in nodes}) > 1:
            worst /= self.spine_oversubscription
        return worst

    def ideal_gbps(self, gpus: int, kv: int = 0) -> float:
        """The best bus bandwidth any placement on this cluster gives `gpus` GPUs.

        `kv` > 0 asks for the best KV path between engines of `gpus` and `kv` GPUs instead.
        """
        key = (gpus, kv)
        if key not in self._ideal:
            self._ideal[key] = self._best(gpus, kv)
        return self._ideal[key]

    def _best(self, gpus: int, kv: int) -> float:
        total = gpus + kv if kv else gpus
        if total <= 1:
            return math.inf
        if self._max_domain and total <= self._max_domain:
            return _gbps("mnnvl")
        best_node = 0.0
        for topo in self._reps:
            if topo.gpu_count >= total:
                best_node = max(best_node, _intra(topo, tuple(range(total))))
        if best_node:
            return best_node
        # Whole nodes (or whole NVLink domains) joined by the network.
        part = self._max_domain or self._max_node
        if self._max_domain:
            intra, rail, rails = _gbps("mnnvl"), _gbps("mnnvl_ib_rail"), part
        else:
            topo = max(self._reps, key=lambda t: t.gpu_count)
            intra = _intra(topo, tuple(range(topo.gpu_count)))
            name = next(n for n, t in self.nodes.items() if t.links is topo.links)
            rail, rails = self._rail_gbps(name), self._rails(name, topo.gpu_count)
        if kv:
            rails = min(rails, gpus, kv)
        return min(intra, rails * rail, _gbps("network_cap"))

    # --- a job ----------------------------------------------------------------------------

    def evaluate(self, job: SimJob, pods: Sequence[PodPlacement]) -> JobTime:
        """The job's run time on this placement, and its TP and KV crossings."""
        share = self.comm_share.get(job.job_class, 0.0)
        if job.serving:
            ratio, kv = self._serving(pods)
            return JobTime(
                seconds=job.duration * ((1 - share) + share * ratio),
                slowdown=ratio,
                kv_pairs=kv[0],
                kv_across_pci_root=kv[1],
                kv_across_node=kv[2],
                kv_across_leaf=kv[3],
            )
        ranks: list[tuple[str, int]] = []
        for pod in sorted(pods, key=lambda p: (p.group, p.replica, p.rank)):
            ranks.extend((pod.node, g) for g in pod.gpus)
        n = len(ranks)
        dp_ratio = self._ratio(ranks, n)
        tp = max(1, min(job.tp, n))
        tp_groups = tp_cross = 0
        if tp > 1 and n > 1:
            worst = 1.0
            for start in range(0, n - tp + 1, tp):
                group = ranks[start : start + tp]
                tp_groups += 1
                if len({node for node, _ in group}) > 1:
                    tp_cross += 1
                worst = max(worst, self._ratio(group, tp))
            ratio = TP_SHARE * worst + (1 - TP_SHARE) * dp_ratio if n > tp else worst
        else:
            ratio = dp_ratio
        return JobTime(
            seconds=job.duration * ((1 - share) + share * ratio),
            slowdown=ratio,
            tp_groups=tp_groups,
            tp_groups_across_nodes=tp_cross,
        )

    def _ratio(self, ranks: Sequence[tuple[str, int]], n: int) -> float:
        if n <= 1:
            return 1.0
        placed: dict[str, list[int]] = {}
        for node, gpu in ranks:
            placed.setdefault(node, []).append(gpu)
        return max(1.0, self.ideal_gbps(n) / self.bus_gbps(placed))

    def _serving(self, pods: Sequence[PodPlacement]) -> tuple[float, tuple[int, int, int, int]]:
        """Slowdown of a prefill/decode graph and its KV pairs: (all, PCI root, node, leaf)."""
        engines: dict[tuple[str, int], dict[str, list[int]]] = {}
        for pod in pods:
            engines.setdefault((pod.group, pod.replica), {}).setdefault(pod.node, []).extend(
                pod.gpus
            )
        engine_ratio = 1.0
        for placed in engines.values():
            count = sum(len(g) for g in placed.values())
            if count > 1:
                engine_ratio = max(engine_ratio, self.ideal_gbps(count) / self.bus_gbps(placed))
        prefills = [(k, v) for k, v in engines.items() if k[0] == "prefill"]
        decodes = [(k, v) for k, v in engines.items() if k[0] == "decode"]
        kv_ratio = 1.0
        pairs = root = node_x = leaf_x = 0
        for _, p in prefills:
            for _, d in decodes:
                pairs += 1
                gbps, crossing = self._kv_path(p, d)
                root += crossing == "pci_root"
                node_x += crossing in ("node", "leaf")
                leaf_x += crossing == "leaf"
                p_n = sum(len(g) for g in p.values())
                d_n = sum(len(g) for g in d.values())
                kv_ratio = max(kv_ratio, self.ideal_gbps(p_n, d_n) / gbps)
        return 0.5 * engine_ratio + 0.5 * kv_ratio, (pairs, root, node_x, leaf_x)

    def _kv_path(
        self, prefill: Mapping[str, list[int]], decode: Mapping[str, list[int]]
    ) -> tuple[float, str]:
        """Bandwidth from a prefill engine to a decode engine and the widest boundary crossed."""
        (p_node, p_gpus), (d_node, d_gpus) = next(iter(prefill.items())), next(iter(decode.items()))
        if p_node == d_node:
            topo = self.nodes[p_node]
            if self._domain(p_node):
                return _gbps("mnnvl"), ""
            kinds = [_kind(topo, a, b) for a in p_gpus for b in d_gpus]
            worst = max(kinds)
            crossing = "pci_root" if worst >= LinkKind.PHB else ""
            return _pair_gbps(topo, worst), crossing
        if self._domain(p_node) and self._domain(p_node) == self._domain(d_node):
            crossing = "node"
            if self._leaf(p_node)[:1] != self._leaf(d_node)[:1]:
                crossing = "leaf"
            return _gbps("mnnvl"), crossing
        rails = min(self._rails(p_node, len(p_gpus)), self._rails(d_node, len(d_gpus)))
        gbps = min(
            rails * min(self._rail_gbps(p_node), self._rail_gbps(d_node)), _gbps("network_cap")
        )
        if self._leaf(p_node)[:1] != self._leaf(d_node)[:1]:
            return gbps / self.spine_oversubscription, "leaf"
        return gbps, "node"


def _kind(topo: NodeTopology, a: int, b: int) -> LinkKind:
    link = topo.gpu_link(a, b)
    return link.kind if link is not None else LinkKind.SYS


def _pair_gbps(topo: NodeTopology, kind: LinkKind) -> float:
    if kind is LinkKind.NVLINK and _switched(topo):
        return _gbps("nvswitch")
    return _gbps(_PAIR_FIGURE.get(kind, "cpu_interconnect"))


def _switched(topo: NodeTopology) -> bool:
    return any(lk.via_switch for lk in topo.gpu_links())


def _intra(topo: NodeTopology, gpus: tuple[int, ...]) -> float:
    """Bus bandwidth of GPUs on one node without a multi-node NVLink domain: its best ring.

    NCCL runs all-reduce on rings and searches for the best one, so a ring's slowest hop, not
    the worst pair, sets the figure (on a DGX-1 hybrid cube mesh four GPUs can ring over NVLink
    though two of them share no link). Sets of up to 8 GPUs try every ring; larger ones (not
    found on the machines here) fall back to the worst pair.
    """
    if len(gpus) <= 1:
        return math.inf
    if len(gpus) == 2:
        return _pair_gbps(topo, _kind(topo, *gpus))
    figure = {(a, b): _pair_gbps(topo, _kind(topo, a, b)) for a in gpus for b in gpus if a != b}
    if len(gpus) > 8:
        return min(figure.values())
    first, rest = gpus[0], gpus[1:]
    best = 0.0
    for order in itertools.permutations(rest):
        if order[0] > order[-1]:
            continue  # each ring once, not also backwards
        hops = (first, *order, first)
        best = max(best, min(figure[hops[k], hops[k + 1]] for k in range(len(hops) - 1)))
    return best
