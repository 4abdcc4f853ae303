"""What node fitness costs the binder per decision, on synthetic clusters (not a test).

    .venv/bin/python scripts/bench_fitness.py [--nodes 36,1000] [--pods-per-node 4,40]

For each size: the one-off cost of counting every bound pod into a `UsageBook` (the binder pays
it once per pod event, spread over time), the view rebuilt after a change, and the fitness step
of one 64-pod gang (identical pods are judged once). Prints JSON, milliseconds.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from gputopo.fitness import FitnessView, UsageBook, node_facts
from gputopo.request import request_from_mapping
from scheduler.fitness import restrict_request


def _node(i: int) -> dict[str, Any]:
    name = f"n{i:05d}"
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "a"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}] if i % 2 else []},
        "status": {
            "allocatable": {"cpu": "256", "memory": "2Ti", "pods": "250", "nvidia.com/gpu": "80"}
        },
    }


def _pod(name: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}},
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"pool": "a"},
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"namespace": "ns", "name": name}, "spec": spec}


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1e3, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", default="36,1000")
    parser.add_argument("--pods-per-node", default="4,40")
    args = parser.parse_args()
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        for per in (int(p) for p in args.pods_per_node.split(",")):
            node_json = [_node(i) for i in range(nodes)]
            bound = [_pod(f"b{i}", f"n{i % nodes:05d}") for i in range(nodes * per)]
            start = time.perf_counter()
            book = UsageBook.of(bound)
            book_ms = _ms(start)
            facts = [node_facts(n) for n in node_json]
            start = time.perf_counter()
            view = FitnessView(facts, usage=book)
            view_ms = _ms(start)
            gang = [_pod(f"g{i}") for i in range(64)]
            request = request_from_mapping({"groups": [{"name": "g", "pods": 64}]})
            start = time.perf_counter()
            verdict = restrict_request(request, gang, view)
            gang_ms = _ms(start)
            assert verdict.request is not None, verdict.message
            rows.append(
                {
                    "nodes": nodes,
                    "bound_pods": nodes * per,
                    "usage_book_ms": book_ms,
                    "view_ms": view_ms,
                    "gang64_ms": gang_ms,
                }
            )
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
