"""Leader election on a `coordination.k8s.io/v1` Lease, so that only one replica writes.

The rules are client-go's `leaderelection` (the ones every controller in a cluster already
follows), in asyncio:

1. Acquire: read the Lease. Free (absent, no holder) or expired → write ourselves in as holder,
   conditional on the resource version read (a 409 means another replica won the race).
   Expiry is judged on this replica's own monotonic clock: a lease counts as expired when its
   record has not changed for `lease_duration_s` since we first saw it, so clock skew between
   machines cannot make a live leader look dead.
2. Renew every `retry_period_s` while leading. If no renewal succeeds for `renew_deadline_s`
   (< lease duration), stop leading *before* the lease can expire for others: two leaders
   never write at once.
3. Release on a clean stop: the holder is cleared, so a successor takes over at once rather
   than after the lease duration.

Durations are counted on the event loop's clock (`loop.time()`, which is `time.monotonic` in
production), so a test on fake loop time sees a 15 s lease run out in no real time and at the
exact moment.

`on_started` runs when leadership is gained and `on_stopped` when it is lost or released; the
aggregator starts its writers (label publisher, scheduler objects) in the first and cancels them
in the second.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from gputopo.runtime.kube import ConflictError, KubeClient, KubeError, LeaseRecord

__all__ = ["LeaderElector", "LeaseConfig", "rfc3339_micro"]

log = logging.getLogger(__name__)


def rfc3339_micro(seconds: float) -> str:
    """A Lease MicroTime: always six fractional digits (the API server insists)."""
    stamp = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Where the Lease is and how it is held (client-go's defaults)."""

    namespace: str
    name: str = "gputopo-aggregator"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "lease timing needs 0 < retry_period < renew_deadline < lease_duration"
            )


class LeaderElector:
    """One replica's candidacy (see the module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        config: LeaseConfig,
        *,
        identity: str,
        on_started: Callable[[], Awaitable[None]] | None = None,
        on_stopped: Callable[[], Awaitable[None]] | None = None,
        monotonic: Callable[[], float] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.config = config
        self.identity = identity
        self._on_started = on_started
        self._on_stopped = on_stopped
        # the running loop's clock unless given (read only inside the loop's tasks)
        self._monotonic = monotonic or (lambda: asyncio.get_running_loop().time())
        self._wall = wall
        self.is_leader = False
        self.leader = ""  # the holder last observed
        self.transitions = 0
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    async def run(self) -> None:
        """Campaign, lead, and campaign again after losing, until cancelled."""
        try:
            while True:
                await self._acquire()
                await self._lead()
        finally:
            if self.is_leader:
                await self._stopped()

    async def release(self) -> None:
        """Give the lease up (a clean shutdown), so a successor need not wait it out."""
        if not self.is_leader or self._observed is None:
            return
        record = replace(
            self._observed,
            holder="",
            duration_s=1,
            renew_time=rfc3339_micro(self._wall()),
        )
        with contextlib.suppress(KubeError):
            await self.kube.replace_lease(self.config.namespace, self.config.name, record)
        await self._stopped()

    def abandon(self) -> None:
        """Stop counting as leader without telling anyone (what a crash looks like; tests)."""
        self.is_leader = False

    async def _acquire(self) -> None:
        while True:
            if await self._try():
                self._last_renew = self._monotonic()
                self.is_leader = True
                self.transitions += 1
                log.info("%s is now the leader (lease %s)", self.identity, self.config.name)
                if self._on_started is not None:
                    await self._on_started()
                return
            await asyncio.sleep(self.config.retry_period_s)

    async def _lead(self) -> None:
        while True:
            await asyncio.sleep(self.config.retry_period_s)
            if await self._try():
                self._last_renew = self._monotonic()
                continue
            if self.leader and self.leader != self.identity:
                log.warning("%s lost the lease to %s", self.identity, self.leader)
                break
            if self._monotonic() - self._last_renew >= self.config.renew_deadline_s:
                log.warning("%s could not renew the lease in time; stepping down", self.identity)
                break
        await self._stopped()

    async def _stopped(self) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        if self._on_stopped is not None:
            await self._on_stopped()

    async def _try(self) -> bool:
        """One acquire-or-renew attempt; True when we hold the lease afterwards."""
        cfg = self.config
        now_wall = rfc3339_micro(self._wall())
        try:
            current = await self.kube.get_lease(cfg.namespace, cfg.name)
            if current is None:
                record = LeaseRecord(
                    holder=self.identity,
                    duration_s=round(cfg.lease_duration_s),
                    acquire_time=now_wall,
                    renew_time=now_wall,
                )
                self._observe(await self.kube.create_lease(cfg.namespace, cfg.name, record))
                return True
            self._observe(current)
            mine = current.holder == self.identity
            duration = current.duration_s or cfg.lease_duration_s
            expired = self._monotonic() - self._observed_at > duration
            if current.holder and not mine and not expired:
                return False
            record = replace(
                current,
                holder=self.identity,
                duration_s=round(cfg.lease_duration_s),
                renew_time=now_wall,
            )
            if not mine:
                record = replace(record, acquire_time=now_wall, transitions=current.transitions + 1)
            self._observe(await self.kube.replace_lease(cfg.namespace, cfg.name, record))
            return True
        except ConflictError:
            return False
        except KubeError as err:
            log.warning("lease %s/%s: %s", cfg.namespace, cfg.name, err)
            return False

    def _observe(self, record: LeaseRecord) -> None:
        """Remember a lease record; its age counts from when it last changed, on our clock."""
        old = self._observed
        if old is None or (old.holder, old.renew_time, old.resource_version) != (
            record.holder,
            record.renew_time,
            record.resource_version,
        ):
            self._observed_at = self._monotonic()
        self._observed = record
        self.leader = record.holder
