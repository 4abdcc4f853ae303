"""Jobs to replay: openb pod lists, Acme's Kalos jobs, and a seeded generator of LLM work.

Every job becomes a `SimJob`: an arrival time, the run time it had (or would have) on an ideal
placement, a job class (which sets its communication share in `gputopo.sim.jobtime`), and the
`PlacementRequest` every policy is asked to place. The requests carry no required scope: a
count-only scheduler would not be given one either, and a constraint would decide placement for
every policy alike.

Sources (see `tests/data/traces/README.md` for where each file comes from):

- openb (`name,...,num_gpu,gpu_milli,...,creation_time,deletion_time,scheduled_time`): one pod per
  job, arrival `creation_time`, run time `deletion_time - scheduled_time` (`- creation_time` for
  the pods that never ran). A fractional GPU (`gpu_milli` < 1000) is counted as a whole GPU: the
  placement engine hands out whole GPUs (the README says why FGD's shared-GPU figures therefore
  differ). CPU-only pods are left out. The multigpu50 list has no times: every pod arrives at 0
  and never leaves (FGD's "arrive until full").
- Kalos (`job_id,arrival_time,num_iteration,...,iteration_networking_time,gpu_workers,...`): a gang
  of `gpu_workers` pods of `gpu_per_worker` GPUs, run time `num_iteration * 0.5` s (how the
  converter made it), class `pretrain` where the converter wrote 0.75 s networking (its Pretrain
  jobs), `finetune` otherwise. Tensor parallelism is taken as the GPUs of one worker.
- `llm_mix`: training gangs (TP x PP x DP, pods of 1-8 GPUs, so a count-only scheduler may cut a
  TP group across nodes), small single-pod jobs, and prefill/decode serving graphs with a KV-cache
  edge; `LLM_MIX` states the size mix. Arrivals are Poisson at the rate that offers `load` times
  the cluster's GPUs, so scale is a parameter.

Pods larger than the cluster's nodes are split (an 8-GPU worker on 4-GPU GB200 trays becomes two
4-GPU pods), as such a job would be written for that cluster.
"""

from __future__ import annotations

import csv
import enum
import io
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gputopo.request import Edge, Group, Pattern, PlacementRequest

__all__ = [
    "LLM_MIX",
    "JobClass",
    "SimJob",
    "TraceSourceError",
    "kalos_jobs",
    "llm_mix",
    "merged",
    "openb_jobs",
    "read_trace",
]

# The message-size hint every gang carries: large enough that bandwidth decides (DESIGN.md).
_MESSAGE_BYTES = 256 * 1024 * 1024
# The KV-cache hint of a prefill -> decode edge: 1 GiB per transfer (one long-context batch), with
# a deadline loose enough (10 s) that any path meets it: the edge tells the policy what flows, and
# the job-time model, not a hard limit, grades the path.
_KV_BYTES = 1 << 30
_KV_DEADLINE_S = 10.0


class TraceSourceError(ValueError):
    """A trace that cannot be read; the message names the source, the row and the column."""


class JobClass(enum.StrEnum):
    """What a job does, which sets how much of its time is communication (`jobtime`)."""

    POD = "pod"  # openb: a single pod, mostly one GPU (inference, notebooks, small training)
    PRETRAIN = "pretrain"  # Kalos Pretrain jobs
    FINETUNE = "finetune"  # Kalos SFT and Other jobs
    TRAIN = "train"  # generated TP x PP x DP training gangs
    SMALL = "small"  # generated single-pod jobs
    SERVE = "serve"  # generated prefill/decode serving graphs


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a trace.

    `duration` is the run time on an ideal placement (math.inf: never leaves). `tp` is the
    tensor-parallel group size (consecutive ranks of the `train`-like group), 1 when none.
    """

    name: str
    arrival: float
    duration: float
    job_class: JobClass
    request: PlacementRequest
    tp: int = 1

    @property
    def gpus(self) -> int:
        """GPUs the job holds while it runs."""
        return self.request.total_gpus

    @property
    def serving(self) -> bool:
        """True for a prefill/decode graph (it has a KV edge)."""
        return bool(self.request.edges)


def _gang(name: str, pods: int, per_pod: int, node_gpus: int) -> Group:
    """A gang of `pods` x `per_pod` GPUs, split into pods that fit nodes of `node_gpus`."""
    if per_pod > node_gpus and per_pod % node_gpus == 0:
        pods, per_pod = pods * (per_pod // node_gpus), node_gpus
    pattern = Pattern.ALL_REDUCE if pods * per_pod > 1 else Pattern.NONE
    return Group(
        name, pods=pods, gpus_per_pod=per_pod, pattern=pattern, message_bytes=_MESSAGE_BYTES
    )


def _csv(text: str, source: str, want: Sequence[str]) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in want if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceSourceError(f"{source}: missing column(s) {', '.join(missing)}")
    return list(reader)


def _num(row: dict[str, str], column: str, source: str, line: int) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise TraceSourceError(f"{source}: row {line}: {column}: not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceSourceError(f"{source}: row {line}: {column}: must be a finite number >= 0")
    return value


def openb_jobs(text: str, *, node_gpus: int = 8, source: str = "openb") -> list[SimJob]:
    """openb pods as jobs (see the module docstring); arrive-all when the file has no times."""
    rows = _csv(text, source, ("name", "num_gpu"))
    timed = "creation_time" in (rows[0] if rows else {})
    jobs: list[SimJob] = []
    for i, row in enumerate(rows):
        line = i + 2
        gpus = int(_num(row, "num_gpu", source, line))
        if gpus == 0:
            continue
        if timed:
            arrival = _num(row, "creation_time", source, line)
            end = _num(row, "deletion_time", source, line)
            start = row.get("scheduled_time", "").strip()
            began = _num(row, "scheduled_time", source, line) if start else arrival
            duration = max(end - began, 1.0)
        else:
            arrival, duration = 0.0, math.inf
        request = PlacementRequest(groups=(_gang("pod", 1, gpus, node_gpus),), job=row["name"])
        jobs.append(SimJob(row["name"], arrival, duration, JobClass.POD, request, tp=gpus))
    return jobs


def kalos_jobs(text: str, *, node_gpus: int = 8, source: str = "kalos") -> list[SimJob]:
    """Kalos jobs as gangs (see the module docstring)."""
    want = ("job_id", "arrival_time", "num_iteration", "iteration_networking_time")
    rows = _csv(text, source, (*want, "gpu_workers", "gpu_per_worker"))
    jobs: list[SimJob] = []
    for i, row in enumerate(rows):
        line = i + 2
        workers = int(_num(row, "gpu_workers", source, line))
        per = int(_num(row, "gpu_per_worker", source, line))
        if workers < 1 or per < 1:
            raise TraceSourceError(f"{source}: row {line}: gpu_workers/gpu_per_worker: at least 1")
        name = f"kalos-{row['job_id']}"
        duration = max(_num(row, "num_iteration", source, line) * 0.5, 1.0)
        pretrain = _num(row, "iteration_networking_time", source, line) >= 0.5
        group = _gang("train", workers, per, node_gpus)
        jobs.append(
            SimJob(
                name,
                _num(row, "arrival_time", source, line),
                duration,
                JobClass.PRETRAIN if pretrain else JobClass.FINETUNE,
                PlacementRequest(groups=(group,), job=name),
                tp=min(per, 8),
            )
        )
    return jobs


# The generated mix: (share of jobs, class). Within a class, the sizes below, each (weight, value).
LLM_MIX: dict[str, object] = {
    "classes": ((0.55, JobClass.TRAIN), (0.30, JobClass.SMALL), (0.15, JobClass.SERVE)),
    # training gangs: total GPUs, tensor parallelism, GPUs per pod (the launcher's choice: a
    # PyTorchJob worker per node, or a Ray/torchrun worker per GPU or per pair)
    "train_gpus": ((0.30, 8), (0.25, 16), (0.20, 32), (0.13, 64), (0.08, 128), (0.04, 256)),
    "train_tp": ((0.55, 8), (0.30, 4), (0.15, 2)),
    "train_pod_gpus": ((0.45, 8), (0.25, 4), (0.15, 2), (0.15, 1)),
    "small_gpus": ((0.55, 1), (0.25, 2), (0.20, 4)),
    # serving: prefill engines x TP, decode engines x TP, one engine per pod
    "serve_prefill": ((0.5, (1, 2)), (0.3, (2, 2)), (0.2, (2, 4))),
    "serve_decode": ((0.4, (1, 4)), (0.4, (2, 4)), (0.2, (1, 8))),
    # run time on an ideal placement: log-normal median (s) and sigma, capped at 7 days
    "duration": {
        JobClass.TRAIN: (4 * 3600.0, 1.0),
        JobClass.SMALL: (1200.0, 1.2),
        JobClass.SERVE: (6 * 3600.0, 0.6),
    },
}
_MAX_DURATION = 7 * 86400.0


def _pick(rng: random.Random, table: object) -> object:
    rows = list(table)  # type: ignore[call-overload]
    return rng.choices([r[1] for r in rows], weights=[r[0] for r in rows])[0]


def _int_pick(rng: random.Random, key: str) -> int:
    value = _pick(rng, LLM_MIX[key])
    assert isinstance(value, int)
    return value


def _pair_pick(rng: random.Random, key: str) -> tuple[int, int]:
    value = _pick(rng, LLM_MIX[key])
    assert isinstance(value, tuple)
    return int(value[0]), int(value[1])


def _duration(rng: random.Random, job_class: JobClass) -> float:
    table = LLM_MIX["duration"]
    assert isinstance(table, dict)
    median, sigma = table[job_class]
    return float(min(max(median * math.exp(rng.gauss(0.0, sigma)), 60.0), _MAX_DURATION))


def _llm_job(rng: random.Random, i: int, node_gpus: int, max_gpus: int) -> tuple[SimJob, float]:
    """One generated job at arrival 0, and its GPU-seconds."""
    job_class = _pick(rng, LLM_MIX["classes"])
    assert isinstance(job_class, JobClass)
    name = f"llm-{i:06}"
    duration = _duration(rng, job_class)
    if job_class is JobClass.TRAIN:
        gpus = min(_int_pick(rng, "train_gpus"), max_gpus)
        tp = min(_int_pick(rng, "train_tp"), node_gpus, gpus)
        per_pod = min(_int_pick(rng, "train_pod_gpus"), node_gpus, gpus)
        group = Group(
            "train",
            pods=gpus // per_pod,
            gpus_per_pod=per_pod,
            pattern=Pattern.ALL_REDUCE,
            message_bytes=_MESSAGE_BYTES,
        )
        request = PlacementRequest(groups=(group,), job=name)
    elif job_class is JobClass.SMALL:
        gpus = min(_int_pick(rng, "small_gpus"), node_gpus)
        tp = gpus
        request = PlacementRequest(groups=(_gang("pod", 1, gpus, node_gpus),), job=name)
    else:
        (p_n, p_tp), (d_n, d_tp) = _pair_pick(rng, "serve_prefill"), _pair_pick(rng, "serve_decode")
        p_tp, d_tp = min(p_tp, node_gpus), min(d_tp, node_gpus)
        request = PlacementRequest(
            groups=(
                Group("prefill", gpus_per_pod=p_tp, replicas=p_n, message_bytes=_MESSAGE_BYTES),
                Group("decode", gpus_per_pod=d_tp, replicas=d_n, message_bytes=_MESSAGE_BYTES),
            ),
            edges=(
                Edge(
                    "prefill",
                    "decode",
                    transfer_bytes=_KV_BYTES,
                    max_transfer_seconds=_KV_DEADLINE_S,
                ),
            ),
            job=name,
        )
        tp = 1
    job = SimJob(name, 0.0, duration, job_class, request, tp=tp)
    return job, job.gpus * duration


def llm_mix(
    jobs: int, *, seed: int = 0, cluster_gpus: int, node_gpus: int = 8, load: float = 0.9
) -> list[SimJob]:
    """`jobs` generated LLM jobs (`LLM_MIX`), Poisson arrivals offering `load` x the cluster.

    The same seed gives the same jobs, byte for byte, whatever the policy.
    """
    if jobs < 0:
        raise TraceSourceError("llm: the number of jobs must not be negative")
    if load <= 0:
        raise TraceSourceError("llm: load must be above 0")
    rng = random.Random(seed)
    made = [_llm_job(rng, i, node_gpus, cluster_gpus) for i in range(jobs)]
    if not made:
        return []
    mean_work = sum(w for _, w in made) / len(made)
    rate = load * cluster_gpus / mean_work  # jobs per second
    out: list[SimJob] = []
    t = 0.0
    for job, _ in made:
        t += rng.expovariate(rate)
        out.append(SimJob(job.name, t, job.duration, job.job_class, job.request, tp=job.tp))
    return out


def read_trace(
    source: str, *, cluster_gpus: int, node_gpus: int = 8, load: float = 0.9
) -> list[SimJob]:
    """Jobs from `KIND:ARG`: `openb:FILE[@SCALE]`, `kalos:FILE[@SCALE]`, `llm:JOBS[@SEED]`.

    A bare FILE is recognised by its header (openb or Kalos). SCALE multiplies arrival times
    (0.05 replays Kalos' 90 days of arrivals in 4.5, twenty times the load; run times stay), the
    usual way to set a trace's load on a cluster of another size.
    """
    kind, _, arg = source.partition(":")
    if not arg:
        kind, arg = "", source
    if kind == "llm":
        count, _, seed = arg.partition("@")
        try:
            return llm_mix(
                int(count),
                seed=int(seed or 0),
                cluster_gpus=cluster_gpus,
                node_gpus=node_gpus,
                load=load,
            )
        except ValueError as err:
            if isinstance(err, TraceSourceError):
                raise
            raise TraceSourceError(f"{source}: use llm:JOBS or llm:JOBS@SEED") from None
    if kind not in ("", "openb", "kalos"):
        raise TraceSourceError(f"{source}: unknown trace kind {kind!r}; use openb:, kalos: or llm:")
    scale = 1.0
    path, at, factor = arg.rpartition("@")
    if at:
        try:
            scale = float(factor)
        except ValueError:
            path = arg  # an "@" that is part of the file name
        else:
            arg = path
            if not (math.isfinite(scale) and scale > 0):
                raise TraceSourceError(f"{source}: the time scale after @ must be above 0")
    try:
        with open(arg, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeError) as err:
        raise TraceSourceError(f"{arg}: {err}") from None
    header = text.split("\n", 1)[0]
    if not kind:
        kind = "kalos" if "gpu_workers" in header else "openb"
    if kind == "kalos":
        jobs = kalos_jobs(text, node_gpus=node_gpus, source=arg)
    else:
        jobs = openb_jobs(text, node_gpus=node_gpus, source=arg)
    if scale != 1.0:
        jobs = [replace(j, arrival=j.arrival * scale) for j in jobs]
    return jobs


def merged(traces: Iterable[list[SimJob]]) -> list[SimJob]:
    """Several traces as one, by arrival (stable: a trace's own order breaks ties)."""
    out = [job for trace in traces for job in trace]
    out.sort(key=lambda j: j.arrival)
    return out
