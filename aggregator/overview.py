"""What the topology page needs for a whole cluster at once, small, and who holds a node's GPUs.

At 1,000 nodes the full dump (`/api/v1/topology`) is megabytes, almost all of it link lists the
overview never draws. The page's first paint needs one row per node: its name, its place in the
fabric, its GPU model and count, how many GPUs are free or pending, and whether it is stale or
degraded. `summary_rows` gives that as columns of small integers into shared string tables
(domains, models, NVLink domains appear once each), which keeps 1,000 nodes near 50 kB before
compression and 10,000 well under 1 MB; a node's full topology is fetched when it is opened.

`holders` answers "who holds this GPU" from every source the state merges: reservations (with
their job and owner), the kubelet's exact report, gputopo's record on a pod, DRA claims, and pods
that are only counted (the state knows how many GPUs they hold, not which).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.claims import ClaimedDevice
from aggregator.occupancy import PodUse
from gputopo.cluster import ClusterSnapshot, NodeState, domain_ids
from gputopo.gpu_use import GpuUse
from gputopo.links import LinkHealth
from gputopo.request import Scope
from gputopo.reservations import Reservation
from gputopo.topology import NodeTopology

__all__ = [
    "FLAG_DEGRADED",
    "FLAG_STALE",
    "FLAG_UNPLACEABLE",
    "NodeFacts",
    "SummaryCache",
    "SummaryEncoder",
    "holders",
]

# Bits of a row's `flags`.
FLAG_STALE = 1  # stopped reporting
FLAG_DEGRADED = 2  # a GPU or a link of the node is not healthy
FLAG_UNPLACEABLE = 4  # not placeable for another reason (cordoned, ...): see `reasons`

_FIELDS = ("name", "domain", "model", "gpus", "free", "reserved", "flags", "nvlink", "reason")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the summary keeps per topology object: it changes only with a new report."""

    model: str
    gpus: int
    degraded: bool
    domain: str  # the tier-0 domain's path, "core/spine/leaf" ("" without a fabric position)
    nvlink: str  # the multi-node NVLink domain ("" when NVLink stays inside the node)


def _facts(topology: NodeTopology, ids: Mapping[Scope, str]) -> NodeFacts:
    models = sorted({g.name for g in topology.gpus if g.name})
    degraded = any(lk.health is not LinkHealth.OK for lk in topology.links) or any(
        g.health is not LinkHealth.OK for g in topology.gpus
    )
    return NodeFacts(
        model=" + ".join(models),
        gpus=topology.gpu_count,
        degraded=degraded,
        domain=ids.get(Scope.LEAF, ""),
        nvlink=ids.get(Scope.NVLINK, ""),
    )


class _Table:
    """Strings by first appearance; rows carry their index (0 is always "")."""

    def __init__(self) -> None:
        self.values: list[str] = [""]
        self._index: dict[str, int] = {"": 0}

    def __call__(self, value: str) -> int:
        found = self._index.get(value)
        if found is None:
            found = self._index[value] = len(self.values)
            self.values.append(value)
        return found


class SummaryEncoder:
    """Builds the summary's JSON-ready body, keeping each node's facts while its topology object
    is the same (the snapshot keeps the object until a report changes it). Safe to call from
    worker threads: the cache only gains or loses whole entries."""

    def __init__(self) -> None:
        self._facts: dict[str, tuple[NodeTopology, NodeFacts]] = {}

    def facts(self, snapshot: ClusterSnapshot, name: str) -> NodeFacts:
        """A node's facts, from the cache when its topology did not change."""
        node = snapshot.node(name)
        held = self._facts.get(name)
        if held is None or held[0] is not node.topology:
            # domain_ids, not snapshot.domain_of: the latter builds the placement structure of
            # the whole cluster (seconds at 10,000 nodes), which the page does not need.
            ids = domain_ids(node.topology, node.labels)
            held = (node.topology, _facts(node.topology, ids))
            self._facts[name] = held
        return held[1]

    def body(
        self,
        snapshot: ClusterSnapshot,
        *,
        reserved: Mapping[str, Iterable[int]],
        as_of: float,
    ) -> dict[str, Any]:
        """The summary: `fields` names the columns of every row in `nodes`; `domain`, `model`,
        `nvlink` and `reason` are indices into the tables of the same name."""
        domains, models, nvlinks, reasons = _Table(), _Table(), _Table(), _Table()
        rows: list[list[Any]] = []
        for name in sorted(snapshot.nodes):
            node = snapshot.node(name)
            f = self.facts(snapshot, name)
            rows.append(
                [
                    name,
                    domains(f.domain),
                    models(f.model),
                    f.gpus,
                    len(node.free),
                    len(set(reserved.get(name, ()))),
                    _flags(node, f),
                    nvlinks(f.nvlink),
                    reasons("" if node.placeable else node.reason),
                ]
            )
        if len(self._facts) > 2 * len(snapshot.nodes) + 64:
            # list() copies under the GIL: another build may be adding entries in its thread
            for gone in [n for n in list(self._facts) if n not in snapshot.nodes]:
                self._facts.pop(gone, None)
        return {
            "generation": snapshot.generation,
            "as_of": as_of,
            "fields": list(_FIELDS),
            "flags": {
                "stale": FLAG_STALE,
                "degraded": FLAG_DEGRADED,
                "unplaceable": FLAG_UNPLACEABLE,
            },
            "domains": domains.values,
            "models": models.values,
            "nvlink": nvlinks.values,
            "reasons": reasons.values,
            "nodes": rows,
        }


# Inputs read on the loop: the snapshot and the GPUs of reservations not yet committed per node.
SummaryInputs = tuple[ClusterSnapshot, Mapping[str, Iterable[int]]]


class SummaryCache:
    """The summary's JSON bytes, built off the loop once per state generation (or `max_age_s`,
    so `as_of` moves on); concurrent requests share one build, as `TopologyCache`'s do."""

    def __init__(
        self,
        *,
        generation: Callable[[], int],
        inputs: Callable[[], SummaryInputs],
        clock: Callable[[], float],
        off_loop: Callable[[Callable[[], bytes]], Awaitable[bytes]],
        max_age_s: float = 2.0,
    ) -> None:
        self._generation = generation
        self._inputs = inputs
        self._clock = clock
        self._off_loop = off_loop
        self._max_age_s = max_age_s
        self._held: tuple[int, float, asyncio.Future[bytes]] | None = None
        self.encoder = SummaryEncoder()
        self.builds = 0

    async def get(self) -> bytes:
        """The current summary."""
        generation, now = self._generation(), self._clock()
        held = self._held
        if held is not None and held[0] == generation and now - held[1] <= self._max_age_s:
            return await asyncio.shield(held[2])
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._held = (generation, now, future)
        snapshot, reserved = self._inputs()
        self.builds += 1

        def encode() -> bytes:
            body = self.encoder.body(snapshot, reserved=reserved, as_of=now)
            return json.dumps(body, separators=(",", ":")).encode()

        try:
            body = await self._off_loop(encode)
        except BaseException as err:
            if self._held is not None and self._held[2] is future:
                self._held = None  # the next request builds again (unless a newer build runs)
            future.set_exception(err)
            future.exception()  # retrieved: a failed build is reported to its own caller
            raise
        future.set_result(body)
        return body


def _flags(node: NodeState, facts: NodeFacts) -> int:
    flags = FLAG_DEGRADED if facts.degraded else 0
    if not node.placeable:
        flags |= FLAG_STALE if node.reason == "stale" else FLAG_UNPLACEABLE
    return flags


def holders(
    node: str,
    *,
    reservations: Iterable[Reservation],
    kubelet: GpuUse | None,
    pods: Iterable[PodUse],
    claims: Iterable[ClaimedDevice],
    live: Callable[[str], bool],
) -> list[dict[str, Any]]:
    """Who holds GPUs of `node`, one entry per holder: `kind` (reservation, pod, claim), `gpus`
    (the indices, when known) and what names it. A pod of a live reservation is listed under
    it (`reservation`); a pod the state only counts has `gpus` empty and `count` set.

    Takes the state's parts rather than the state, so it is a plain function over plain values
    (`aggregator.state.ClusterState` passes `reservations()`, `kubelet_use(node)`,
    `occupancy.pods(node)`, `claimed(node)`)."""
    out: list[dict[str, Any]] = []
    for r in reservations:
        gpus = r.gpus.get(node)
        if gpus:
            out.append(
                {
                    "kind": "reservation",
                    "id": r.id,
                    "job": r.job,
                    "owner": r.owner,
                    "committed": r.committed,
                    "expires_at": r.expires_at,
                    "gpus": sorted(gpus),
                }
            )
    located: dict[str, dict[str, Any]] = {}
    if kubelet is not None and kubelet.known:
        for gpu, h in sorted(kubelet.held.items()):
            entry = located.setdefault(
                h.pod_key,
                {"kind": "pod", "pod": h.pod_key, "source": "kubelet", "via": h.via, "gpus": []},
            )
            entry["gpus"].append(gpu)
    for p in pods:
        if p.key in located:
            located[p.key]["reservation"] = p.reservation
            continue
        located[p.key] = {
            "kind": "pod",
            "pod": p.key,
            "reservation": p.reservation if p.reservation and live(p.reservation) else "",
            "source": "recorded" if p.recorded else "counted",
            "gpus": sorted(p.recorded),
            "count": p.gpus,
        }
    out.extend(located[k] for k in sorted(located))
    for d in claims:
        out.append(
            {
                "kind": "claim",
                "claim": d.claim,
                "device": d.device,
                "whole": d.whole,
                "gpus": [] if d.gpu is None else [d.gpu],
            }
        )
    return out
