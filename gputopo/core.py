"""The placement core: Place, Commit, Release and Explain on domain types, free of any transport.

The aggregator's gRPC servicer and HTTP mirror (`aggregator.service`, `aggregator.http_placement`)
only translate messages to and from these calls; a simulator drives the same core with a
`MemoryStore` and no Kubernetes:

    core = PlacementCore(state=state, store=MemoryStore(), clock=clock)
    decision = await core.place(request, ttl_s=60.0, caller="sim")
    await core.commit(decision.reservation.id, caller="sim")

`state` is anything with a `snapshot()` and a `book` (`PlacementState`: the aggregator's
`ClusterState`, or a simulator's own). The core owns what every transport needs alike:

1. **The search pool.** A search runs in a small thread pool on an immutable snapshot, so the
   event loop keeps serving reports, heartbeats and health checks meanwhile; past the deadline
   the caller gets `DeadlineExceededError`.
2. **One reserving search at a time.** A search awaits the pool, so the loop may run other
   calls before it returns: two reserving searches started together would each see the other's
   GPUs as free. Reserving calls therefore take a lock, and back on the loop the chosen GPUs are
   checked to be still free (reports and expiry go on meanwhile); if not, the search runs again
   on a fresh snapshot, a few times at most. Dry runs neither wait nor reserve.
3. **The leadership gate.** Only the leader's book, once restored from the store, may answer
   about reservations (`leading`, `ready`): a replica that answered before its restore would
   call a live reservation unknown and hand its GPUs out again.
4. **Stored before answered.** Every reservation, commitment and release goes through the
   `ReservationStore` before the caller hears of it: a Place whose write fails holds nothing and
   says `UnavailableError`; a Release whose delete fails frees nothing.
5. **Holders.** Only the caller who made a reservation (as the transport authenticated it) may
   commit or release it; GPUs the inventory marks as used are no caller's to free.

Refusals are typed (`PlacementError` and its subclasses, each with the canonical status name a
transport answers with) and counted once here, whichever transport asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import ClassVar, Protocol, TypeVar

from gputopo.cluster import ClusterSnapshot
from gputopo.placement import DEFAULT_POLICY, UnknownPolicyError, place
from gputopo.placement.pernode import fit_on_nodes, scores
from gputopo.placement.result import PlacementResult
from gputopo.pods import PodAsk
from gputopo.request import Group, PlacementRequest, RequestError
from gputopo.reservations import (
    Reservation,
    ReservationBook,
    ReservationError,
    ReservationStore,
    StoreError,
)

__all__ = [
    "DEFAULT_RESERVATION_TTL_S",
    "DEFAULT_SEARCH_DEADLINE_S",
    "MAX_RESERVATION_TTL_S",
    "PLACEMENT_BUCKETS",
    "ContendedError",
    "DeadlineExceededError",
    "Decision",
    "InvalidRequestError",
    "NotFoundError",
    "NotLeaderError",
    "PermissionDeniedError",
    "PlacementCore",
    "PlacementError",
    "PlacementState",
    "PlacementStats",
    "UnavailableError",
    "ttl_limits_problem",
    "with_nics",
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
# A placement search longer than this answers DEADLINE_EXCEEDED (the aggregator's
# --search-deadline): no caller waits forever, and the search pool does not fill up.
DEFAULT_SEARCH_DEADLINE_S = 20.0
# Searches run again (on a fresh snapshot) when their GPUs were taken while they ran.
_SEARCH_ATTEMPTS = 3
# How long a call that reserves waits for reservations to be restored after a start or failover.
_READY_WAIT_S = 10.0
# Upper bounds (seconds) of the placement decision-time histogram.
PLACEMENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_Out = TypeVar("_Out")


def ttl_limits_problem(default_ttl_s: float, max_ttl_s: float) -> str | None:
    """What is wrong with a default and a maximum reservation TTL (one line naming the flag),
    or None. `gputopo aggregator` prints it; `PlacementCore` refuses to start with it."""
    if not 0 < max_ttl_s < _LONGEST_MAX_TTL_S:
        return f"--max-reservation-ttl: must be between 0 and {_LONGEST_MAX_TTL_S:g} seconds"
    if not 0 < default_ttl_s <= max_ttl_s:
        return (
            "--reservation-ttl: must be positive and at most --max-reservation-ttl"
            f" ({max_ttl_s:g} s)"
        )
    return None


# --- typed refusals ----------------------------------------------------------------------


class PlacementError(Exception):
    """A call that cannot be served. `code` is the canonical status name a transport answers
    with (gRPC's status, the HTTP mirror's `code`); `message` says why, with the field path for
    a bad request."""

    code: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(PlacementError):
    """The request names a field that is wrong (`message` starts with its path)."""

    code = "INVALID_ARGUMENT"


class NotFoundError(PlacementError):
    """No live reservation (or node) of that name."""

    code = "NOT_FOUND"


class PermissionDeniedError(PlacementError):
    """The caller may not change this reservation."""

    code = "PERMISSION_DENIED"


class UnavailableError(PlacementError):
    """Not now: reservations are being restored, or the store did not take a write."""

    code = "UNAVAILABLE"


class NotLeaderError(UnavailableError):
    """This replica does not lead: ask the leader."""


class DeadlineExceededError(PlacementError):
    """The search ran past the deadline."""

    code = "DEADLINE_EXCEEDED"


class ContendedError(PlacementError):
    """The GPUs chosen were taken while searching, every time: try again."""

    code = "ABORTED"


# --- what the core works on and answers --------------------------------------------------


class PlacementState(Protocol):
    """What the core needs of a cluster state: immutable snapshots whose free GPUs leave out
    what the book holds, and the book itself."""

    @property
    def book(self) -> ReservationBook:
        """The reservations (their changes move the snapshot's free GPUs)."""
        ...

    def snapshot(self) -> ClusterSnapshot:
        """The cluster now."""
        ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What Place or Explain decided: the result (each pod with its GPUs' UUIDs and nearest
    NICs, `with_nics`), the topology generation it was decided on, how long the search took,
    and the reservation that holds the GPUs, if any."""

    result: PlacementResult
    generation: int
    seconds: float
    reservation: Reservation | None = None


def with_nics(result: PlacementResult, snapshot: ClusterSnapshot) -> PlacementResult:
    """The result with each pod's GPU UUIDs and, per GPU, the NIC on its best PCIe path (the
    first when tied; "" where a GPU has none), as the snapshot's topologies say. Pods on a node
    the snapshot no longer has keep neither."""
    pods = []
    for p in result.pods:
        if p.node not in snapshot.nodes:
            pods.append(p)
            continue
        topo = snapshot.node(p.node).topology
        nics = []
        for g in p.gpus:
            near = topo.nearest_nics(g) if g < topo.gpu_count else ()
            nics.append(topo.nics[near[0]].name if near else "")
        uuids = tuple(topo.gpus[g].uuid for g in p.gpus if g < topo.gpu_count)
        pods.append(replace(p, uuids=uuids, nics=tuple(nics)))
    return replace(result, pods=tuple(pods))


@dataclass(slots=True)
class PlacementStats:
    """What Place, Commit and Release decided, for metrics (`aggregator.metrics`)."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (outcome, policy)
    rejections: Counter[str] = field(default_factory=Counter)  # status name
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


def _group(ask: PodAsk) -> Group:
    return Group("pod", gpus_per_pod=ask.gpus, pattern=ask.pattern, message_bytes=ask.message_bytes)


def _who(caller: str) -> str:
    return repr(caller) if caller else "a plain-text (unauthenticated) caller"


class PlacementCore:
    """Place, Commit, Release and Explain (see the module docstring).

    `store`: where promises are kept (None: nowhere, a restart forgets them). `restored`: whether
    the book already holds what the store holds; False (a durable store that a new leader must
    read first) makes reserving calls wait for `restore()`. `leading`: whether this replica may
    answer about reservations now.
    """

    def __init__(
        self,
        *,
        state: PlacementState,
        clock: Callable[[], float],
        store: ReservationStore | None = None,
        restored: bool = True,
        default_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        max_ttl_s: float = MAX_RESERVATION_TTL_S,
        default_policy: str | None = None,
        leading: Callable[[], bool] = lambda: True,
        search_workers: int = 2,
        search_deadline_s: float = DEFAULT_SEARCH_DEADLINE_S,
    ) -> None:
        if (problem := ttl_limits_problem(default_ttl_s, max_ttl_s)) is not None:
            raise ValueError(problem)
        self.state = state
        self.store = store
        self._clock = clock
        self._ttl = default_ttl_s
        self._max_ttl = max_ttl_s
        self._policy = default_policy
        self._leading = leading
        # Searches run here, off the event loop (`_search`); the pool bounds how many at once.
        self._pool = ThreadPoolExecutor(max_workers=search_workers, thread_name_prefix="search")
        self._deadline_s = search_deadline_s
        self._reserving = asyncio.Lock()
        self.stats = PlacementStats()
        self.deadlines = 0  # searches that ran past the deadline
        self.researches = 0  # searches run again because their GPUs were taken meanwhile
        self.denied = 0  # Commit/Release refused to a caller that does not hold the reservation
        # Set once reservations are restored: until then no Place that reserves, Commit,
        # Release or Explain of a reservation is answered.
        self.ready = asyncio.Event()
        if restored:
            self.ready.set()

    @property
    def book(self) -> ReservationBook:
        """The state's reservation book."""
        return self.state.book

    def close(self) -> None:
        """Stop the search pool (searches running finish on their own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, work: Callable[[], _Out]) -> _Out:
        """Run CPU work in the search pool, not on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    # --- the verbs ----------------------------------------------------------------------

    async def place(
        self,
        request: PlacementRequest,
        *,
        dry_run: bool = False,
        ttl_s: float | None = None,
        caller: str = "",
    ) -> Decision:
        """Place a request; unless `dry_run`, hold its GPUs for `ttl_s` (the default TTL when
        None), for `caller` (who the transport proved the client is) alone to commit or
        release, stored before this returns."""
        return await self._counted(self._place(request, dry_run, ttl_s, caller))

    async def commit(self, rid: str, *, owner: str = "", caller: str = "") -> Reservation:
        """Keep a reservation until it is released; stored before this returns."""
        return await self._counted(self._commit(rid, owner, caller))

    async def release(self, rid: str, *, caller: str = "") -> Reservation:
        """Free a reservation's GPUs: the stored one is deleted first (a failed delete frees
        nothing). Returns what was released."""
        return await self._counted(self._release(rid, caller))

    async def explain(self, subject: PlacementRequest | str) -> Decision:
        """A dry run of a request with its reasons, or (a reservation id) the figures of a live
        reservation, from the current book only."""
        if isinstance(subject, str):
            await self._book_is_current()
            res = self.book.reservation(subject)
            if res is None or res.result is None:
                raise NotFoundError(f"reservation_id: no live reservation {subject!r}")
            snapshot = self.state.snapshot()
            return Decision(with_nics(res.result, snapshot), snapshot.generation, 0.0, res)
        snapshot = self.state.snapshot()
        result, seconds = await self._search(snapshot, subject)
        return Decision(with_nics(result, snapshot), snapshot.generation, seconds)

    # --- one pod at a time: the scheduler extender's questions ---------------------------

    def judge(self, ask: PodAsk, names: list[str]) -> dict[str, str]:
        """Node -> "" when the pod may go there, else the reason it may not (extender filter).

        A pod of a reservation may go only where the reservation placed it; any other pod is
        judged per node on its own (`gputopo.placement.pernode`)."""
        if ask.gpus == 0:
            return dict.fromkeys(names, "")
        pinned = self._reserved_nodes(ask)
        if pinned is not None:
            rid = ask.reservation
            why = (
                f"reservation {rid} placed this pod elsewhere"
                if pinned
                else f"reservation {rid} is unknown, released or expired"
            )
            return {n: "" if n in pinned else why for n in names}
        fits = fit_on_nodes(self.state.snapshot(), names, _group(ask), island=ask.island)
        return {f.node: "" if f.fits else f.reason for f in fits}

    def rank(self, ask: PodAsk, names: list[str]) -> dict[str, int]:
        """Node -> score, 0 to 10 (extender prioritize); nodes left out score 0."""
        if ask.gpus == 0:
            return {}
        pinned = self._reserved_nodes(ask)
        if pinned is not None:
            return {n: 10 for n in names if n in pinned}
        fits = fit_on_nodes(self.state.snapshot(), names, _group(ask), island=ask.island)
        return dict(scores(fits))

    def _reserved_nodes(self, ask: PodAsk) -> set[str] | None:
        """The nodes a pod's reservation chose for it (None when it names none; empty when the
        reservation is unknown or expired, so the pod waits rather than lands anywhere)."""
        if not ask.reservation:
            return None
        res = self.book.reservation(ask.reservation)
        if res is None or res.result is None:
            return set()
        return {
            p.node
            for p in res.result.pods
            if (ask.group is None or p.group == ask.group)
            and (ask.replica is None or str(p.replica) == ask.replica)
            and (ask.pod is None or str(p.pod) == ask.pod)
        }

    # --- restore and housekeeping --------------------------------------------------------

    async def restore(self, *, settle: Callable[[], Awaitable[object]] | None = None) -> int:
        """Make the book what the store holds, then let reserving calls in; returns how many
        were restored. Retries until the store answers: answering before would hand out GPUs
        already promised. Without a store there is nothing to restore. Holds the store never
        had (the inventory's `used` GPUs) are kept. `settle`, when given, is awaited before
        the gate opens (the aggregator waits for the pod watcher's first list: what bound pods
        hold is not free)."""
        if self.store is None:
            self.ready.set()
            return 0
        attempt = 0
        while True:
            try:
                stored = await self.store.load(now=self._clock())
                break
            except StoreError as err:
                delay = min(0.5 * 2**attempt, 10.0)
                attempt += 1
                log.warning("cannot load stored reservations (%s); again in %.1fs", err, delay)
                await asyncio.sleep(delay)
        keep = {r.id for r in stored}
        for old in self.book.reservations():
            # The store speaks only for what Place made: releasing every id it did not return
            # handed out the inventory's `used` GPUs (issue 25).
            if old.id not in keep and not old.from_inventory:
                self.book.release(old.id)  # released or expired while another replica led
        self.book.restore(stored)
        if settle is not None:
            await settle()
        self.ready.set()
        return len(stored)

    def demote(self) -> None:
        """Another replica leads now: with a store, restore afresh before answering again."""
        if self.store is not None:
            self.ready.clear()

    async def sync(self) -> int:
        """Expired reservations leave the store too (failed deletes are retried next time);
        returns how many went. Only the leader, once restored, writes."""
        if self.store is None or not self._leading() or not self.ready.is_set():
            return 0
        try:
            return await self.store.sync(r.id for r in self.book.reservations())
        except StoreError as err:
            log.warning("cannot delete expired reservations yet: %s", err)
            return 0

    # --- the work ------------------------------------------------------------------------

    def refused(self, err: PlacementError) -> PlacementError:
        """Count a refusal of Place, Commit or Release that a transport made before calling
        (a request it could not decode) as the core counts its own; returns it to raise."""
        self.stats.rejections[err.code] += 1
        return err

    async def _counted(self, work: Awaitable[_Out]) -> _Out:
        """Refusals counted by status here, once, whichever transport asked."""
        try:
            return await work
        except PlacementError as err:
            self.refused(err)
            raise

    async def _book_is_current(self) -> None:
        if not self._leading():
            raise NotLeaderError(
                "this replica is not the leader: reserve, commit, release and explain"
                " reservations through the leader's Service"
            )
        try:
            await asyncio.wait_for(self.ready.wait(), _READY_WAIT_S)
        except TimeoutError:
            raise UnavailableError("reservations are still being restored") from None

    def _ttl_of(self, ttl_s: float | None) -> float:
        if ttl_s is None:
            return self._ttl
        if ttl_s <= 0:
            raise InvalidRequestError("reservation_ttl: must be positive")
        if ttl_s > self._max_ttl:
            raise InvalidRequestError(
                f"reservation_ttl: is {ttl_s:g} s, at most {self._max_ttl:g} s"
                " (the aggregator's --max-reservation-ttl); commit to hold GPUs longer"
            )
        return ttl_s

    async def _search(
        self, snapshot: ClusterSnapshot, req: PlacementRequest
    ) -> tuple[PlacementResult, float]:
        """`gputopo.placement.place` in the search pool, never on the event loop: a search over
        thousands of nodes must not stall heartbeats, /healthz or other calls. The snapshot is
        immutable, so the thread reads nothing the loop changes. Past the deadline the caller
        gets `DeadlineExceededError` (the thread finishes on its own; the pool bounds how many
        run)."""
        loop = asyncio.get_running_loop()
        policy = req.policy or self._policy
        work = loop.run_in_executor(self._pool, partial(place, snapshot, req, policy=policy))
        try:
            return await asyncio.wait_for(work, self._deadline_s)
        except TimeoutError:
            self.deadlines += 1
            raise DeadlineExceededError(
                f"request: the placement search took longer than {self._deadline_s:g} s"
                " (--search-deadline); ask for less, or for fewer candidates"
            ) from None
        except RequestError as err:
            raise InvalidRequestError(f"request.{err}") from None
        except UnknownPolicyError as err:
            raise InvalidRequestError(f"request.policy: {err}") from None

    def _still_free(self, result: PlacementResult) -> bool:
        """Whether every GPU a search chose (on an older snapshot) is still free and on a live
        node: the search ran off the loop while reports and other calls went on."""
        now = self.state.snapshot()
        return all(
            node in now.nodes and gpus <= now.node(node).free
            for node, gpus in result.allocation().items()
        )

    async def _place(
        self, req: PlacementRequest, dry_run: bool, ttl_s: float | None, caller: str
    ) -> Decision:
        if dry_run:
            ttl = self._ttl_of(ttl_s)
            return await self._decide(req, dry_run=True, ttl=ttl, caller=caller)
        await self._book_is_current()
        ttl = self._ttl_of(ttl_s)
        # One reserving search at a time (module docstring, 2.).
        async with self._reserving:
            decision = await self._decide(req, dry_run=False, ttl=ttl, caller=caller)
        held = decision.reservation
        if held is not None and self.store is not None:
            try:
                await self.store.put(held)
            except StoreError as err:
                with contextlib.suppress(ReservationError):
                    self.book.release(held.id)
                raise UnavailableError(
                    f"the reservation could not be stored, so it was not made: {err}"
                ) from None
        return decision

    async def _decide(
        self, req: PlacementRequest, *, dry_run: bool, ttl: float, caller: str
    ) -> Decision:
        for _ in range(_SEARCH_ATTEMPTS):
            snapshot = self.state.snapshot()
            result, seconds = await self._search(snapshot, req)
            if dry_run or not result.placed or self._still_free(result):
                break
            self.researches += 1
        else:
            raise ContendedError(
                f"request: the GPUs chosen were taken while searching, {_SEARCH_ATTEMPTS} times;"
                " try again"
            )
        outcome = "dry_run" if dry_run else ("placed" if result.placed else "unplaced")
        self.stats.decided(outcome, req.policy or self._policy or DEFAULT_POLICY, seconds)
        reservation = None
        if result.placed and not dry_run:
            reservation = self.book.reserve(result, ttl_s=ttl, job=req.job, holder=caller)
        log.info(
            "place job=%r placed=%s gpus=%d in %.1f ms%s",
            req.job,
            result.placed,
            result.gpu_count,
            seconds * 1e3,
            "" if result.placed else f": {result.reason}",
        )
        return Decision(with_nics(result, snapshot), snapshot.generation, seconds, reservation)

    async def _commit(self, rid: str, owner: str, caller: str) -> Reservation:
        await self._book_is_current()
        self._check_holder(rid, caller)
        try:
            res = self.book.commit(rid, owner=owner)
        except ReservationError:
            raise NotFoundError(
                f"reservation_id: no live reservation {rid!r} (unknown, released or expired)"
            ) from None
        if self.store is not None:
            try:
                await self.store.put(res)
            except StoreError as err:
                raise UnavailableError(f"the commitment could not be stored: {err}") from None
        return res

    async def _release(self, rid: str, caller: str) -> Reservation:
        await self._book_is_current()
        self._check_holder(rid, caller)
        if self.store is not None and self.book.reservation(rid) is not None:
            try:
                await self.store.delete(rid)
            except StoreError as err:
                raise UnavailableError(f"the release could not be stored: {err}") from None
        try:
            return self.book.release(rid)
        except ReservationError:
            raise NotFoundError(f"reservation_id: no live reservation {rid!r}") from None

    def _check_holder(self, rid: str, caller: str) -> None:
        """Only who made a reservation may commit or release it. An id is no secret (it sits in
        pod annotations and topology dumps); the caller's certificate is. GPUs the inventory
        says are used are held for as long as it says so, whoever asks."""
        held = self.book.reservation(rid)
        if held is None:
            return
        if held.from_inventory:
            raise PermissionDeniedError(
                f"reservation_id: {rid!r} holds GPUs the inventory marks as used;"
                " change the inventory to free them"
            )
        if held.holder != caller:
            self.denied += 1
            log.warning(
                "reservation %s: %s may not change it; it belongs to %s",
                rid,
                _who(caller),
                _who(held.holder),
            )
            raise PermissionDeniedError(
                f"reservation_id: {rid!r} was made by another caller; only"
                f" {_who(held.holder)} may commit or release it"
            )
