"""The discrete-event replay: arrivals, a FIFO queue (optionally with backfill), gang placement
through `Engine`, completion after the job-time model's run time.

Phases at each event time, in this order (so every policy sees the same rules):

1. completions at or before now release their GPUs;
2. arrivals at or before now join the queue's tail; a job that no placement could hold even on
   the empty cluster is dropped and counted (it would block the queue forever);
3. scheduling: the head of the queue is placed if it can be; when it cannot, the queue waits
   (strict FIFO) or, with backfill, up to `backfill_window` later jobs that fit now start ahead
   of it (no reservation for the head: the simple backfill many batch schedulers default to).

A job that failed is retried only after some GPUs were released (its chances cannot improve
while the cluster only fills), which keeps a long queue cheap.

Arrive-all traces (every duration infinite: openb's multigpu50) follow FGD's protocol instead:
jobs are tried once, in order, and one that does not fit is skipped, never queued.

Occupancy figures are kept incrementally per event (O(nodes touched)): GPUs in use, fully free
nodes, fully free multi-node NVLink domains, and fragmentation as FGD defines it: for each node,
the expected free GPUs a task drawn from the trace's own task-size mix cannot use
(`sum over sizes m of P(m) * free_n * [free_n < m]`), summed over nodes.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gputopo.sim.engine import Engine
from gputopo.sim.jobtime import JobTimeModel
from gputopo.sim.traces import JobClass, SimJob

__all__ = ["JobRecord", "ReplayOptions", "ReplayResult", "Sample", "replay", "stderr_progress"]


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How the queue behaves."""

    backfill: bool = False
    backfill_window: int = 64


@dataclass(slots=True)
class JobRecord:
    """What happened to one job."""

    name: str
    job_class: JobClass
    gpus: int
    arrival: float
    start: float = math.nan
    finish: float = math.nan
    slowdown: float = math.nan
    nodes: int = 0
    leaves: int = 0
    tp_groups: int = 0
    tp_groups_across_nodes: int = 0
    kv_pairs: int = 0
    kv_across_pci_root: int = 0
    kv_across_node: int = 0
    kv_across_leaf: int = 0
    dropped: str = ""  # why the job never ran ("" when it ran)
    order: int = -1  # position in the start order

    @property
    def started(self) -> bool:
        """True once the job was placed."""
        return not math.isnan(self.start)


@dataclass(frozen=True, slots=True)
class Sample:
    """Cluster occupancy right after the events of one time."""

    time: float
    used_gpus: int
    free_nodes: int
    free_domains: int
    fragmentation: float
    queued: int


@dataclass
class ReplayResult:
    """Every job's record and the occupancy samples of one policy's replay."""

    policy: str
    records: list[JobRecord]
    samples: list[Sample]
    total_gpus: int
    total_nodes: int
    total_domains: int
    decisions: int
    wall_seconds: float
    arrive_all: bool = False
    allocation_at_full_demand: float = math.nan  # arrive-all: allocation once demand = capacity
    extra: dict[str, float] = field(default_factory=dict)


class _Occupancy:
    """Free GPUs per node and the running totals derived from them."""

    def __init__(self, engine: Engine, sizes: Counter[int]) -> None:
        snap = engine.snapshot
        self.free = {n: s.free_count for n, s in snap.nodes.items()}
        self.cap = {n: s.topology.gpu_count for n, s in snap.nodes.items()}
        self.domain_of: dict[str, str] = {}
        for node, state in snap.nodes.items():
            fabric = state.topology.fabric
            dom = fabric.accelerator_sub_domain or fabric.accelerator_domain
            if dom:
                self.domain_of[node] = dom
        self.domain_busy: Counter[str] = Counter()
        self.domains = len(set(self.domain_of.values()))
        total = sum(sizes.values()) or 1
        top = max(self.cap.values(), default=0)
        # frag[f]: expected unusable free GPUs of a node with f free (FGD, whole GPUs).
        self.frag_of = [
            f * sum(c for m, c in sizes.items() if m > f) / total for f in range(top + 1)
        ]
        self.used = sum(self.cap[n] - f for n, f in self.free.items())
        self.free_nodes = sum(1 for n, f in self.free.items() if f == self.cap[n])
        self.frag = sum(self.frag_of[f] for f in self.free.values())
        for node, f in self.free.items():
            if f < self.cap[node] and node in self.domain_of:
                self.domain_busy[self.domain_of[node]] += 1

    def change(self, node: str, delta: int) -> None:
        """`delta` GPUs freed (> 0) or taken (< 0) on a node."""
        before = self.free[node]
        after = before + delta
        cap = self.cap[node]
        self.free[node] = after
        self.used -= delta
        self.frag += self.frag_of[after] - self.frag_of[before]
        was_free, is_free = before == cap, after == cap
        if was_free != is_free:
            self.free_nodes += 1 if is_free else -1
            dom = self.domain_of.get(node)
            if dom is not None:
                self.domain_busy[dom] += -1 if is_free else 1
                if self.domain_busy[dom] == 0:
                    del self.domain_busy[dom]

    @property
    def free_domains(self) -> int:
        """Multi-node NVLink domains with every node fully free."""
        return self.domains - len(self.domain_busy)


def replay(
    jobs: Sequence[SimJob],
    engine: Engine,
    model: JobTimeModel,
    *,
    options: ReplayOptions = ReplayOptions(),
    progress: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Replay `jobs` (sorted by arrival) through `engine`; see the module docstring."""
    began = time.perf_counter()
    say = progress or (lambda _: None)
    records = [JobRecord(j.name, j.job_class, j.gpus, j.arrival) for j in jobs]
    sizes: Counter[int] = Counter()
    for job in jobs:
        for g in job.request.groups:
            sizes[g.gpus_per_pod] += g.replicas * g.pods
    occ = _Occupancy(engine, sizes)
    total_gpus = engine.snapshot.total_gpus
    arrive_all = bool(jobs) and all(math.isinf(j.duration) for j in jobs)
    samples: list[Sample] = []
    running: list[tuple[float, int, dict[str, frozenset[int]]]] = []
    queue: list[int] = []
    failed_at: dict[int, int] = {}  # job -> release count when it last failed
    releases = 0
    started = 0
    next_job = 0
    demand = 0
    at_full = math.nan
    extra: dict[str, float] = {}
    last_say = time.perf_counter()

    def start(i: int, now: float) -> bool:
        nonlocal started
        job = jobs[i]
        result = engine.place(job.request)
        if not result.placed:
            return False
        alloc = dict(result.allocation())
        for node, gpus in alloc.items():
            occ.change(node, -len(gpus))
        timing = model.evaluate(job, result.pods)
        rec = records[i]
        rec.start, rec.slowdown, rec.order = now, timing.slowdown, started
        rec.finish = now + timing.seconds
        rec.nodes = len(alloc)
        rec.leaves = len({engine.snapshot.node(n).topology.fabric.tiers[:1] for n in alloc})
        rec.tp_groups, rec.tp_groups_across_nodes = timing.tp_groups, timing.tp_groups_across_nodes
        rec.kv_pairs, rec.kv_across_pci_root = timing.kv_pairs, timing.kv_across_pci_root
        rec.kv_across_node, rec.kv_across_leaf = timing.kv_across_node, timing.kv_across_leaf
        started += 1
        if not math.isinf(rec.finish):
            heapq.heappush(running, (rec.finish, i, alloc))
        return True

    def attempt(i: int, now: float) -> bool:
        if failed_at.get(i) == releases or jobs[i].gpus > total_gpus - occ.used:
            return False
        if start(i, now):
            failed_at.pop(i, None)
            return True
        failed_at[i] = releases
        return False

    while next_job < len(jobs) or running or queue:
        t_arrive = jobs[next_job].arrival if next_job < len(jobs) else math.inf
        t_finish = running[0][0] if running else math.inf
        now = min(t_arrive, t_finish)
        if math.isinf(now):
            break  # queued jobs that nothing will ever make room for
        while running and running[0][0] <= now:
            _, i, alloc = heapq.heappop(running)
            engine.release(alloc)
            for node, gpus in alloc.items():
                occ.change(node, len(gpus))
            releases += 1
        while next_job < len(jobs) and jobs[next_job].arrival <= now:
            i = next_job
            next_job += 1
            demand += jobs[i].gpus
            if not engine.fits_empty(jobs[i].request):
                records[i].dropped = "never fits this cluster"
                continue
            if arrive_all:
                if jobs[i].gpus > total_gpus - occ.used or not start(i, now):
                    records[i].dropped = "did not fit when it arrived"
                if math.isnan(at_full) and demand >= total_gpus:
                    at_full = occ.used / total_gpus
                    extra["fragmentation_at_full_demand"] = occ.frag
                    extra["free_gpus_at_full_demand"] = float(total_gpus - occ.used)
            else:
                queue.append(i)
        if not arrive_all:
            while queue and attempt(queue[0], now):
                queue.pop(0)
            if queue and options.backfill:
                window = queue[1 : 1 + options.backfill_window]
                started_now = [i for i in window if attempt(i, now)]
                if started_now:
                    gone = set(started_now)
                    queue = [i for i in queue if i not in gone]
        samples.append(
            Sample(now, occ.used, occ.free_nodes, occ.free_domains, occ.frag, len(queue))
        )
        if time.perf_counter() - last_say > 5.0:
            last_say = time.perf_counter()
            say(
                f"{engine.policy_name}: t={now / 3600:.1f} h, {started}/{len(jobs)} started, "
                f"{len(queue)} queued, {len(running)} running"
            )
    for i in queue:
        records[i].dropped = "still queued when the trace ended"
    if arrive_all and math.isnan(at_full):
        # Demand never reached capacity: the end state is the closest to FGD's column.
        at_full = occ.used / total_gpus if total_gpus else math.nan
        extra["fragmentation_at_full_demand"] = occ.frag
        extra["free_gpus_at_full_demand"] = float(total_gpus - occ.used)
    return ReplayResult(
        policy=engine.policy_name,
        records=records,
        samples=samples,
        total_gpus=total_gpus,
        total_nodes=len(occ.cap),
        total_domains=occ.domains,
        decisions=engine.decisions,
        wall_seconds=time.perf_counter() - began,
        arrive_all=arrive_all,
        allocation_at_full_demand=at_full,
        extra=extra,
    )


def stderr_progress(line: str) -> None:
    """Progress lines on stderr (stdout carries the table or the JSON)."""
    print(line, file=sys.stderr, flush=True)
