"""Trust, but verify: did the kubelet give each pod the GPUs gputopo recorded for it?

The binder records the GPUs it chose (`gputopo.io/gpus`), but the kubelet's device manager
decides (with gputopo's device plugin it follows the record; with another plugin, or when the
plugin guessed the wrong pod in a race, it may not). The exporter reports what the kubelet
really handed out (PodResources). A pod holding a GPU outside its record is a mismatch:

1. counted per node (`gputopo_gpu_choice_mismatches_total{node}`), once per pod and answer;
2. told to listeners, which put an Event on the pod (`aggregator.server`);
3. and the kubelet's GPUs are the ones held (the cluster state already prefers the kubelet's
   exact report over a record: `aggregator.occupancy`, rule 4).

A pod the kubelet reports with fewer GPUs than recorded, all of them recorded ones, is mid-
admission (one container at a time), not a mismatch. Pure: reports in, mismatches out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aggregator.occupancy import PodUse
from gputopo.gpu_use import GpuUse

__all__ = ["ChoiceChecker", "Mismatch", "mismatches"]


@dataclass(frozen=True, slots=True, order=True)
class Mismatch:
    """A pod whose kubelet-held GPUs are not the ones gputopo recorded."""

    node: str
    pod: str  # namespace/name
    recorded: frozenset[int]
    held: frozenset[int]

    @property
    def message(self) -> str:
        def gpus(s: frozenset[int]) -> str:
            return ",".join(map(str, sorted(s)))

        return (
            f"the kubelet gave GPUs {gpus(self.held)} on {self.node}, gputopo recorded "
            f"{gpus(self.recorded)}: is another device plugin serving the GPUs? (the kubelet's "
            "GPUs are counted held)"
        )


def mismatches(node: str, use: GpuUse, pods: Iterable[PodUse]) -> list[Mismatch]:
    """Pods with a record whose kubelet-held GPUs include one outside it."""
    held: dict[str, set[int]] = {}
    for gpu, holder in use.held.items():
        held.setdefault(holder.pod_key, set()).add(gpu)
    found = []
    for pod in pods:
        got = held.get(pod.key)
        if pod.recorded and got and not got <= pod.recorded:
            found.append(Mismatch(node, pod.key, pod.recorded, frozenset(got)))
    return sorted(found)


@dataclass(slots=True)
class ChoiceChecker:
    """Counts mismatches per node and tells listeners, once per pod and answer."""

    counts: Counter[str] = field(default_factory=Counter)
    listeners: list[Callable[[Mismatch], None]] = field(default_factory=list)
    _seen: dict[str, Mismatch] = field(default_factory=dict)

    def check(self, node: str, use: GpuUse, pods: Iterable[PodUse]) -> list[Mismatch]:
        """Compare one kubelet report with the records; returns the new mismatches."""
        new = []
        for found in mismatches(node, use, pods):
            if self._seen.get(found.pod) == found:
                continue
            self._seen[found.pod] = found
            self.counts[node] += 1
            new.append(found)
            for listener in self.listeners:
                listener(found)
        return new

    def forget(self, pod: str) -> None:
        """A pod gone: a later pod of the same name is checked afresh."""
        self._seen.pop(pod, None)
