"""Node fitness as kube-scheduler v1.20 decides it: which nodes a pod may run on, and why not.

Pure (standard library only) and fed the API's JSON: `FitnessView(nodes, bound_pods).check(pod)`
returns a `Fitness` with the fit nodes, the nodes each filter rejected, and kube-scheduler's
"0/N nodes are available: ..." message. `filters.py` says which filters and in what order;
`model.py` what is read of Pods and Nodes; `quantity.py` how "500m" and "1Gi" are counted.
"""

from __future__ import annotations

from gputopo.fitness.filters import FILTERS, Fitness, FitnessView, fit_error_message, score
from gputopo.fitness.model import (
    NodeFacts,
    NodeUsage,
    PodFacts,
    UsageBook,
    node_facts,
    pod_facts,
    pod_request,
)
from gputopo.fitness.quantity import QuantityError, milli_value, parse_quantity, value

__all__ = [
    "FILTERS",
    "Fitness",
    "FitnessView",
    "NodeFacts",
    "NodeUsage",
    "PodFacts",
    "QuantityError",
    "UsageBook",
    "fit_error_message",
    "milli_value",
    "node_facts",
    "parse_quantity",
    "pod_facts",
    "pod_request",
    "score",
    "value",
]
