"""Synthetic clusters and job mixes for benchmarks and tests: real machines, a realistic fabric
and job sizes from public traces.

Clusters (`LAYOUTS`), built from the recorded machine profiles (`gputopo.machines`):

- `dgx-h100`: DGX H100 nodes (8 GPUs, 8 x 400 Gb/s NICs), 32 nodes per leaf (a DGX SuperPOD
  scalable unit), 4 leaves per spine, one core;
- `nvl72`: GB200 trays (4 GPUs) in NVL72 racks of 18 trays, each rack one multi-node NVLink
  domain, 8 racks per leaf, 4 leaves per spine;
- `mixed`: leaves of DGX H100, HGX A100 with RoCE NICs and PCIe H100 servers with NVLink-bridged
  pairs (2:1:1), 32 nodes per leaf, 4 leaves per spine.

Nodes of one profile are clones of one template with their own name and fabric position (GPU
UUIDs are the template's: nothing here reads them), so a 100k-GPU cluster builds in seconds.

Job mix (`data/job_mix.csv`, counted from the traces named in its header): single-node pods of
Alibaba's openb trace (mostly one GPU) and LLM gangs of Acme's Kalos trace (up to 128 nodes x 8
GPUs). `sample_job` draws a job whose GPUs come from Kalos gangs with probability `GANG_SHARE`
of the GPUs and from openb pods otherwise; on 4-GPU trays an 8-GPU pod becomes two 4-GPU pods.

`Occupancy` fills a snapshot to a fraction with such jobs the way a count-only scheduler with
bin packing does (a pod goes to a node with the fewest free GPUs that still hold it, ties at
random, lowest free GPU indices first as the device plugin picks; a gang to nodes with room in
one random leaf when one has enough), and can churn it (release one job, start another) to give
every benchmark sample its own, realistically fragmented state.
"""

from __future__ import annotations

import copy
import csv
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.machines import load_machine, with_gpu_fabric
from gputopo.request import PlacementRequest, Scope, request_from_mapping
from gputopo.topology import FabricPosition, NodeTopology

__all__ = [
    "GANG_SHARE",
    "LAYOUTS",
    "SHAPES",
    "Job",
    "Layout",
    "Occupancy",
    "build_nodes",
    "empty_snapshot",
    "job_mix",
    "sample_job",
    "shape_request",
]

# The request shapes `gputopo bench placement` times (`--shapes`) and `shape_request` builds.
SHAPES = ("tp8", "gang64", "gang512", "pd")

# Share of the occupied GPUs that belong to multi-node LLM gangs (Kalos) rather than to
# single-node pods (openb), when filling a cluster.
GANG_SHARE = 0.7


@dataclass(frozen=True, slots=True)
class Layout:
    """How a synthetic cluster is built."""

    name: str
    profiles: tuple[str, ...]  # profile per leaf, cycled
    nodes_per_leaf: int
    leaves_per_spine: int
    rack: int = 0  # nodes per multi-node NVLink domain (0: none)


LAYOUTS: dict[str, Layout] = {
    "dgx-h100": Layout("dgx-h100", ("dgx-h100",), 32, 4),
    "nvl72": Layout("nvl72", ("gb200-tray",), 144, 4, rack=18),
    "mixed": Layout(
        "mixed", ("dgx-h100", "dgx-h100", "hgx-a100-roce", "pcie-h100-nvlbridge-8x"), 32, 4
    ),
}


def _clone(template: NodeTopology, name: str, fabric: FabricPosition) -> NodeTopology:
    """The template as another node: same devices and links, own name and fabric position."""
    node = copy.copy(template)
    object.__setattr__(node, "name", name)
    object.__setattr__(node, "fabric", fabric)
    return node


def build_nodes(layout: Layout | str, gpus: int) -> list[NodeTopology]:
    """Nodes of a layout holding at least `gpus` GPUs (whole racks for NVL72)."""
    lay = LAYOUTS[layout] if isinstance(layout, str) else layout
    nodes: list[NodeTopology] = []
    total = 0
    leaf = 0
    while total < gpus:
        profile = lay.profiles[leaf % len(lay.profiles)]
        template = load_machine(profile, node_name=f"{profile}-template")
        spine = leaf // lay.leaves_per_spine
        tiers = (f"leaf-{leaf:04}", f"spine-{spine:03}", "core")
        for i in range(lay.nodes_per_leaf):
            if total >= gpus and (not lay.rack or i % lay.rack == 0):
                break
            name = f"{lay.name}-{leaf:04}-{i:03}"
            domain = ""
            node_template = template
            if lay.rack:
                domain = f"nvl72-{leaf:04}-{i // lay.rack:02}"
                node_template = _rack_template(profile, domain)
            nodes.append(
                _clone(
                    node_template,
                    name,
                    FabricPosition(
                        tiers=tiers,
                        accelerator_domain=domain,
                        source="inventory",
                        confidence="high",
                    ),
                )
            )
            total += template.gpu_count
        leaf += 1
    return nodes


@cache
def _rack_template(profile: str, domain: str) -> NodeTopology:
    return with_gpu_fabric(
        load_machine(profile, node_name=f"{profile}-template"), cluster_uuid=domain, clique_id=0
    )


def empty_snapshot(nodes: Sequence[NodeTopology]) -> ClusterSnapshot:
    """Every GPU free."""
    return ClusterSnapshot(NodeState(t, frozenset(range(t.gpu_count))) for t in nodes)


@dataclass(frozen=True, slots=True)
class Job:
    """A job to place: pods of GPUs (one pod per node for gangs)."""

    source: str
    pods: int
    gpus_per_pod: int

    @property
    def gpus(self) -> int:
        """GPUs of the job."""
        return self.pods * self.gpus_per_pod


@cache
def job_mix() -> tuple[tuple[str, int, int, int], ...]:
    """(source, nodes, GPUs per node, jobs) rows of `data/job_mix.csv`."""
    text = resources.files(__package__).joinpath("data", "job_mix.csv").read_text("utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return tuple(
        (r["source"], int(r["nodes"]), int(r["gpus_per_node"]), int(r["jobs"])) for r in rows
    )


def sample_job(rng: random.Random, *, node_gpus: int) -> Job:
    """One job of the mix (see the module docstring), shaped for nodes of `node_gpus` GPUs."""
    source = "kalos" if rng.random() < _job_share_of_gangs() else "openb"
    rows = [r for r in job_mix() if r[0] == source]
    _, nodes, per_node, _ = rng.choices(rows, weights=[r[3] for r in rows])[0]
    if per_node > node_gpus:
        split = per_node // node_gpus
        return Job(source, nodes * split, node_gpus)
    return Job(source, nodes, per_node)


@cache
def _job_share_of_gangs() -> float:
    """Probability of drawing a Kalos job so that Kalos holds GANG_SHARE of the GPUs."""
    mean = {}
    for source in ("kalos", "openb"):
        rows = [r for r in job_mix() if r[0] == source]
        jobs = sum(r[3] for r in rows)
        mean[source] = sum(r[1] * r[2] * r[3] for r in rows) / jobs
    # p * mean_k / (p * mean_k + (1 - p) * mean_o) = GANG_SHARE
    g, k, o = GANG_SHARE, mean["kalos"], mean["openb"]
    return g * o / (k * (1 - g) + g * o)


class Occupancy:
    """A snapshot with running jobs, filled and churned the way a count-only scheduler does."""

    def __init__(self, snapshot: ClusterSnapshot, *, seed: int = 0) -> None:
        self.snapshot = snapshot
        self.rng = random.Random(seed)
        self.jobs: list[dict[str, frozenset[int]]] = []
        self._names = sorted(snapshot.nodes)
        self._leaves: dict[str, list[str]] = {}
        self._leaf_of = [snapshot.domain_of(name, Scope.LEAF) or "" for name in self._names]
        for name, leaf in zip(self._names, self._leaf_of, strict=True):
            self._leaves.setdefault(leaf, []).append(name)
        self._node_gpus = max((s.topology.gpu_count for s in snapshot.nodes.values()), default=8)
        self._at = {name: i for i, name in enumerate(self._names)}
        # During `fill`: free GPUs per node, in the order of `_names` (the sampler's hot loop
        # reads these instead of the free sets)
        self._rooms: list[int] | None = None
        # During `fill`: per leaf and in the whole cluster, how many nodes have each free count,
        # so that a gang skips a leaf without looking at its nodes
        self._counts: dict[str, list[int]] = {}
        self._all_counts: list[int] = []

    def fill(self, fraction: float) -> ClusterSnapshot:
        """Start jobs of the mix until `fraction` of the GPUs are busy (jobs that do not fit
        are skipped, as a queue would hold them); the snapshot comes back indexed."""
        total = self.snapshot.total_gpus
        free = {n: set(s.free) for n, s in self.snapshot.nodes.items()}
        busy = total - sum(len(f) for f in free.values())
        self._count_rooms(free)
        misses = 0
        while busy < fraction * total and misses < 200:
            job = sample_job(self.rng, node_gpus=self._node_gpus)
            if busy + job.gpus > fraction * total * 1.02:
                misses += 1
                continue
            taken = self._start(job, free)
            if taken is None:
                misses += 1
                continue
            busy += job.gpus
        self._rooms = None
        self._counts, self._all_counts = {}, []
        # Indexed now, as a live aggregator's snapshot is after its first decision, so that
        # churned snapshots derive their indexes instead of building them.
        self.snapshot = self.snapshot.with_free(
            {n: frozenset(g) for n, g in free.items()}
        ).indexed()
        return self.snapshot

    def churn(self) -> ClusterSnapshot:
        """Release one random job and start one new one; returns the new snapshot."""
        free: dict[str, set[int]] = {}
        if self.jobs:
            gone = self.jobs.pop(self.rng.randrange(len(self.jobs)))
            for n, g in gone.items():
                free.setdefault(n, set(self.snapshot.node(n).free)).update(g)
        view = _Overlay(self.snapshot, free)
        for _ in range(20):
            if self._start(sample_job(self.rng, node_gpus=self._node_gpus), view) is not None:
                break
        self.snapshot = self.snapshot.with_free({n: frozenset(g) for n, g in view.changed.items()})
        return self.snapshot

    def _start(
        self, job: Job, free: dict[str, set[int]] | _Overlay
    ) -> dict[str, frozenset[int]] | None:
        per = job.gpus_per_pod
        if job.pods == 1:
            node = self._random_node(free, per)
            if node is None:
                return None
            taken = {node: frozenset(sorted(free[node])[:per])}
        else:
            chosen = self._gang_nodes(free, job.pods, per)
            if chosen is None:
                return None
            taken = {n: frozenset(sorted(free[n])[:per]) for n in chosen}
        for n, g in taken.items():
            free[n] = free[n] - g
            if self._rooms is not None:
                i = self._at[n]
                before = self._rooms[i]
                self._rooms[i] = after = before - len(g)
                for counts in (self._counts[self._leaf_of[i]], self._all_counts):
                    counts[before] -= 1
                    counts[after] += 1
        self.jobs.append(taken)
        return taken

    def _count_rooms(self, free: dict[str, set[int]]) -> None:
        """Start keeping `_rooms` and the per-leaf and cluster counts of free GPUs (during
        `fill`; `_start` keeps them up to date)."""
        self._rooms = [len(free[n]) for n in self._names]
        most = max(self._rooms, default=0)
        self._counts = {leaf: [0] * (most + 1) for leaf in self._leaves}
        self._all_counts = [0] * (most + 1)
        for i, room in enumerate(self._rooms):
            self._counts[self._leaf_of[i]][room] += 1
            self._all_counts[room] += 1

    def _gang_nodes(
        self, free: dict[str, set[int]] | _Overlay, pods: int, per: int
    ) -> list[str] | None:
        """The first `pods` nodes with `per` free GPUs in the first leaf (in random order) that
        has them, else in the whole cluster (by name); None when the cluster has too few."""
        leaves = list(self._leaves.items())
        self.rng.shuffle(leaves)
        counts = self._counts
        for leaf, names in leaves:
            if counts and sum(counts[leaf][per:]) < pods:
                continue  # the same answer as looking, without looking
            room = [n for n in names if len(free[n]) >= per]
            if len(room) >= pods:
                return room[:pods]
        if counts and sum(self._all_counts[per:]) < pods:
            return None
        room = list(itertools.islice((n for n in self._names if len(free[n]) >= per), pods))
        return room if len(room) >= pods else None

    def _random_node(self, free: dict[str, set[int]] | _Overlay, per: int) -> str | None:
        """A node with the fewest free GPUs that still holds `per` (best fit), ties at random:
        sampled, so a 100k-GPU cluster is not scanned per pod."""
        best: list[str] = []
        best_free = 1 << 30
        names = self._names
        count = len(names)
        bits = count.bit_length()
        draw = self.rng.getrandbits
        rooms = self._rooms
        for _ in range(256):
            # `rng.randrange(count)`, inlined (the fill's hot loop; `test_scenarios` holds the
            # two to the same draws)
            i = draw(bits)
            while i >= count:
                i = draw(bits)
            room = rooms[i] if rooms is not None else len(free[names[i]])
            if per <= room < best_free and self.snapshot.node(names[i]).placeable:
                best, best_free = [names[i]], room
            elif room == best_free:
                best.append(names[i])
            if best_free == per:
                break
        if best:
            return self.rng.choice(best)
        room_nodes = [n for n in self._names if len(free[n]) >= per]
        return self.rng.choice(room_nodes) if room_nodes else None


class _Overlay:
    """Free sets of a snapshot with a few nodes changed (the changes are kept apart)."""

    def __init__(self, snapshot: ClusterSnapshot, changed: dict[str, set[int]]) -> None:
        self._snapshot = snapshot
        self.changed = changed

    def __getitem__(self, name: str) -> set[int]:
        if name in self.changed:
            return self.changed[name]
        return set(self._snapshot.node(name).free)

    def __setitem__(self, name: str, value: set[int]) -> None:
        self.changed[name] = value


def shape_request(shape: str, per_pod: int) -> PlacementRequest:
    """The request of one of the benchmark's `SHAPES` for nodes of `per_pod` GPUs (a tray of
    four on NVL72-style nodes, a whole node of eight otherwise)."""
    tray = per_pod < 8
    data: dict[str, object]
    if shape == "tp8":
        pods, per = (2, 4) if tray else (1, 8)
        data = {
            "job": "tp8",
            "groups": [
                {"name": "tp", "pods": pods, "gpus_per_pod": per, "scope": {"required": "nvlink"}}
            ],
        }
    elif shape in ("gang64", "gang512"):
        gpus = 64 if shape == "gang64" else 512
        per = 4 if tray else 8
        data = {
            "job": shape,
            "scope": {"preferred": "leaf" if gpus == 64 else "spine"},
            "groups": [{"name": "train", "pods": gpus // per, "gpus_per_pod": per}],
        }
    elif shape == "pd":
        data = {
            "job": "pd",
            "groups": [
                {"name": "prefill", "replicas": 2, "gpus_per_pod": 4},
                {"name": "decode", "replicas": 2, "gpus_per_pod": 4},
            ],
            "edges": [
                {
                    "from": "prefill",
                    "to": "decode",
                    "transfer_bytes": 3_000_000_000,
                    "max_transfer_seconds": 0.01,
                    "pairing": "one_to_one",
                }
            ],
        }
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return request_from_mapping(data)
