"""Three more count-only baselines, for whole-cluster comparisons (`gputopo simulate`).

- `kai-binpack`: KAI scheduler's topology plugin (kai-scheduler/KAI-Scheduler
  `pkg/scheduler/plugins/topology/`, see `reference/schedulers.md` §1.2) for a job whose
  preferred level is the node and whose required level is the whole cluster: candidate domains
  deepest level first (node, NVLink domain, leaf, spine, core, cluster), inside a level the
  domain with the least free GPUs that still holds the job first (KAI sorts by the dominant
  ratio request/free, descending), nodes inside a domain most-allocated first, the first domain
  where the whole gang fits wins.
- `tightest-fit`: upstream kube-scheduler's topology-aware workload scheduling (KEP-5732:
  `TopologyPlacementGenerator` emits one candidate per value of the PodGroup's topology key, the
  normal pod-by-pod algorithm, LeastAllocated, runs inside each, and NodeResourcesFit's placement
  score prefers the most allocated placement). The key is the narrowest level whose largest
  domain can hold the job, as a user would write it; the job waits when no domain of that level
  has room now, as a required constraint does.
- `random`: FGD's Random baseline: nodes in a seeded random order, random free GPUs.

Like `default` and `first-fit`, none looks at bandwidth; each is gang-atomic.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.baselines import gpuallocator_choice
from gputopo.placement.constraints import violations
from gputopo.placement.fill import FillFailure, Strategy, fill
from gputopo.placement.predict import predict
from gputopo.placement.result import PlacementResult, Rejection, RejectionCode
from gputopo.request import PlacementRequest, Scope

__all__ = ["KaiBinPackPolicy", "RandomPolicy", "TightestFitPolicy"]

_LEVELS = (Scope.NODE, Scope.NVLINK, Scope.LEAF, Scope.SPINE, Scope.CORE, Scope.CLUSTER)


def _most_allocated(
    snapshot: ClusterSnapshot, nodes: Sequence[str], free: Mapping[str, frozenset[int]], per: int
) -> list[str]:
    return sorted(nodes, key=lambda n: (len(free[n]), n))


def _least_allocated(
    snapshot: ClusterSnapshot, nodes: Sequence[str], free: Mapping[str, frozenset[int]], per: int
) -> list[str]:
    def key(n: str) -> tuple[float, str]:
        total = snapshot.node(n).topology.gpu_count or 1
        return (-len(free[n]) / total, n)

    return sorted(nodes, key=key)


def _device_plugin(
    snapshot: ClusterSnapshot, node: str, free: frozenset[int], count: int, leaves: bool
) -> tuple[int, ...] | None:
    return gpuallocator_choice(snapshot.node(node).topology, free, count)


def _domains(snapshot: ClusterSnapshot, scope: Scope) -> Mapping[str, tuple[str, ...]]:
    """Domains of a level; NODE is every node, CLUSTER everything; other levels as indexed."""
    if scope is Scope.NODE:
        return {n: (n,) for n in snapshot.nodes}
    if scope is Scope.CLUSTER:
        return {"cluster": tuple(snapshot.nodes)}
    return snapshot.domains(scope)


def _free(snapshot: ClusterSnapshot, scope: Scope, domain: str) -> int:
    if scope is Scope.CLUSTER:
        return snapshot.free_gpus
    return snapshot.domain_free(scope, domain)


def _total(snapshot: ClusterSnapshot, scope: Scope, domain: str) -> int:
    if scope is Scope.CLUSTER:
        return snapshot.total_gpus
    return snapshot.domain_total(scope, domain)


class _OrderedDomains:
    """Shared shape: try candidate domains in the policy's order; the first fill wins."""

    name = "ordered-domains"
    strategy: Strategy

    def _candidates(
        self, snapshot: ClusterSnapshot, need: int
    ) -> Iterator[tuple[Scope, str, tuple[str, ...]]]:
        raise NotImplementedError

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        """Fill the whole request into the first candidate domain that holds it."""
        need = request.total_gpus
        rejections: list[Rejection] = []
        for scope, domain, nodes in self._candidates(snapshot, need):
            pods = fill(snapshot, request, request.groups, nodes, self.strategy)
            if isinstance(pods, FillFailure):
                if len(rejections) < 50:
                    where = f"{scope.name.lower()}/{domain}"
                    rejections.append(Rejection(where, pods.code, pods.message))
                continue
            broken = violations(snapshot, request, pods)
            if broken:
                rejections.append(Rejection(domain, RejectionCode.UNSUPPORTED, broken[0]))
                continue
            return PlacementResult(True, self.name, tuple(pods), predict(snapshot, request, pods))
        return PlacementResult(
            False,
            self.name,
            reason=f"no candidate domain can hold the request ({need} GPUs)",
            rejections=tuple(rejections),
        )


class KaiBinPackPolicy(_OrderedDomains):
    """KAI's topology plugin: deepest level first, fullest fitting domain first, bin-pack nodes."""

    name = "kai-binpack"
    strategy = Strategy(node_order=_most_allocated, gpu_choice=_device_plugin)

    def _candidates(
        self, snapshot: ClusterSnapshot, need: int
    ) -> Iterator[tuple[Scope, str, tuple[str, ...]]]:
        for scope in _LEVELS:
            fitting = [
                (_free(snapshot, scope, d), d, nodes)
                for d, nodes in _domains(snapshot, scope).items()
                if _free(snapshot, scope, d) >= need
            ]
            fitting.sort(key=lambda t: (t[0], t[1]))
            yield from ((scope, d, nodes) for _, d, nodes in fitting)


class TightestFitPolicy(_OrderedDomains):
    """KEP-5732: one key level, the tightest domain of it whose pod-by-pod fill succeeds."""

    name = "tightest-fit"
    strategy = Strategy(node_order=_least_allocated, gpu_choice=_device_plugin)

    def _candidates(
        self, snapshot: ClusterSnapshot, need: int
    ) -> Iterator[tuple[Scope, str, tuple[str, ...]]]:
        for scope in _LEVELS:
            domains = _domains(snapshot, scope)
            if not domains or max(_total(snapshot, scope, d) for d in domains) < need:
                continue
            fitting = [
                (_free(snapshot, scope, d), d, nodes)
                for d, nodes in domains.items()
                if _free(snapshot, scope, d) >= need
            ]
            # The most allocated placement scores best: the least free domain that fits.
            fitting.sort(key=lambda t: (t[0], t[1]))
            yield from ((scope, d, nodes) for _, d, nodes in fitting)
            return


class RandomPolicy(_OrderedDomains):
    """Nodes in a seeded random order, random free GPUs (FGD's Random)."""

    name = "random"

    def __init__(self, *, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self.strategy = Strategy(node_order=self._order, gpu_choice=self._gpus)

    def _order(
        self,
        snapshot: ClusterSnapshot,
        nodes: Sequence[str],
        free: Mapping[str, frozenset[int]],
        per: int,
    ) -> list[str]:
        out = list(nodes)
        self._rng.shuffle(out)
        return out

    def _gpus(
        self, snapshot: ClusterSnapshot, node: str, free: frozenset[int], count: int, leaves: bool
    ) -> tuple[int, ...] | None:
        if count > len(free):
            return None
        return tuple(sorted(self._rng.sample(sorted(free), count)))

    def _candidates(
        self, snapshot: ClusterSnapshot, need: int
    ) -> Iterator[tuple[Scope, str, tuple[str, ...]]]:
        if snapshot.free_gpus >= need:
            yield (Scope.CLUSTER, "cluster", tuple(snapshot.nodes))
