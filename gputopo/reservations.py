"""The reservation book: which GPUs are promised to whom, and until when.

A placement that is not a dry run holds its GPUs for a TTL (`reserve`); `commit` keeps them
until `release`. Expired reservations are dropped before every decision (`expire`), so an
abandoned reservation never leaks GPUs. `restore` re-installs reservations recovered after a
restart. Per node, the book answers which GPUs are held and which of a node's GPUs are free.

Why a book of its own, apart from the nodes: reservations outlive reports (a node that comes
back with fewer GPUs still has its held ones counted as held, never against the GPUs it has),
persistence needs them alone, and a simulator needs them without an aggregator.

The book is memory only and synchronous, so a reservation is made in one turn of the event loop
on GPUs just checked to be free. Keeping it is the placement core's job (`gputopo.core`): it
writes every change through a `ReservationStore` (async: GpuReservation objects in the API
server, or `MemoryStore`) before it answers, and `restore` re-installs what the store holds
after a restart or a failover. The book tells its owner which nodes' free GPUs moved through
`on_change`; it never reads node state itself.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from gputopo.placement.result import PlacementResult

__all__ = [
    "INVENTORY_OWNER",
    "MemoryStore",
    "Reservation",
    "ReservationBook",
    "ReservationError",
    "ReservationStore",
    "StoreError",
    "new_reservation_id",
]

# The owner of the GPUs an inventory says are in use: held for as long as the inventory says so,
# never committed nor released by a client.
INVENTORY_OWNER = "inventory"


def new_reservation_id() -> str:
    """128 random bits: an id is the only thing a Commit or Release needs, so it must not be
    guessable from another (as a counter, a node name or a short random one would be)."""
    return secrets.token_hex(16)


@dataclass(slots=True)
class Reservation:
    """GPUs held for one placement."""

    id: str
    gpus: dict[str, frozenset[int]]
    expires_at: float | None  # None once committed
    owner: str = ""
    job: str = ""
    result: PlacementResult | None = None
    # Who made it, as authenticated (a client certificate's name; "" for a plain-text caller):
    # only the same caller may commit or release it. `owner` is what the client says it is for.
    holder: str = ""

    @property
    def committed(self) -> bool:
        """Committed reservations never expire."""
        return self.expires_at is None

    @property
    def from_inventory(self) -> bool:
        """Held because the inventory says the GPUs are used: not a client's to release."""
        return self.owner == INVENTORY_OWNER

    @property
    def gpu_count(self) -> int:
        """GPUs held."""
        return sum(len(g) for g in self.gpus.values())


class ReservationError(KeyError):
    """An unknown or expired reservation id."""


class StoreError(Exception):
    """A store that did not take a read or a write (the API server refused or was away); the
    message says why. The placement core turns it into UNAVAILABLE and changes nothing."""


class ReservationStore(Protocol):
    """Where reservations are kept so that a restart or a failover restores them.

    The placement core (`gputopo.core`) writes through it before it answers: a reservation is
    stored before its id is handed out, a commitment before it is confirmed, a release deleted
    before the GPUs are freed. The aggregator's store is `aggregator.promises.KubePromises`
    (GpuReservation objects); `MemoryStore` serves tests and the simulator. Every method raises
    `StoreError` when the store cannot do it.
    """

    async def load(self, *, now: float) -> list[Reservation]:
        """Every live reservation stored (those expired by `now` are dropped from the store)."""
        ...

    async def put(self, reservation: Reservation) -> None:
        """Store a new or changed reservation."""
        ...

    async def delete(self, rid: str) -> None:
        """Forget a reservation (released or expired); an unknown id is fine."""
        ...

    async def sync(self, live: Iterable[str]) -> int:
        """Forget every stored reservation not in `live` (expired in the book); how many."""
        ...


class MemoryStore:
    """A store that lives as long as the process: for tests and the simulator, and to show
    what a durable store must do. It keeps copies, so a later change to a book's reservation
    reaches it only through `put`, as with a real store."""

    def __init__(self) -> None:
        self._items: dict[str, Reservation] = {}
        self.writes = 0  # puts and deletes that changed something

    async def load(self, *, now: float) -> list[Reservation]:
        """Every live reservation stored; expired ones are forgotten."""
        for rid in [
            r.id for r in self._items.values() if r.expires_at is not None and r.expires_at <= now
        ]:
            del self._items[rid]
        return [replace(r, gpus=dict(r.gpus)) for r in self._items.values()]

    async def put(self, reservation: Reservation) -> None:
        """Store a new or changed reservation."""
        self._items[reservation.id] = replace(reservation, gpus=dict(reservation.gpus))
        self.writes += 1

    async def delete(self, rid: str) -> None:
        """Forget a reservation."""
        if self._items.pop(rid, None) is not None:
            self.writes += 1

    async def sync(self, live: Iterable[str]) -> int:
        """Forget what is not live."""
        gone = set(self._items) - set(live)
        for rid in gone:
            await self.delete(rid)
        return len(gone)

    def stored(self) -> list[Reservation]:
        """What is stored now, in id order (for tests)."""
        return [self._items[k] for k in sorted(self._items)]


def _noop(nodes: Iterable[str]) -> None:
    return None


class ReservationBook:
    """Reservations and the GPUs they hold (see the module docstring). `clock`: unix seconds."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        on_change: Callable[[Iterable[str]], None] = _noop,
    ) -> None:
        self._clock = clock
        self._on_change = on_change
        self._reservations: dict[str, Reservation] = {}
        self._held: dict[str, set[int]] = {}

    # --- per node -------------------------------------------------------------------------

    def held(self, node: str) -> frozenset[int]:
        """GPUs of a node that live reservations hold."""
        return frozenset(self._held.get(node, ()))

    def held_gpus(self) -> dict[str, frozenset[int]]:
        """GPUs held by live reservations and commitments, per node."""
        return {n: frozenset(g) for n, g in self._held.items() if g}

    def free(self, node: str, gpu_count: int) -> frozenset[int]:
        """GPUs 0..gpu_count-1 of a node that no live reservation holds.

        Reservations may hold GPUs a node no longer has (it came back with fewer): those stay
        held, but are never counted against the GPUs it has.
        """
        return frozenset(range(gpu_count)).difference(self._held.get(node, ()))

    # --- the book -------------------------------------------------------------------------

    def reserve(
        self, result: PlacementResult, *, ttl_s: float, job: str = "", holder: str = ""
    ) -> Reservation:
        """Hold the GPUs of a placement for `ttl_s` seconds.

        Raises ValueError if any GPU is already held: callers place on a fresh snapshot in the
        same loop turn, so this only fires on a programming error, never silently.
        """
        self.expire()
        allocation = result.allocation()
        for node, gpus in allocation.items():
            clash = gpus & self._held.get(node, set())
            if clash:
                raise ValueError(f"GPUs {sorted(clash)} of {node} are already held")
        rid = new_reservation_id()
        res = Reservation(
            rid, dict(allocation), self._clock() + ttl_s, job=job, result=result, holder=holder
        )
        self._reservations[rid] = res
        self._hold(res)
        self._on_change(allocation)
        return res

    def commit(self, rid: str, *, owner: str = "") -> Reservation:
        """Keep a reservation until released."""
        self.expire()
        res = self._reservations.get(rid)
        if res is None:
            raise ReservationError(rid)
        res.expires_at = None
        res.owner = owner or res.owner
        return res

    def release(self, rid: str) -> Reservation:
        """Free a reservation's GPUs."""
        res = self._reservations.get(rid)
        if res is None:
            raise ReservationError(rid)
        del self._reservations[rid]
        self._unhold(res)
        self._on_change(res.gpus)
        return res

    def reservation(self, rid: str) -> Reservation | None:
        """A live reservation by id."""
        self.expire()
        return self._reservations.get(rid)

    def reservations(self) -> list[Reservation]:
        """Live reservations."""
        self.expire()
        return list(self._reservations.values())

    def expire(self) -> int:
        """Drop reservations past their expiry; returns how many."""
        now = self._clock()
        gone = [
            r
            for r in self._reservations.values()
            if r.expires_at is not None and r.expires_at <= now
        ]
        for r in gone:
            # A change listener may read the book, expiring the rest of `gone` re-entrantly.
            if self._reservations.pop(r.id, None) is None:
                continue
            self._unhold(r)
            self._on_change(r.gpus)
        return len(gone)

    def restore(self, reservations: Iterable[Reservation]) -> None:
        """Re-install reservations recovered after a restart (committed ones, typically)."""
        for r in reservations:
            old = self._reservations.get(r.id)
            if old is not None:
                self._unhold(old)
            self._reservations[r.id] = r
            self._hold(r)
            self._on_change(r.gpus)

    def _hold(self, res: Reservation) -> None:
        for node, gpus in res.gpus.items():
            self._held.setdefault(node, set()).update(gpus)

    def _unhold(self, res: Reservation) -> None:
        for node, gpus in res.gpus.items():
            held = self._held.get(node)
            if held is not None:
                held.difference_update(gpus)
                if not held:
                    del self._held[node]
