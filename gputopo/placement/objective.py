"""The gputopo policy's objective: how two candidate placements of the same thing compare.

A key is a tuple compared lexicographically, lower is better:

1. `missed`: how many preferred scopes the placement misses (a preference is stated by the user,
   so it outranks everything the engine infers);
2. the predicted communication time, bucketed (`cost.time_bucket`: within 5 % counts as equal,
   because the model is not more precise than that);
3. `spread`: replicas sharing a failure domain that a preferred spread asked to avoid;
4. the span: the narrowest scope holding the placement (node < NVLink domain < leaf < ...). Same
   predicted time, but fewer switch hops and less exposure to other jobs' traffic, which the model
   does not see (Crux, SIGCOMM'24: a third of jobs suffer inter-job contention);
5. damage to free capacity the next job may need: whole free domains broken, widest first
   (spines, leaves, multi-node NVLink domains, nodes), then best fit: GPUs left free on the touched
   nodes, then in their NVLink domains, leaves and spines (fewer is better: fill what is already
   broken before breaking into what is whole);
6. node names, so equal keys still give one deterministic answer.

DESIGN.md orders spread after damage; here a preferred spread comes before it because a user
asked for it explicitly, while damage is our guess about future jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from gputopo import cost
from gputopo.cluster import ClusterSnapshot
from gputopo.request import Scope

__all__ = ["WIDTH", "Damage", "Key", "damage", "key", "width"]

# How wide each scope is. Multi-node NVLink domains (NVL72 racks) sit between a node and a leaf.
WIDTH = {
    Scope.NODE: 0,
    Scope.NVLINK: 1,
    Scope.LEAF: 2,
    Scope.SPINE: 3,
    Scope.CORE: 4,
    Scope.ZONE: 5,
    Scope.CLUSTER: 6,
}

# Whole free domains broken, widest first, then the best-fit sums, narrowest first.
_BROKEN_SCOPES = (Scope.SPINE, Scope.LEAF, Scope.NVLINK)
_FIT_SCOPES = (Scope.NVLINK, Scope.LEAF, Scope.SPINE)

Damage = tuple[int, ...]


def width(scope: Scope | None) -> int:
    """A scope's width (None: the cluster)."""
    return WIDTH[scope] if scope is not None else WIDTH[Scope.CLUSTER]


def damage(snapshot: ClusterSnapshot, taken: Mapping[str, int]) -> Damage:
    """The damage of taking `taken[node]` GPUs on each node, on the snapshot before it.

    (spines, leaves, NVLink domains, nodes broken; GPUs left on the touched nodes, then in the
    touched NVLink domains, leaves and spines). A domain is broken when it was entirely free.
    """
    broken = dict.fromkeys(_BROKEN_SCOPES, 0)
    fit = dict.fromkeys(_FIT_SCOPES, 0)
    per_domain: dict[tuple[Scope, str], int] = {}
    nodes_broken = 0
    leftover = 0
    for node, count in taken.items():
        mask = snapshot.free_mask(node)
        shape = snapshot.shape(node)
        if mask == shape.full_mask:
            nodes_broken += 1
        leftover += mask.bit_count() - count
        for scope in _BROKEN_SCOPES:
            domain = snapshot.domain_of(node, scope)
            if domain:
                per_domain[(scope, domain)] = per_domain.get((scope, domain), 0) + count
    for (scope, domain), count in per_domain.items():
        free = snapshot.domain_free(scope, domain)
        if free == snapshot.domain_total(scope, domain):
            broken[scope] += 1
        if scope in fit:
            fit[scope] += free - count
    return (
        *(broken[s] for s in _BROKEN_SCOPES),
        nodes_broken,
        leftover,
        *(fit[s] for s in _FIT_SCOPES),
    )


class Key(NamedTuple):
    """A candidate's comparison key (see the module docstring); compares as a tuple."""

    missed: int
    time: int
    spread: int
    span: int
    harm: Damage
    names: tuple[str, ...]


def key(
    *,
    missed: int,
    seconds: float,
    spread: int,
    span: Scope,
    harm: Damage,
    names: Iterable[str],
) -> Key:
    """The comparison key of a candidate placement (see the module docstring)."""
    return Key(missed, cost.time_bucket(seconds), spread, WIDTH[span], harm, tuple(names))
