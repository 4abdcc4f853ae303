"""The shape upstream Kubernetes publishes for topology-aware workload scheduling, so operators
can hold gputopo's figures beside it.

A part of `gputopo bench placement`. Kubernetes 1.37's scheduler-perf measures gangs placed on
5,000 nodes in 50 racks (kubernetes/kubernetes PRs #139859 and #140611: 750 / 1,500 / 2,250
gangs of 4 pods, and 3 / 9 gangs of 1,000 pods; 562-630 pods/s for gangs of 4 with placement
sampling). Here:

1. 5,000 DGX-H100 nodes, 100 to a rack (a leaf; 10 racks to a spine), every GPU free.
2. Each workload on a fresh cluster, per policy: the gangs one after another, each decided by
   the engine and its GPUs taken before the next (`with_free`, as a reservation does). A pod
   asks for one GPU; a gang of 4 must stay in one rack (upstream's required rack), a gang of
   1,000 prefers one (1,000 GPUs do not fit in a rack of 800).
3. Pods decided per second (placed pods over the decision time, with the taking counted too,
   and per CPU second of the process, which a shared machine does not distort), and the
   quality of the decisions beside kueue-bestfit's on the same sequence: gangs placed, mean
   predicted communication time, how often gputopo's is slower (by more than the cost
   model's tie bucket) on the same gang of the sequence, racks spanned. kueue-bestfit decides
   only the first gangs of each workload (`kueue_gangs`): it is the quality reference here,
   not the speed one, and costs tens of milliseconds a gang.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["LARGE_GANGS", "SMALL_GANGS", "upstream_shape"]

SMALL_GANGS = (750, 1500, 2250)  # gangs of 4 pods
LARGE_GANGS = (3, 9)  # gangs of 1,000 pods
POLICIES = ("gputopo", "kueue-bestfit")


def _request(pods: int) -> Any:
    from gputopo.request import request_from_mapping

    scope = {"required": "leaf"} if pods <= 100 else {"preferred": "leaf"}
    return request_from_mapping(
        {
            "job": f"gang{pods}",
            "scope": scope,
            "groups": [{"name": "workers", "pods": pods, "gpus_per_pod": 1}],
        }
    )


def _run(snapshot: Any, request: Any, gangs: int, policy: str) -> dict[str, Any]:
    from gputopo.placement import place
    from gputopo.request import Scope

    decide = 0.0
    cpu = 0.0
    commit = 0.0
    placed = 0
    pods = 0
    predicted: list[float] = []
    racks: list[int] = []
    for _ in range(gangs):
        started_cpu = time.process_time()
        result, seconds = place(snapshot, request, policy=policy)
        cpu += time.process_time() - started_cpu
        decide += seconds
        if not result.placed:
            continue
        placed += 1
        pods += len(result.pods)
        if result.prediction is not None:
            predicted.append(result.prediction.communication_seconds)
        racks.append(len({snapshot.domain_of(p.node, Scope.LEAF) for p in result.pods}))
        started = time.perf_counter()
        snapshot = snapshot.with_free(
            {n: snapshot.node(n).free - g for n, g in result.allocation().items()}
        )
        commit += time.perf_counter() - started
    return {
        "policy": policy,
        "gangs_placed": placed,
        "pods_decided_per_s": round(pods / decide, 1) if decide else None,
        "pods_per_s_with_taking": round(pods / (decide + commit), 1) if decide else None,
        # per second of this process's CPU: what a quiet machine would do, on a shared one
        "pods_decided_per_cpu_s": round(pods / cpu, 1) if cpu else None,
        "decision_ms_mean": round(decide / gangs * 1e3, 3),
        "predicted": predicted,
        "racks_mean": round(statistics.fmean(racks), 2) if racks else None,
    }


def upstream_shape(
    *,
    nodes: int,
    racks: int,
    kueue_gangs: int,
    log: Any,
    small: tuple[int, ...] = SMALL_GANGS,
    large: tuple[int, ...] = LARGE_GANGS,
) -> list[dict[str, Any]]:
    """One row per workload and policy (see the module docstring). kueue-bestfit decides only
    the first `kueue_gangs` gangs of each workload (tens of milliseconds a gang); quality is
    compared on those."""
    from gputopo import cost
    from gputopo.sim.scenarios import Layout, build_nodes, empty_snapshot

    layout = Layout("upstream", ("dgx-h100",), nodes // racks, 10)
    topologies = build_nodes(layout, nodes * 8)
    empty = empty_snapshot(topologies).indexed()
    rows: list[dict[str, Any]] = []
    workloads = [(g, 4) for g in small] + [(g, 1000) for g in large]
    for gangs, pods in workloads:
        request = _request(pods)
        runs = {
            p: _run(empty, request, gangs if p == "gputopo" else min(gangs, kueue_gangs), p)
            for p in POLICIES
        }
        ours, theirs = runs["gputopo"]["predicted"], runs["kueue-bestfit"]["predicted"]
        compared = min(len(ours), len(theirs))
        slower = sum(
            1
            for a, b in zip(ours[:compared], theirs[:compared], strict=True)
            if cost.time_bucket(a) > cost.time_bucket(b)
        )
        for policy, run in runs.items():
            predicted = run.pop("predicted")
            rows.append(
                {
                    "shape": f"{gangs}x{pods}",
                    "gangs_decided": gangs if policy == "gputopo" else min(gangs, kueue_gangs),
                    "nodes": len(topologies),
                    "racks": racks,
                    **run,
                    # over the first gangs both policies placed, so the two rows compare
                    "gangs_compared": compared,
                    "predicted_ms_mean": round(statistics.fmean(predicted[:compared]) * 1e3, 4)
                    if compared
                    else None,
                    **({"gangs_slower_than_kueue": slower} if policy == "gputopo" else {}),
                }
            )
        print(
            f"  upstream {gangs} gangs x {pods} pods: gputopo "
            f"{runs['gputopo']['pods_decided_per_s']} pods/s, kueue-bestfit "
            f"{runs['kueue-bestfit']['pods_decided_per_s']} pods/s",
            file=log,
        )
    return rows
