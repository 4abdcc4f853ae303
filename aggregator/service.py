"""The Placement gRPC service: a translator between `gputopo.v1` messages and the placement core.

Place, Commit, Release and Explain are decided by `gputopo.core.PlacementCore` (the search pool,
one reserving search at a time, the leadership gate, stored before answered); this module only
decodes each request into domain values, calls the core's one method for the verb, encodes what
it decided, and turns its typed refusals into gRPC statuses. The HTTP mirror
(`aggregator.http_placement`) calls the same translating methods, so both transports answer
alike. GetTopology and WatchTopology read the cluster state directly: they place nothing.

Errors: an invalid request ends with INVALID_ARGUMENT and the field path
(`request.groups[0].gpus_per_pod: must be at least 1`); an unknown reservation with NOT_FOUND.
A request that is valid but cannot be placed is not an error: the response says `placed: false`
with the reason and the rejected domains.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from functools import partial
from typing import TypeVar

import grpc

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.state import ClusterState
from gputopo.cluster import ClusterSnapshot
from gputopo.codec import (
    CodecError,
    cluster_to_proto,
    node_state_to_proto,
    request_from_proto,
    result_to_proto,
    timestamp,
)
from gputopo.core import Decision, InvalidRequestError, NotFoundError, PlacementCore, PlacementError
from gputopo.request import PlacementRequest, RequestError
from gputopo.reservations import Reservation
from gputopo.runtime.identity import caller_of_rpc
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc
from gputopo.v1 import topology_pb2 as tpb

__all__ = [
    "PlacementService",
    "cluster_message",
    "dump_facts",
    "dump_inputs",
]

# A watcher that falls this many events behind is told to resync rather than buffering forever.
_WATCH_QUEUE = 1024


def cluster_message(
    snapshot: ClusterSnapshot,
    state: ClusterState,
    *,
    nodes: list[str] | None = None,
    include_links: bool = True,
    as_of: float | None = None,
) -> tpb.ClusterTopology:
    """The cluster as a ClusterTopology message (`gputopo.codec.cluster`), with what only the
    state knows: node generations, last reports, and which held GPUs are still pending."""
    return dump_inputs(snapshot, state, nodes=nodes, include_links=include_links, as_of=as_of)()


def dump_facts(
    snapshot: ClusterSnapshot, state: ClusterState, nodes: Iterable[str] | None = None
) -> tuple[Callable[[str], tuple[int, float | None]], dict[str, set[int]]]:
    """What only the state knows, read now (on the loop): each node's (generation, last
    report), and the held GPUs of reservations not yet committed, per node."""
    held = state.held_gpus()
    pending: dict[str, set[int]] = {}
    for r in state.reservations():
        if not r.committed:
            for held_on, gpus in r.gpus.items():
                pending.setdefault(held_on, set()).update(gpus)
    reserved = {n: gpus & held.get(n, frozenset()) for n, gpus in pending.items()}
    known: dict[str, tuple[int, float | None]] = {}
    for name in nodes if nodes is not None else snapshot.nodes:
        rec = state.record(name)
        known[name] = (rec.generation, rec.last_report) if rec else (0, None)

    def facts(name: str) -> tuple[int, float | None]:
        return known.get(name, (0, None))

    return facts, reserved


def dump_inputs(
    snapshot: ClusterSnapshot,
    state: ClusterState,
    *,
    nodes: list[str] | None = None,
    include_links: bool = True,
    as_of: float | None = None,
) -> Callable[[], tpb.ClusterTopology]:
    """`cluster_message` in two halves: what the state knows is read now (on the loop, cheap);
    the returned function builds the message from that and the immutable snapshot alone, so it
    may run in a worker thread while the loop goes on (a dump of thousands of nodes takes a
    while)."""
    facts, reserved = dump_facts(snapshot, state, nodes)
    return partial(
        cluster_to_proto,
        snapshot,
        facts=facts,
        reserved=reserved,
        nodes=nodes,
        include_links=include_links,
        as_of=as_of,
    )


def _reservation_to_proto(r: Reservation) -> ppb.Reservation:
    msg = ppb.Reservation(id=r.id, committed=r.committed, owner=r.owner)
    if r.expires_at is not None:
        msg.expires_at.CopyFrom(timestamp(r.expires_at))
    return msg


def _request_of(msg: ppb.PlacementRequest) -> PlacementRequest:
    try:
        return request_from_proto(msg)
    except (CodecError, RequestError) as err:
        raise InvalidRequestError(f"request.{err}") from None


def _response(decision: Decision) -> ppb.PlaceResponse:
    resp = result_to_proto(decision.result)
    resp.topology_generation = decision.generation
    resp.decision_seconds = decision.seconds
    if decision.reservation is not None:
        # Encodes: the TTL is at most the maximum, which ttl_limits_problem keeps far inside
        # what a Timestamp carries, so the id is always returned for what is held.
        resp.reservation.CopyFrom(_reservation_to_proto(decision.reservation))
    return resp


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Out = TypeVar("_Out")


async def _answer(
    work: Callable[[_Req], Awaitable[_Resp]],
    request: _Req,
    context: grpc.aio.ServicerContext[_Req, _Resp],
) -> _Resp:
    """Run one call's work; a refusal ends the call with its status and message."""
    try:
        return await work(request)
    except PlacementError as err:
        await context.abort(grpc.StatusCode[err.code], err.message)


class PlacementService(pgrpc.PlacementServicer):
    """The Placement service over a `PlacementCore` and the cluster state it places against.

    `place`, `commit`, `release`, `explain` and `get_topology` take and return messages and
    raise the core's `PlacementError`s; the gRPC methods and the HTTP mirror call them.
    """

    def __init__(self, core: PlacementCore, state: ClusterState, *, clock: Callable[[], float]):
        self.core = core
        self._state = state
        self._clock = clock

    @property
    def state(self) -> ClusterState:
        """The cluster state the core places against."""
        return self._state

    async def place(self, request: ppb.PlaceRequest, *, caller: str = "") -> ppb.PlaceResponse:
        """Place (`PlacementCore.place`)."""
        ttl = None
        if request.HasField("reservation_ttl"):
            ttl = request.reservation_ttl.ToNanoseconds() / 1e9
        try:
            req = _request_of(request.request)
        except InvalidRequestError as err:
            raise self.core.refused(err) from None
        decision = await self.core.place(req, dry_run=request.dry_run, ttl_s=ttl, caller=caller)
        return _response(decision)

    async def commit(self, request: ppb.CommitRequest, *, caller: str = "") -> ppb.CommitResponse:
        """Commit (`PlacementCore.commit`)."""
        res = await self.core.commit(request.reservation_id, owner=request.owner, caller=caller)
        return ppb.CommitResponse(reservation=_reservation_to_proto(res))

    async def release(
        self, request: ppb.ReleaseRequest, *, caller: str = ""
    ) -> ppb.ReleaseResponse:
        """Release (`PlacementCore.release`)."""
        res = await self.core.release(request.reservation_id, caller=caller)
        return ppb.ReleaseResponse(released=True, gpus_freed=res.gpu_count)

    async def explain(self, request: ppb.ExplainRequest) -> ppb.PlaceResponse:
        """Explain (`PlacementCore.explain`): a request, or a reservation id."""
        subject = request.WhichOneof("subject")
        if subject == "reservation_id":
            return _response(await self.core.explain(request.reservation_id))
        if subject != "request":
            raise InvalidRequestError("subject: a request or a reservation_id is required")
        return _response(await self.core.explain(_request_of(request.request)))

    async def get_topology(self, request: ppb.GetTopologyRequest) -> tpb.ClusterTopology:
        """The cluster as the aggregator sees it now, built off the loop (`dump_inputs`)."""
        snapshot = self._state.snapshot()
        unknown = sorted(set(request.nodes) - set(snapshot.nodes))
        if unknown:
            raise NotFoundError(f"nodes: unknown node {unknown[0]!r}")
        build = dump_inputs(
            snapshot,
            self._state,
            nodes=list(request.nodes) or None,
            include_links=request.include_links,
            as_of=self._clock(),
        )
        return await self.core.off_loop(build)

    # --- gRPC -------------------------------------------------------------------------------

    async def Place(  # noqa: N802 - gRPC method name
        self,
        request: ppb.PlaceRequest,
        context: grpc.aio.ServicerContext[ppb.PlaceRequest, ppb.PlaceResponse],
    ) -> ppb.PlaceResponse:
        """See `place`."""
        return await _answer(partial(self.place, caller=caller_of_rpc(context)), request, context)

    async def Commit(  # noqa: N802
        self,
        request: ppb.CommitRequest,
        context: grpc.aio.ServicerContext[ppb.CommitRequest, ppb.CommitResponse],
    ) -> ppb.CommitResponse:
        """See `commit`."""
        work = partial(self.commit, caller=caller_of_rpc(context))
        return await _answer(work, request, context)

    async def Release(  # noqa: N802
        self,
        request: ppb.ReleaseRequest,
        context: grpc.aio.ServicerContext[ppb.ReleaseRequest, ppb.ReleaseResponse],
    ) -> ppb.ReleaseResponse:
        """See `release`."""
        work = partial(self.release, caller=caller_of_rpc(context))
        return await _answer(work, request, context)

    async def Explain(  # noqa: N802
        self,
        request: ppb.ExplainRequest,
        context: grpc.aio.ServicerContext[ppb.ExplainRequest, ppb.PlaceResponse],
    ) -> ppb.PlaceResponse:
        """See `explain`."""
        return await _answer(self.explain, request, context)

    async def GetTopology(  # noqa: N802
        self,
        request: ppb.GetTopologyRequest,
        context: grpc.aio.ServicerContext[ppb.GetTopologyRequest, tpb.ClusterTopology],
    ) -> tpb.ClusterTopology:
        """See `get_topology`."""
        return await _answer(self.get_topology, request, context)

    async def WatchTopology(  # noqa: N802
        self,
        request: ppb.WatchTopologyRequest,
        context: grpc.aio.ServicerContext[ppb.WatchTopologyRequest, ppb.TopologyEvent],
    ) -> AsyncIterator[ppb.TopologyEvent]:
        """Every node first (as NODE_UPDATED), then each change as it happens."""
        queue: asyncio.Queue[ChangeEvent] = asyncio.Queue(maxsize=_WATCH_QUEUE)
        overflow = asyncio.Event()

        def listener(event: ChangeEvent) -> None:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                overflow.set()

        unsubscribe = self._state.subscribe(listener)
        try:
            snapshot = self._state.snapshot()
            for name in snapshot.nodes:
                yield self._event(ppb.TopologyEvent.TYPE_NODE_UPDATED, name)
            while True:
                if overflow.is_set():
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "watcher fell behind; watch again from the start",
                    )
                event = await queue.get()
                yield self._event(_EVENT_TYPES[event.kind], event.node)
        finally:
            unsubscribe()

    def _event(self, kind: ppb.TopologyEvent.Type.ValueType, node: str) -> ppb.TopologyEvent:
        snapshot = self._state.snapshot()
        ev = ppb.TopologyEvent(type=kind, generation=snapshot.generation, node=node)
        if node in snapshot.nodes:
            state = snapshot.node(node)
            if not state.placeable and state.reason == "stale":
                ev.type = ppb.TopologyEvent.TYPE_NODE_STALE
            rec = self._state.record(node)
            ev.state.CopyFrom(
                node_state_to_proto(
                    state, generation=rec.generation if rec else 0, include_links=False
                )
            )
        return ev


_EVENT_TYPES: dict[ChangeKind, ppb.TopologyEvent.Type.ValueType] = {
    ChangeKind.NODE: ppb.TopologyEvent.TYPE_NODE_UPDATED,
    ChangeKind.LABELS: ppb.TopologyEvent.TYPE_NODE_UPDATED,
    ChangeKind.STALE: ppb.TopologyEvent.TYPE_NODE_STALE,
    ChangeKind.REMOVED: ppb.TopologyEvent.TYPE_NODE_REMOVED,
    ChangeKind.ALLOCATION: ppb.TopologyEvent.TYPE_ALLOCATION_CHANGED,
}
