"""The one seam between the simulator and the placement engine: place, release, nothing else.

The replay never touches a policy or a snapshot itself; it asks `Engine.place(request)` and
`Engine.release(allocation)`. Today the engine runs the aggregator's own pieces directly: the
`ClusterSnapshot` (`gputopo.cluster`, with `with_free` deriving the next state as the aggregator's
state does) and the policies of `gputopo.placement` (the very objects `gputopo.placement.POLICIES`
holds, plus the three baselines of `gputopo.placement.packing`). When the transport-free
`PlacementCore` with its in-memory reservation store lands, these two methods become its Place
(reserve, then commit) and Release, and nothing else in `gputopo.sim` changes.

The engine also checks what the simulator must never see, on every decision, so a policy that
breaks a gang or hands out a busy GPU fails the replay (and the tests) instead of bending its
figures: every pod of every replica of every group placed with exactly its GPU count, all of a
pod's GPUs on one node, every GPU free before and taken once; a release frees only GPUs that were
taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gputopo.cluster import ClusterSnapshot
from gputopo.placement import POLICIES, PlacementResult, Policy
from gputopo.placement.packing import KaiBinPackPolicy, RandomPolicy, TightestFitPolicy
from gputopo.request import PlacementRequest, validate

__all__ = ["SIM_POLICIES", "Engine", "InvariantError", "make_policy"]

# Every policy the simulator knows, in the order tables list them.
SIM_POLICIES: Final = (
    "gputopo",
    "kueue-bestfit",
    "kai-binpack",
    "tightest-fit",
    "default",
    "first-fit",
    "random",
)


class InvariantError(AssertionError):
    """A policy broke a rule no placement may break (a bug in the policy, not in the trace)."""


def make_policy(name: str, *, seed: int = 0) -> Policy:
    """The policy called `name`; `random` draws from its own generator seeded with `seed`."""
    if name == "random":
        return RandomPolicy(seed=seed)
    extra: dict[str, Policy] = {
        "kai-binpack": KaiBinPackPolicy(),
        "tightest-fit": TightestFitPolicy(),
    }
    if name in extra:
        return extra[name]
    if name in POLICIES:
        return POLICIES[name]
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(SIM_POLICIES)}")


class Engine:
    """Placement with an in-memory store of what is taken (see the module docstring)."""

    def __init__(self, snapshot: ClusterSnapshot, policy: str, *, seed: int = 0) -> None:
        self.policy_name = policy
        self._policy = make_policy(policy, seed=seed)
        self._empty = snapshot.indexed()
        self._snapshot = self._empty
        self._generation = 0
        self._fits_empty: dict[object, bool] = {}
        self.decisions = 0  # placements made and checked
        self.refusals = 0

    @property
    def snapshot(self) -> ClusterSnapshot:
        """The current state: free GPUs after every placement and release so far."""
        return self._snapshot

    def place(self, request: PlacementRequest) -> PlacementResult:
        """Place the request and take its GPUs, or return the policy's refusal unchanged."""
        validate(request)
        result = self._policy.place(self._snapshot, request)
        if not result.placed:
            self.refusals += 1
            return result
        changes = self._check(request, result)
        self._generation += 1
        self._snapshot = self._snapshot.with_free(changes, generation=self._generation)
        self.decisions += 1
        return result

    def release(self, allocation: Mapping[str, frozenset[int]]) -> None:
        """Give back GPUs a placement took."""
        nodes = self._snapshot.nodes
        changes: dict[str, frozenset[int]] = {}
        for node, gpus in allocation.items():
            free = nodes[node].free
            if gpus & free:
                raise InvariantError(f"release of GPUs {sorted(gpus & free)} on {node}: not taken")
            changes[node] = free | gpus
        self._generation += 1
        self._snapshot = self._snapshot.with_free(changes, generation=self._generation)

    def fits_empty(self, request: PlacementRequest) -> bool:
        """Whether this policy can place the request on the cluster with every GPU free.

        A job that cannot would block a FIFO queue forever; the replay drops it and counts it.
        Answers are remembered per request shape.
        """
        key = (
            tuple((g.pods, g.gpus_per_pod, g.replicas, g.scope) for g in request.groups),
            tuple((e.source, e.target) for e in request.edges),
        )
        if key not in self._fits_empty:
            if request.total_gpus > self._empty.total_gpus:
                self._fits_empty[key] = False
            else:
                self._fits_empty[key] = self._policy.place(self._empty, request).placed
        return self._fits_empty[key]

    def _check(
        self, request: PlacementRequest, result: PlacementResult
    ) -> dict[str, frozenset[int]]:
        """The invariants of the module docstring; returns each touched node's new free set."""
        nodes = self._snapshot.nodes
        want = {
            (g.name, r, p): g.gpus_per_pod
            for g in request.groups
            for r in range(g.replicas)
            for p in range(g.pods)
        }
        got: set[tuple[str, int, int]] = set()
        taken: dict[str, set[int]] = {}
        for pod in result.pods:
            key = (pod.group, pod.replica, pod.pod)
            if key not in want:
                raise InvariantError(f"{self.policy_name}: pod {key} is not in the request")
            if key in got:
                raise InvariantError(f"{self.policy_name}: pod {key} placed twice")
            got.add(key)
            if len(pod.gpus) != want[key] or len(set(pod.gpus)) != len(pod.gpus):
                raise InvariantError(
                    f"{self.policy_name}: pod {key} got GPUs {pod.gpus}, wants {want[key]}"
                )
            if pod.node not in nodes:
                raise InvariantError(f"{self.policy_name}: pod {key} on unknown node {pod.node}")
            free = nodes[pod.node].free
            mine = taken.setdefault(pod.node, set())
            for gpu in pod.gpus:
                if gpu not in free or gpu in mine:
                    raise InvariantError(
                        f"{self.policy_name}: GPU {gpu} of {pod.node} is already taken "
                        f"(pod {key} of job {request.job})"
                    )
                mine.add(gpu)
        missing = want.keys() - got
        if missing:
            raise InvariantError(
                f"{self.policy_name}: gang of job {request.job} broken, "
                f"{len(missing)} pod(s) not placed, e.g. {min(missing)}"
            )
        return {node: nodes[node].free - gpus for node, gpus in taken.items()}
