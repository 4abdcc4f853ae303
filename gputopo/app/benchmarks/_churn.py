"""Placement latency with occupancy flowing: bound pods arrive and leave between decisions.

A part of `gputopo bench placement`. The other parts time the engine on snapshots; this one
times a decision the way the aggregator makes it (`ClusterState.snapshot`, the engine, reserve,
release) on a cluster where pods that other schedulers bound keep changing what is free, beside
the same decisions on a cluster where nothing changes between them, in one run:

1. The layout's nodes at `gpus` GPUs; about half of them hold a pod bound elsewhere (half the
   node's GPUs, by count, as the pod watcher reports them).
2. `samples` TP-8 decisions, each reserved and released. With churn, `events` pod events
   (a pod bound or deleted on a random node) reach the state before each decision.
3. p50 and p99 of both, and their ratio (the issue's bar: within 2x).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

__all__ = ["occupancy_churn"]


def _pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "elsewhere"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def _decisions(
    *, layout: str, gpus: int, samples: int, events: int, seed: int
) -> tuple[list[float], int]:
    from aggregator.state import ClusterState
    from gputopo.placement import place
    from gputopo.request import request_from_mapping
    from gputopo.sim.scenarios import build_nodes

    nodes = build_nodes(layout, gpus)
    state = ClusterState(clock=time.time, stale_after_s=1e9)
    for topology in nodes:
        state.add_static(topology)
    rng = random.Random(seed)
    bound: dict[str, dict[str, Any]] = {}
    serial = 0

    def bind(node: Any) -> None:
        nonlocal serial
        serial += 1
        pod = _pod(f"p{serial}", node.name, max(node.gpu_count // 2, 1))
        bound[pod["metadata"]["name"]] = pod
        state.pod_seen(pod)

    for topology in nodes:
        if rng.random() < 0.5:
            bind(topology)
    request = request_from_mapping(
        {"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]}
    )
    state.snapshot()  # built once, as a running aggregator's is
    ms = []
    placed = 0
    for _ in range(samples):
        for _ in range(events):
            if bound and rng.random() < 0.5:
                state.pod_deleted(bound.pop(rng.choice(sorted(bound))))
            else:
                bind(rng.choice(nodes))
        began = time.perf_counter()
        result, _ = place(state.snapshot(), request, policy="gputopo")
        if result.placed:
            held = state.reserve(result, ttl_s=60)
            state.release(held.id)
            placed += 1
        ms.append((time.perf_counter() - began) * 1e3)
    return ms, placed


def occupancy_churn(
    *, layout: str, gpus: int, samples: int, events: int, seed: int
) -> dict[str, Any]:
    """Both runs, side by side (see the module docstring)."""
    figures: dict[str, Any] = {"layout": layout, "gpus": gpus, "samples": samples}
    for name, churn in (("static", 0), ("churn", events)):
        ms, placed = _decisions(layout=layout, gpus=gpus, samples=samples, events=churn, seed=seed)
        ordered = sorted(ms)
        figures[name] = {
            "pod_events_per_decision": churn,
            "p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "placed": placed,
        }
    for q in ("p50_ms", "p99_ms"):
        figures[f"churn_over_static_{q[:3]}"] = round(
            figures["churn"][q] / max(figures["static"][q], 1e-9), 2
        )
    return figures
