"""One pod on given nodes: does it fit, how fast would it be, what would it cost the cluster.

This is what a kube-scheduler extender needs (filter and prioritize one pod over the nodes the
scheduler proposes), answered with the same intra-node choice, cost model and damage terms the
`gputopo` policy uses, so an unmodified kube-scheduler gets the same preferences per node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gputopo import cost
from gputopo.cluster import ClusterSnapshot
from gputopo.placement.intranode import choose
from gputopo.placement.objective import Damage, damage
from gputopo.placement.predict import collective_seconds
from gputopo.request import Group

__all__ = ["MAX_SCORE", "NodeFit", "fit_on_nodes", "scores"]

# kube-scheduler's MaxExtenderPriority: extender scores run from 0 to 10.
MAX_SCORE = 10


@dataclass(frozen=True, slots=True)
class NodeFit:
    """One pod on one node: the GPUs it would get, or why it cannot go there."""

    node: str
    fits: bool
    reason: str = ""
    gpus: tuple[int, ...] = ()
    seconds: float = math.inf
    harm: Damage = ()


def fit_on_nodes(
    snapshot: ClusterSnapshot, nodes: Iterable[str], group: Group, *, island: bool
) -> list[NodeFit]:
    """How a pod of `group.gpus_per_pod` GPUs would do on each of `nodes` (in that order).

    `island` asks for GPUs of one NVLink island (a required NVLink scope).
    """
    out = []
    need = group.gpus_per_pod
    for name in nodes:
        state = snapshot.nodes.get(name)
        if state is None:
            out.append(NodeFit(name, False, "gputopo has no topology for this node"))
            continue
        if not state.placeable:
            out.append(NodeFit(name, False, f"not placeable ({state.reason or 'unknown'})"))
            continue
        shape, mask = snapshot.node_class(name)
        if mask.bit_count() < need:
            out.append(NodeFit(name, False, f"{mask.bit_count()} free GPUs, {need} needed"))
            continue
        found = choose(shape, mask, need, island=island)
        if found is None:
            out.append(NodeFit(name, False, f"no {need} free GPUs in one NVLink island"))
            continue
        seconds = collective_seconds(group, ((found, 1),), nodes=1, nvlink=False)
        out.append(NodeFit(name, True, "", found.gpus, seconds, damage(snapshot, {name: need})))
    return out


def scores(fits: Iterable[NodeFit]) -> Mapping[str, int]:
    """Extender scores (0..MAX_SCORE) for the nodes that fit.

    Up to 8 points for speed (the fastest predicted collective gets 8, a node twice as slow
    4), and 2 more for the least damaging nodes among those in the fastest time bucket (1 for
    any node that does not break a whole free node), so kube-scheduler packs pods where gputopo
    would and keeps whole nodes free.
    """
    fitting = [f for f in fits if f.fits]
    if not fitting:
        return {}
    fastest = min(f.seconds for f in fitting)
    best_bucket = cost.time_bucket(fastest)
    least = min(f.harm for f in fitting if cost.time_bucket(f.seconds) == best_bucket)
    out: dict[str, int] = {}
    for f in fitting:
        speed = 8.0 if f.seconds <= 0 or fastest <= 0 else 8.0 * fastest / f.seconds
        bonus = 0
        if cost.time_bucket(f.seconds) == best_bucket:
            bonus = 2 if f.harm == least else 1
        elif _whole_nodes_broken(f.harm) == 0:
            bonus = 1
        out[f.node] = max(0, min(MAX_SCORE, round(speed) + bonus))
    return out


def _whole_nodes_broken(harm: Damage) -> int:
    # damage(): (spines, leaves, NVLink domains, nodes broken, leftover, ...)
    return harm[3] if len(harm) > 3 else 0
