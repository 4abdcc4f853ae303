"""The label publisher: keeps every Node's labels equal to what the cluster state says, writing
only labels it owns, only when they differ, and no faster than a client-side rate limit.

How it runs (`LabelPublisher.run`, only while this replica leads):

1. Follow the Node objects the Node watcher (`aggregator.nodewatch`, on every replica) keeps;
   the watcher, not the publisher, gives their labels to the state.
2. Wait until the state is warm: every node this aggregator labelled before (its
   managedFields name the field manager `gputopo`) has reported again, or `stale_after_s`
   has passed. A new leader or a restarted aggregator therefore compares against a complete
   state and patches nothing when nothing changed, instead of relabelling from a half-rebuilt
   one.
3. A node becomes dirty when its state or its Node object changes. After `settle_s` (reports of
   one rack coalesce) a worker computes the desired labels (`aggregator.labels`), plans the
   apply and sends it as a server-side apply (field manager `gputopo`, never forced)
   conditional on the resource version it read. 409 ConflictError (the Node changed, or
   another manager took a key meanwhile): read the Node again and re-plan. 429 (or 503 with
   Retry-After): wait as told.
   Every patch first takes a token from the rate limiter.
4. A labelled node that has not reported since the warm-up gets `stale=true`; its other labels
   stay as they were (nothing better is known).

`dry_run` plans exactly the same patches and prints them instead of sending them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TextIO

from aggregator.changes import ChangeEvent, ChangeKind
from aggregator.labels import (
    LabelPatch,
    LabelScheme,
    NodeFacts,
    desired_labels,
    fingerprint,
    plan_patch,
)
from aggregator.nodewatch import NodeWatcher
from aggregator.state import ClusterState
from gputopo.domains import NVLINK
from gputopo.runtime.kube import (
    FIELD_MANAGER,
    ConflictError,
    KubeClient,
    KubeError,
    NodeObject,
    NotFoundError,
    ThrottledError,
)
from gputopo.runtime.ratelimit import RateLimiter

__all__ = ["LabelPublisher", "PublisherConfig", "PublisherStats", "node_facts"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublisherConfig:
    """How the publisher behaves."""

    scheme: LabelScheme = field(default_factory=LabelScheme)
    qps: float = 10.0
    burst: int = 20
    workers: int = 4
    settle_s: float = 1.0
    resync_interval_s: float = 600.0
    dry_run: bool = False
    max_attempts: int = 6


@dataclass(slots=True)
class PublisherStats:
    """What the publisher did, for metrics and tests."""

    patches: int = 0
    conflicts: int = 0
    throttled: int = 0
    errors: int = 0
    planned: int = 0
    foreign: Counter[str] = field(default_factory=Counter)
    warm: bool = False


class LabelPublisher:
    """See the module docstring."""

    def __init__(
        self,
        state: ClusterState,
        kube: KubeClient,
        nodes: NodeWatcher,
        config: PublisherConfig | None = None,
        *,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.kube = kube
        self.nodes = nodes
        config = config or PublisherConfig()
        self.config = config
        self.scheme = config.scheme
        self.stats = PublisherStats()
        self.limiter = RateLimiter(qps=config.qps, burst=config.burst, clock=clock)
        self.cache: dict[str, NodeObject] = {}
        self.synced = asyncio.Event()
        self._out = out
        self._clock = clock
        self._dirty: dict[str, float] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._started = 0.0
        self._printed: dict[str, tuple[tuple[str, str | None], ...]] = {}
        self._idle = asyncio.Event()
        self._rng = random.Random()
        self._node_domain: dict[str, str] = {}
        self._domain_totals: dict[str, int] = {}
        self._ambiguous: dict[tuple[int, str], bool] = {}
        self._told: set[tuple[str, str]] = set()

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish until cancelled."""
        self._started = self._clock()
        unsubscribe = self.state.subscribe(self._changed)
        unwatch = self.nodes.subscribe(self._node_event)
        tasks = [asyncio.create_task(self._seed(), name="labels-seed")]
        tasks += [asyncio.create_task(self._scheduler(), name="labels-scheduler")]
        tasks += [
            asyncio.create_task(self._worker(), name=f"labels-worker-{i}")
            for i in range(self.config.workers)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            unwatch()
            unsubscribe()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _seed(self) -> None:
        """Take every Node the watcher has once it has listed them (a new leader starts from
        the watcher's cache, not from a list of its own)."""
        await self.nodes.synced.wait()
        for node in list(self.nodes.cache.values()):
            self._seen(node, force=True)
        self.synced.set()

    def _node_event(self, node: NodeObject, relisted: bool | None) -> None:
        if relisted is None:
            self.cache.pop(node.name, None)
        else:
            self._seen(node, force=relisted)

    def _changed(self, event: ChangeEvent) -> None:
        """A node changed: it, and the nodes whose labels depend on it, may need a patch.

        Two labels depend on other nodes: the NVLink domain size (the whole domain's GPUs) and
        a tier value that became ambiguous (reused under another parent) or stopped being so.
        When either moves, every node it concerns is marked, not only the one that reported.
        Reservations are ignored: no label depends on which GPUs are held.
        """
        if event.kind is ChangeKind.ALLOCATION:
            return
        node = event.node
        self.mark(node)
        index = self.state.index
        domain = index.domain_of(node, NVLINK)
        previous = self._node_domain.pop(node, None)
        if domain is not None:
            self._node_domain[node] = domain
        for d in {x for x in (domain, previous) if x is not None}:
            stats = index.stats(NVLINK, d)
            total = stats.total_gpus if stats else 0
            if self._domain_totals.get(d) != total:
                self._domain_totals[d] = total
                for mate in stats.nodes if stats else ():
                    self.mark(mate)
        rec = self.state.record(node)
        for tier, raw in enumerate(rec.topology.fabric.tiers if rec else ()):
            ambiguous = index.tier_value_is_ambiguous(tier, raw)
            if self._ambiguous.get((tier, raw), False) != ambiguous:
                self._ambiguous[(tier, raw)] = ambiguous
                for other in index.nodes_with_tier_value(tier, raw):
                    self.mark(other)

    def mark(self, node: str, *, now: bool = False) -> None:
        """Note that a node's labels may need a patch."""
        due = self._clock() + (0.0 if now else self.config.settle_s)
        self._dirty.setdefault(node, due)
        self._idle.clear()

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until nothing is dirty or in flight (for tests and the demo)."""
        async with asyncio.timeout(timeout_s):
            while True:
                await self._idle.wait()
                await asyncio.sleep(0)
                if self._idle.is_set() and not self._dirty and not self._queued:
                    return

    def _seen(self, node: NodeObject, *, force: bool = False) -> None:
        old = self.cache.get(node.name)
        self.cache[node.name] = node
        if force or old is None or (old.labels, old.annotations) != (node.labels, node.annotations):
            self.mark(node.name)

    async def _scheduler(self) -> None:
        """Move dirty nodes to the work queue once settled (and resync now and then)."""
        last_resync = self._clock()
        while True:
            await asyncio.sleep(0.05)
            now = self._clock()
            if now - last_resync > self.config.resync_interval_s:
                last_resync = now
                for name in self.cache:
                    self.mark(name, now=True)
            if not self.synced.is_set() or not self._warm(now):
                continue
            due = [n for n, t in self._dirty.items() if t <= now]
            for name in due:
                del self._dirty[name]
                if name not in self._queued:
                    self._queued.add(name)
                    self._queue.put_nowait(name)
            if not self._dirty and not self._queued:
                self._idle.set()

    def _warm(self, now: float) -> bool:
        if self.stats.warm:
            return True
        waiting = [
            name
            for name, node in self.cache.items()
            if node.labels_of(FIELD_MANAGER) and self.state.record(name) is None
        ]
        if not waiting or now - self._started > self.state.stale_after_s:
            self.stats.warm = True
            log.info(
                "label publisher warm%s",
                f"; {len(waiting)} labelled node(s) did not report" if waiting else "",
            )
        return self.stats.warm

    async def _worker(self) -> None:
        while True:
            name = await self._queue.get()
            try:
                await self.reconcile(name)
            except asyncio.CancelledError:
                raise
            except KubeError as err:
                self.stats.errors += 1
                log.warning("labelling %s failed: %s", name, err)
                self._dirty[name] = self._clock() + 5.0  # try again later
            except Exception:
                self.stats.errors += 1
                log.exception("labelling %s failed", name)
            finally:
                self._queued.discard(name)

    # --- one node ----------------------------------------------------------------------------

    def plan(self, name: str) -> LabelPatch | None:
        """The patch a node needs now (None: nothing is known that would justify one)."""
        node = self.cache.get(name)
        if node is None:
            return None
        rec = self.state.record(name)
        scheme = self.scheme
        owned = node.labels_of(FIELD_MANAGER)
        plan = partial(
            plan_patch,
            labels=node.labels,
            managers=node.label_managers,
            me=FIELD_MANAGER,
            annotations=node.annotations,
            annotation_managers=node.annotation_managers,
        )
        if rec is None:
            if not owned:
                return None
            # Labelled before, silent since the warm-up: say it is stale, keep the rest.
            return plan(desired={scheme.stale_key: "true"}, keep=owned)
        fp = fingerprint(rec.topology)
        generation = _int(node.labels.get(scheme.generation_key, ""))
        if node.annotations.get(scheme.fingerprint_annotation) != fp or generation < 1:
            generation += 1
        facts = node_facts(self.state, name, generation=generation)
        if facts is None:
            return None
        return plan(
            desired=desired_labels(facts, scheme),
            extra_annotations={scheme.fingerprint_annotation: fp},
        )

    async def reconcile(self, name: str) -> None:
        """Bring one node's labels up to date (see the module docstring for retries).

        Conflicts count against `max_attempts` (each is a fresh read and plan); throttling does
        not, since the server asked us to wait, not to give up: the wait is its Retry-After
        (or a doubling delay), spread by jitter so that throttled workers do not return
        together.
        """
        delay = 0.2
        attempts = throttles = 0
        while attempts < self.config.max_attempts and throttles < 10 * self.config.max_attempts:
            patch = self.plan(name)
            if patch is None:
                return
            node = self.cache[name]
            self._foreign(name, node, patch.foreign)
            if patch.empty:
                return
            self.stats.planned += 1
            if self.config.dry_run:
                self._print(name, node, patch)
                return
            await self.limiter.acquire()
            try:
                updated = await self.kube.apply_node_metadata(
                    name,
                    labels=patch.apply_labels,
                    annotations=patch.apply_annotations,
                    resource_version=node.resource_version,
                )
            except ConflictError:
                attempts += 1
                self.stats.conflicts += 1
                self._seen(await self.kube.get_node(name))
                continue
            except ThrottledError as err:
                throttles += 1
                self.stats.throttled += 1
                await asyncio.sleep((err.retry_after_s or delay) * self._rng.uniform(0.5, 1.5))
                delay = min(delay * 2, 10.0)
                continue
            except NotFoundError:
                self.cache.pop(name, None)
                return
            self.stats.patches += 1
            log.debug("labelled %s: %s", name, ", ".join(patch.describe(node.labels)))
            self._seen(updated)
            return
        raise KubeError(0, f"gave up labelling {name} after {attempts + throttles} attempts")

    def _foreign(self, name: str, node: NodeObject, keys: tuple[str, ...]) -> None:
        """Count the keys left to their owners, and say so once per node and key: an operator
        who wonders why gputopo's value is not there learns whose is, and that it is read."""
        for key in keys:
            self.stats.foreign[key] += 1
            if (name, key) in self._told:
                continue
            self._told.add((name, key))
            owners = ", ".join(sorted(node.label_managers.get(key, ()))) or "an unknown manager"
            log.info(
                "node %s: label %s=%s belongs to %s; gputopo leaves it and reads it as a source",
                name,
                key,
                node.labels.get(key, ""),
                owners,
            )

    def _print(self, name: str, node: NodeObject, patch: LabelPatch) -> None:
        key = tuple(sorted(patch.labels.items()))
        if self._printed.get(name) == key:
            return
        self._printed[name] = key
        out = self._out
        if out is not None:
            for line in patch.describe(node.labels):
                print(f"{name}: {line}", file=out, flush=True)


def node_facts(state: ClusterState, name: str, *, generation: int = 1) -> NodeFacts | None:
    """What a node's labels are computed from, out of the state and its domain index."""
    rec = state.record(name)
    if rec is None:
        return None
    topo = rec.topology
    index = state.index
    domain = index.domain_of(name, NVLINK)
    stats = index.stats(NVLINK, domain) if domain else None
    return NodeFacts(
        topology=topo,
        stale=state.is_stale(name),
        generation=generation,
        nvlink_domain_gpus=stats.total_gpus if stats else 0,
        ambiguous_tiers=frozenset(
            t for t, raw in enumerate(topo.fabric.tiers) if index.tier_value_is_ambiguous(t, raw)
        ),
    )


def _int(text: str) -> int:
    try:
        return max(int(text), 0)
    except ValueError:
        return 0
