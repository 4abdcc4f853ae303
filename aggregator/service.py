"""The Placement gRPC service: Place, Commit, Release, Explain, GetTopology, WatchTopology.

Atomicity: one asyncio loop owns the cluster state and each Place runs from snapshot to
reservation without awaiting in between, so two concurrent Place calls can never be handed the
same GPU; the second one sees the first one's reservation in its snapshot.

Errors: an invalid request ends with INVALID_ARGUMENT and the field path
(`request.groups[0].gpus_per_pod: must be at least 1`); an unknown reservation with NOT_FOUND.
A request that is valid but cannot be placed is not an error: the response says `placed: false`
with the reason and the rejected domains.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import grpc

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.promises import KubePromises
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
from gputopo.placement import DEFAULT_POLICY, PlacementResult, UnknownPolicyError, place
from gputopo.request import PlacementRequest, RequestError
from gputopo.reservations import Reservation, ReservationError
from gputopo.runtime.identity import caller_of_rpc
from gputopo.runtime.kube import KubeError
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc
from gputopo.v1 import topology_pb2 as tpb

__all__ = [
    "DEFAULT_RESERVATION_TTL_S",
    "MAX_RESERVATION_TTL_S",
    "PlacementError",
    "PlacementService",
    "cluster_message",
    "ttl_limits_problem",
]

log = logging.getLogger(__name__)

DEFAULT_RESERVATION_TTL_S = 60.0
# The longest a client may hold GPUs without committing them (`--max-reservation-ttl`): a
# reservation is a promise between Place and the bind, minutes at most. Bounding it also keeps
# every expiry a timestamp protobuf can carry, so no reservation is made that cannot be named.
MAX_RESERVATION_TTL_S = 3600.0
# Past this no configured maximum is accepted: every expiry stays far inside what a protobuf
# Timestamp carries, so a reservation is never made whose answer cannot name it.
_LONGEST_MAX_TTL_S = 1e9


def ttl_limits_problem(default_ttl_s: float, max_ttl_s: float) -> str | None:
    """What is wrong with a default and a maximum reservation TTL (one line naming the flag),
    or None. `gputopo aggregator` prints it; `PlacementService` refuses to start with it."""
    if not 0 < max_ttl_s < _LONGEST_MAX_TTL_S:
        return f"--max-reservation-ttl: must be between 0 and {_LONGEST_MAX_TTL_S:g} seconds"
    if not 0 < default_ttl_s <= max_ttl_s:
        return (
            "--reservation-ttl: must be positive and at most --max-reservation-ttl"
            f" ({max_ttl_s:g} s)"
        )
    return None


# A placement search longer than this answers DEADLINE_EXCEEDED (the aggregator's
# --search-deadline): no caller waits forever, and the search pool does not fill up.
DEFAULT_SEARCH_DEADLINE_S = 20.0
# Searches run again (on a fresh snapshot) when their GPUs were taken while they ran.
_SEARCH_ATTEMPTS = 3

# How long a call that reserves waits for reservations to be restored after a start or failover.
_READY_WAIT_S = 10.0
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


def _who(caller: str) -> str:
    return repr(caller) if caller else "a plain-text (unauthenticated) caller"


# Upper bounds (seconds) of the placement decision-time histogram.
PLACEMENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class PlacementStats:
    """What Place, Commit and Release decided, for metrics (`aggregator.metrics`)."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (outcome, policy)
    rejections: Counter[str] = field(default_factory=Counter)  # gRPC status name
    buckets: list[int] = field(default_factory=lambda: [0] * len(PLACEMENT_BUCKETS))
    count: int = 0
    total_s: float = 0.0

    def decided(self, outcome: str, policy: str, seconds: float) -> None:
        """One search's outcome (`placed`, `unplaced`, `dry_run`) and how long it took."""
        self.decisions[(outcome, policy)] += 1
        self.count += 1
        self.total_s += seconds
        for i, bound in enumerate(PLACEMENT_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1


class PlacementError(Exception):
    """A call that cannot be served: `status` is the gRPC status name, `message` says why (with
    the field path for a bad request). The HTTP mirror maps the same errors to 400 and 404."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Out = TypeVar("_Out")


async def _answer(
    work: Callable[[_Req], _Resp | Awaitable[_Resp]],
    request: _Req,
    context: grpc.aio.ServicerContext[_Req, _Resp],
) -> _Resp:
    """Run one call's work; a `PlacementError` ends the call with its status and message."""
    try:
        answer = work(request)
        if inspect.isawaitable(answer):
            return await answer
        return answer
    except PlacementError as err:
        await context.abort(err.status, err.message)


class PlacementService(pgrpc.PlacementServicer):
    """Serves placement decisions against the aggregator's cluster state.

    The transport-free methods (`place`, `commit`, `release`, `explain`, `get_topology`) do the
    work and raise `PlacementError`; the gRPC methods and the HTTP mirror
    (`aggregator.http_placement`) only translate. Searches and topology dumps run in a small
    thread pool on immutable snapshots (`_search`, `off_loop`), so the event loop keeps serving
    reports, heartbeats and /healthz meanwhile; a reservation is made back on the loop, on GPUs
    checked to be still free.
    """

    def __init__(
        self,
        state: ClusterState,
        *,
        clock: Callable[[], float],
        default_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        max_ttl_s: float = MAX_RESERVATION_TTL_S,
        default_policy: str | None = None,
        promises: KubePromises | None = None,
        may_reserve: Callable[[], bool] = lambda: True,
        search_workers: int = 2,
        search_deadline_s: float = DEFAULT_SEARCH_DEADLINE_S,
    ) -> None:
        self._state = state
        self._clock = clock
        if (problem := ttl_limits_problem(default_ttl_s, max_ttl_s)) is not None:
            raise ValueError(problem)
        self._ttl = default_ttl_s
        self._max_ttl = max_ttl_s
        self._policy = default_policy
        self.promises = promises
        self._may_reserve = may_reserve
        # Searches run here, off the event loop (`_search`); the pool bounds how many at once.
        self._pool = ThreadPoolExecutor(max_workers=search_workers, thread_name_prefix="search")
        self._deadline_s = search_deadline_s
        self.deadlines = 0  # searches that ran past the deadline
        self.researches = 0  # searches run again because their GPUs were taken meanwhile
        self._reserving = asyncio.Lock()
        self.stats = PlacementStats()
        self.denied = 0  # Commit/Release refused to a caller that does not hold the reservation
        # Set once reservations are restored (at once without a durable store): until then
        # no Place that reserves, Commit or Release is answered.
        self.ready = asyncio.Event()
        if promises is None:
            self.ready.set()

    @property
    def state(self) -> ClusterState:
        """The cluster state this service places against."""
        return self._state

    def _parse(self, request: ppb.PlacementRequest) -> tuple[PlacementRequest, str | None]:
        try:
            req = request_from_proto(request)
        except (CodecError, RequestError) as err:
            raise PlacementError(grpc.StatusCode.INVALID_ARGUMENT, f"request.{err}") from None
        return req, req.policy or self._policy

    async def _search(
        self, snapshot: ClusterSnapshot, req: PlacementRequest, policy: str | None
    ) -> tuple[PlacementResult, float]:
        """`gputopo.placement.place` in the search pool, never on the event loop: a search over
        thousands of nodes must not stall heartbeats, /healthz or other calls. The snapshot is
        immutable, so the thread reads nothing the loop changes. Past the deadline the caller
        gets DEADLINE_EXCEEDED (the thread finishes on its own; the pool bounds how many run)."""
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._pool, partial(place, snapshot, req, policy=policy))
        try:
            return await asyncio.wait_for(work, self._deadline_s)
        except TimeoutError:
            self.deadlines += 1
            raise PlacementError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"request: the placement search took longer than {self._deadline_s:g} s"
                " (--search-deadline); ask for less, or for fewer candidates",
            ) from None
        except RequestError as err:
            raise PlacementError(grpc.StatusCode.INVALID_ARGUMENT, f"request.{err}") from None
        except UnknownPolicyError as err:
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT, f"request.policy: {err}"
            ) from None

    async def _decide(
        self, request: ppb.PlacementRequest
    ) -> tuple[PlacementResult, float, ClusterSnapshot]:
        req, policy = self._parse(request)
        snapshot = self._state.snapshot()
        result, seconds = await self._search(snapshot, req, policy)
        return result, seconds, snapshot

    def _still_free(self, result: PlacementResult) -> bool:
        """Whether every GPU a search chose (on an older snapshot) is still free and on a live
        node: the search ran off the loop while reports and other calls went on."""
        now = self._state.snapshot()
        return all(
            node in now.nodes and gpus <= now.node(node).free
            for node, gpus in result.allocation().items()
        )

    def close(self) -> None:
        """Stop the search pool (searches running finish on their own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _response(
        self, result: PlacementResult, snapshot: ClusterSnapshot, seconds: float
    ) -> ppb.PlaceResponse:
        uuids: dict[str, tuple[str, ...]] = {}
        nics: dict[tuple[str, int], str] = {}
        for node in result.allocation():
            if node not in snapshot.nodes:
                continue
            topo = snapshot.node(node).topology
            uuids[node] = tuple(g.uuid for g in topo.gpus)
            for g in range(topo.gpu_count):
                near = topo.nearest_nics(g)
                if near:
                    nics[(node, g)] = topo.nics[near[0]].name
        resp = result_to_proto(result, uuids=uuids, nics=nics)
        resp.topology_generation = snapshot.generation
        resp.decision_seconds = seconds
        return resp

    # --- the work, free of any transport ----------------------------------------------------

    def _ttl_of(self, request: ppb.PlaceRequest) -> float:
        ttl = self._ttl
        if request.HasField("reservation_ttl"):
            ttl = request.reservation_ttl.ToNanoseconds() / 1e9
            if ttl <= 0:
                raise PlacementError(
                    grpc.StatusCode.INVALID_ARGUMENT, "reservation_ttl: must be positive"
                )
            if ttl > self._max_ttl:
                raise PlacementError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"reservation_ttl: is {ttl:g} s, at most {self._max_ttl:g} s"
                    " (the aggregator's --max-reservation-ttl); commit to hold GPUs longer",
                )
        return ttl

    async def place(self, request: ppb.PlaceRequest, *, caller: str = "") -> ppb.PlaceResponse:
        """Place a request; unless dry_run, hold its GPUs for the reservation TTL, for
        `caller` (who the transport proved the client is) alone to commit or release.

        The search runs off the loop on a snapshot; the reservation is made back on the loop,
        after checking that the GPUs chosen are still free (another call may have taken them,
        a node may have gone stale meanwhile). If not, the search runs again on a fresh
        snapshot, a few times at most, so a reservation is always on free GPUs."""
        ttl = self._ttl_of(request)
        req, policy = self._parse(request.request)
        if request.dry_run:
            return await self._place(request, req, policy, ttl, caller)
        # One reserving search at a time: each starts from a snapshot that holds every earlier
        # reservation, so concurrent callers never race for the same GPUs (searches hold the
        # GIL anyway, so little parallelism is lost); dry runs do not wait.
        async with self._reserving:
            return await self._place(request, req, policy, ttl, caller)

    async def _place(
        self,
        request: ppb.PlaceRequest,
        req: PlacementRequest,
        policy: str | None,
        ttl: float,
        caller: str,
    ) -> ppb.PlaceResponse:
        for _ in range(_SEARCH_ATTEMPTS):
            snapshot = self._state.snapshot()
            result, seconds = await self._search(snapshot, req, policy)
            if request.dry_run or not result.placed or self._still_free(result):
                break
            self.researches += 1
        else:
            raise PlacementError(
                grpc.StatusCode.ABORTED,
                f"request: the GPUs chosen were taken while searching, {_SEARCH_ATTEMPTS} times;"
                " try again",
            )
        resp = self._response(result, snapshot, seconds)
        outcome = "dry_run" if request.dry_run else ("placed" if result.placed else "unplaced")
        self.stats.decided(outcome, policy or DEFAULT_POLICY, seconds)
        if result.placed and not request.dry_run:
            reservation = self._state.reserve(
                result, ttl_s=ttl, job=request.request.job, holder=caller
            )
            # Encodes: the TTL is at most the maximum, which ttl_limits_problem keeps far inside
            # what a Timestamp carries, so the id is always returned for what is held.
            resp.reservation.CopyFrom(_reservation_to_proto(reservation))
        log.info(
            "place job=%r placed=%s gpus=%d in %.1f ms%s",
            request.request.job,
            result.placed,
            result.gpu_count,
            seconds * 1e3,
            "" if result.placed else f": {result.reason}",
        )
        return resp

    def commit(self, request: ppb.CommitRequest, *, caller: str = "") -> ppb.CommitResponse:
        """Keep a reservation until it is released."""
        self._check_holder(request.reservation_id, caller)
        try:
            res = self._state.commit(request.reservation_id, owner=request.owner)
        except ReservationError:
            raise PlacementError(
                grpc.StatusCode.NOT_FOUND,
                f"reservation_id: no live reservation {request.reservation_id!r}"
                " (unknown, released or expired)",
            ) from None
        return ppb.CommitResponse(reservation=_reservation_to_proto(res))

    def release(self, request: ppb.ReleaseRequest, *, caller: str = "") -> ppb.ReleaseResponse:
        """Free a reservation's GPUs."""
        self._check_holder(request.reservation_id, caller)
        try:
            res = self._state.release(request.reservation_id)
        except ReservationError:
            raise PlacementError(
                grpc.StatusCode.NOT_FOUND,
                f"reservation_id: no live reservation {request.reservation_id!r}",
            ) from None
        return ppb.ReleaseResponse(released=True, gpus_freed=res.gpu_count)

    def _check_holder(self, rid: str, caller: str) -> None:
        """Only who made a reservation may commit or release it. An id is no secret (it sits in
        pod annotations and topology dumps); the caller's certificate is. GPUs the inventory
        says are used are held for as long as it says so, whoever asks."""
        held = self._state.reservation(rid)
        if held is None:
            return
        if held.from_inventory:
            raise PlacementError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"reservation_id: {rid!r} holds GPUs the inventory marks as used;"
                " change the inventory to free them",
            )
        if held.holder != caller:
            self.denied += 1
            log.warning(
                "reservation %s: %s may not change it; it belongs to %s",
                rid,
                _who(caller),
                _who(held.holder),
            )
            raise PlacementError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"reservation_id: {rid!r} was made by another caller; only"
                f" {_who(held.holder)} may commit or release it",
            )

    # --- the same, kept: what is promised is stored before it is said (aggregator.promises) ----

    async def _book_is_current(self) -> None:
        """Only the leader's book, once restored, may answer about reservations: a replica that
        answered before its restore would call a live reservation unknown."""
        if not self._may_reserve():
            raise PlacementError(
                grpc.StatusCode.UNAVAILABLE,
                "this replica is not the leader: reserve, commit, release and explain"
                " reservations through the leader's Service",
            )
        try:
            await asyncio.wait_for(self.ready.wait(), _READY_WAIT_S)
        except TimeoutError:
            raise PlacementError(
                grpc.StatusCode.UNAVAILABLE, "reservations are still being restored"
            ) from None

    async def _refusals_counted(self, work: Awaitable[_Out]) -> _Out:
        """Place, Commit and Release refusals counted by status here, once, whichever
        transport (gRPC, the HTTP mirror) asked."""
        try:
            return await work
        except PlacementError as err:
            self.stats.rejections[err.status.name] += 1
            raise

    async def place_kept(self, request: ppb.PlaceRequest, *, caller: str = "") -> ppb.PlaceResponse:
        """`place`, with the reservation stored before the answer names it."""
        return await self._refusals_counted(self._place_kept(request, caller))

    async def commit_kept(
        self, request: ppb.CommitRequest, *, caller: str = ""
    ) -> ppb.CommitResponse:
        """`commit`, stored before it is answered."""
        return await self._refusals_counted(self._commit_kept(request, caller))

    async def release_kept(
        self, request: ppb.ReleaseRequest, *, caller: str = ""
    ) -> ppb.ReleaseResponse:
        """`release`, the stored reservation deleted first (a failed delete frees nothing)."""
        return await self._refusals_counted(self._release_kept(request, caller))

    async def _place_kept(self, request: ppb.PlaceRequest, caller: str) -> ppb.PlaceResponse:
        if request.dry_run:
            return await self.place(request, caller=caller)
        await self._book_is_current()
        resp = await self.place(request, caller=caller)
        if self.promises is not None and resp.HasField("reservation"):
            held = self._state.reservation(resp.reservation.id)
            if held is not None:
                try:
                    await self.promises.put(held)
                except KubeError as err:
                    with contextlib.suppress(ReservationError):
                        self._state.release(held.id)
                    raise PlacementError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"the reservation could not be stored, so it was not made: {err}",
                    ) from None
        return resp

    async def _commit_kept(self, request: ppb.CommitRequest, caller: str) -> ppb.CommitResponse:
        await self._book_is_current()
        resp = self.commit(request, caller=caller)
        held = self._state.reservation(request.reservation_id)
        if self.promises is not None and held is not None:
            try:
                await self.promises.put(held)
            except KubeError as err:
                raise PlacementError(
                    grpc.StatusCode.UNAVAILABLE, f"the commitment could not be stored: {err}"
                ) from None
        return resp

    async def _release_kept(self, request: ppb.ReleaseRequest, caller: str) -> ppb.ReleaseResponse:
        await self._book_is_current()
        self._check_holder(request.reservation_id, caller)
        if self.promises is not None and self._state.reservation(request.reservation_id):
            try:
                await self.promises.delete(request.reservation_id)
            except KubeError as err:
                raise PlacementError(
                    grpc.StatusCode.UNAVAILABLE, f"the release could not be stored: {err}"
                ) from None
        return self.release(request, caller=caller)

    async def explain_kept(self, request: ppb.ExplainRequest) -> ppb.PlaceResponse:
        """`explain`; about a reservation, only from the current book."""
        if request.WhichOneof("subject") == "reservation_id":
            await self._book_is_current()
        return await self.explain(request)

    async def explain(self, request: ppb.ExplainRequest) -> ppb.PlaceResponse:
        """A dry run with its reasons, or the figures of an existing reservation."""
        subject = request.WhichOneof("subject")
        if subject == "reservation_id":
            res = self._state.reservation(request.reservation_id)
            if res is None or res.result is None:
                raise PlacementError(
                    grpc.StatusCode.NOT_FOUND,
                    f"reservation_id: no live reservation {request.reservation_id!r}",
                )
            resp = self._response(res.result, self._state.snapshot(), 0.0)
            resp.reservation.CopyFrom(_reservation_to_proto(res))
            return resp
        if subject != "request":
            raise PlacementError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "subject: a request or a reservation_id is required",
            )
        result, seconds, snapshot = await self._decide(request.request)
        return self._response(result, snapshot, seconds)

    async def get_topology(self, request: ppb.GetTopologyRequest) -> tpb.ClusterTopology:
        """The cluster as the aggregator sees it now, built off the loop (`dump_inputs`)."""
        snapshot = self._state.snapshot()
        unknown = sorted(set(request.nodes) - set(snapshot.nodes))
        if unknown:
            raise PlacementError(grpc.StatusCode.NOT_FOUND, f"nodes: unknown node {unknown[0]!r}")
        build = dump_inputs(
            snapshot,
            self._state,
            nodes=list(request.nodes) or None,
            include_links=request.include_links,
            as_of=self._clock(),
        )
        return await self.off_loop(build)

    async def off_loop(self, work: Callable[[], _Out]) -> _Out:
        """Run CPU work in the search pool, not on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    # --- gRPC -------------------------------------------------------------------------------

    async def Place(  # noqa: N802 - gRPC method name
        self,
        request: ppb.PlaceRequest,
        context: grpc.aio.ServicerContext[ppb.PlaceRequest, ppb.PlaceResponse],
    ) -> ppb.PlaceResponse:
        """See `place_kept`."""
        work = partial(self.place_kept, caller=caller_of_rpc(context))
        return await _answer(work, request, context)

    async def Commit(  # noqa: N802
        self,
        request: ppb.CommitRequest,
        context: grpc.aio.ServicerContext[ppb.CommitRequest, ppb.CommitResponse],
    ) -> ppb.CommitResponse:
        """See `commit_kept`."""
        work = partial(self.commit_kept, caller=caller_of_rpc(context))
        return await _answer(work, request, context)

    async def Release(  # noqa: N802
        self,
        request: ppb.ReleaseRequest,
        context: grpc.aio.ServicerContext[ppb.ReleaseRequest, ppb.ReleaseResponse],
    ) -> ppb.ReleaseResponse:
        """See `release_kept`."""
        work = partial(self.release_kept, caller=caller_of_rpc(context))
        return await _answer(work, request, context)

    async def Explain(  # noqa: N802
        self,
        request: ppb.ExplainRequest,
        context: grpc.aio.ServicerContext[ppb.ExplainRequest, ppb.PlaceResponse],
    ) -> ppb.PlaceResponse:
        """See `explain_kept`."""
        return await _answer(self.explain_kept, request, context)

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
