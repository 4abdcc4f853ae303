"""The `kueue-bestfit` baseline: Kueue's TAS assignment on our cluster, then the kubelet's choice.

What a Kueue user gets today, end to end:

1. Kueue sees a Topology whose levels are the fabric tiers (outermost first) and the hostname,
   built from the same facts our labels publish (`fabric.topograph.run/tier-N`). Nodes lacking
   a level are not part of that Topology (Kueue's rule). A request that needs a multi-node NVLink
   domain uses a second Topology keyed on the accelerator domain (as GB200 users key on
   `nvidia.com/gpu.clique`).
2. Each replica of each group is one PodSet: `pods` pods of `gpus_per_pod` GPUs, with the
   group's (or else the request's) required/preferred scope as the PodSet annotation, and
   unconstrained otherwise. PodSets are admitted one after another, each seeing the usage of
   the ones before.
3. Inside each node Kueue picks nothing: the NVIDIA device plugin's preferred allocation picks
   the GPUs (go-gpuallocator best effort, `baselines.gpuallocator_choice`).

Kueue knows nothing of bandwidth: edges are not considered, and the prediction reports whether
they happen to be met. Nor can it keep several PodSets in one domain (a required scope of the
whole request) or spread them: when its assignment breaks such a rule, the baseline answers
"not placed" with the broken rule rather than a placement the user ruled out.
"""

from __future__ import annotations

import weakref

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.baselines import gpuallocator_choice
from gputopo.placement.constraints import refusal
from gputopo.placement.fill import matches
from gputopo.placement.kueue_tas import (
    HOSTNAME_LABEL,
    TasAssignment,
    TasFailure,
    TasNode,
    TasRequest,
    TasTopology,
)
from gputopo.placement.predict import predict
from gputopo.placement.result import PlacementResult, PodPlacement, Rejection, RejectionCode
from gputopo.request import Group, PlacementRequest, Scope

__all__ = ["KueueBestFitPolicy"]

GPU = "nvidia.com/gpu"
ACCELERATOR = "accelerator.topograph.run/domain"
# Pods allocatable per node: kubelet's default max-pods. Never the binding limit for GPU pods.
_MAX_PODS = 110


def _tier_label(k: int) -> str:
    return f"fabric.topograph.run/tier-{k}"


class _Topologies:
    """The two Kueue Topologies of a cluster (fabric and NVLink), built once per snapshot
    structure: like Kueue's topology-tree cache (kueue#13819), the tree is reused while only
    usage changes, and each decision passes the usage of its snapshot."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        depth = max((len(s.topology.fabric.tiers) for s in snapshot.nodes.values()), default=0)
        self.fabric_levels = [_tier_label(k) for k in reversed(range(depth))] + [HOSTNAME_LABEL]
        self.nvlink_levels = [ACCELERATOR, HOSTNAME_LABEL]
        fabric_nodes, nvlink_nodes = [], []
        paths: dict[tuple[str, ...], dict[str, str]] = {}  # the nodes of a leaf share one
        for name, state in snapshot.nodes.items():
            if not state.placeable:
                continue
            total = state.topology.gpu_count
            alloc = {GPU: float(total), "pods": float(_MAX_PODS)}
            tiers = state.topology.fabric.tiers
            path = paths.get(tiers)
            if path is None:
                # The whole path up, so a leaf name reused under two spines stays two leaves.
                path = paths[tiers] = {
                    _tier_label(k): "/".join(reversed(tiers[k:])) for k in range(len(tiers))
                }
            fabric_nodes.append(TasNode(name, {HOSTNAME_LABEL: name, **path}, alloc))
            domain = snapshot.domain_of(name, Scope.NVLINK)
            if domain:
                nvlink_nodes.append(
                    TasNode(name, {ACCELERATOR: domain, HOSTNAME_LABEL: name}, alloc)
                )
        self.fabric = TasTopology(levels=self.fabric_levels, nodes=fabric_nodes, name="fabric")
        self.nvlink = TasTopology(levels=self.nvlink_levels, nodes=nvlink_nodes, name="nvlink")


_CACHE: weakref.WeakKeyDictionary[object, _Topologies] = weakref.WeakKeyDictionary()


def _topologies(snapshot: ClusterSnapshot) -> _Topologies:
    found = _CACHE.get(snapshot.structure)
    if found is None:
        found = _Topologies(snapshot)
        _CACHE[snapshot.structure] = found
    return found


class KueueBestFitPolicy:
    """Kueue TAS (BestFit profile) + the device plugin's GPU choice; see the module docstring."""

    name = "kueue-bestfit"

    def place(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> PlacementResult:
        """Admit each replica as a PodSet, in order; all or nothing."""
        topos = _topologies(snapshot)
        fabric, nvlink = topos.fabric, topos.nvlink
        free = {n: s.free for n, s in snapshot.nodes.items()}
        pods: list[PodPlacement] = []
        for group in sorted(request.groups, key=lambda g: (-g.gpus_per_replica, g.name)):
            allowed = {
                n
                for n, s in snapshot.nodes.items()
                if matches(s, request.node_selector, group.node_selector)
            }
            for replica in range(group.replicas):
                use_nvlink, tas_request = self._podset(topos, snapshot, request, group)
                topo = nvlink if use_nvlink else fabric
                # The snapshot's usage (GPUs in use, and what earlier PodSets took), and
                # everything on nodes the selectors rule out (Kueue filters those nodes away).
                usage = {
                    n: {GPU: float(s.topology.gpu_count - len(free[n]))}
                    for n, s in snapshot.nodes.items()
                    if s.topology.gpu_count != len(free[n])
                }
                for n in snapshot.nodes.keys() - allowed:
                    usage[n] = {GPU: float(snapshot.node(n).topology.gpu_count)}
                outcome = topo.assign(tas_request, usage=usage)
                if isinstance(outcome, TasFailure):
                    return PlacementResult(
                        False,
                        self.name,
                        reason=f"group {group.name} replica {replica}: {outcome.reason}",
                        rejections=(Rejection("kueue", RejectionCode.KUEUE, outcome.reason),),
                    )
                placed = self._bind(snapshot, group, replica, outcome, free)
                if placed is None:
                    return PlacementResult(
                        False,
                        self.name,
                        reason=f"group {group.name}: device plugin could not "
                        "allocate the GPUs Kueue admitted",
                    )
                pods.extend(placed)
        # Kueue admits PodSets one by one: it has no way to keep several in one domain or
        # apart. When its answer would break the request, the baseline says so instead.
        wrong = refusal(
            snapshot,
            request,
            pods,
            policy=self.name,
            why="Kueue's assignment breaks the request",
            code=RejectionCode.UNSUPPORTED,
        )
        return wrong or PlacementResult(
            True, self.name, tuple(pods), predict(snapshot, request, pods)
        )

    def _podset(
        self,
        topos: _Topologies,
        snapshot: ClusterSnapshot,
        request: PlacementRequest,
        group: Group,
    ) -> tuple[bool, TasRequest]:
        required = group.scope.required or request.scope.required
        preferred = group.scope.preferred or request.scope.preferred
        per_pod = {GPU: float(group.gpus_per_pod)}
        max_node = max((s.topology.gpu_count for s in snapshot.nodes.values()), default=0)
        if required is Scope.NVLINK:
            if group.gpus_per_replica <= max_node and group.pods == 1:
                return False, TasRequest(group.pods, per_pod, "required", HOSTNAME_LABEL)
            return True, TasRequest(group.pods, per_pod, "required", ACCELERATOR)
        if required is not None:
            return False, TasRequest(group.pods, per_pod, "required", self._level(topos, required))
        if preferred is not None and preferred is not Scope.NVLINK:
            return False, TasRequest(
                group.pods, per_pod, "preferred", self._level(topos, preferred)
            )
        return False, TasRequest(group.pods, per_pod, "unconstrained")

    def _level(self, topos: _Topologies, scope: Scope) -> str:
        if scope is Scope.NODE:
            return HOSTNAME_LABEL
        tier = {Scope.LEAF: 0, Scope.SPINE: 1, Scope.CORE: 2}.get(scope)
        if tier is None or tier >= len(topos.fabric_levels) - 1:
            return topos.fabric_levels[0]  # the widest level there is
        return _tier_label(tier)

    def _bind(
        self,
        snapshot: ClusterSnapshot,
        group: Group,
        replica: int,
        outcome: TasAssignment,
        free: dict[str, frozenset[int]],
    ) -> list[PodPlacement] | None:
        out: list[PodPlacement] = []
        rank = 0
        pod_index = 0
        for domain in outcome.domains:
            node = domain.values[-1]
            count = domain.pods * group.gpus_per_pod
            gpus = gpuallocator_choice(snapshot.node(node).topology, free[node], count)
            if gpus is None:
                return None
            free[node] = free[node] - set(gpus)
            for i in range(domain.pods):
                chunk = tuple(gpus[i * group.gpus_per_pod : (i + 1) * group.gpus_per_pod])
                out.append(PodPlacement(group.name, replica, pod_index, rank, node, chunk))
                pod_index += 1
                rank += group.gpus_per_pod
        return out
