"""A generic informer: list, then watch from the list's version, relist on 410 Gone.

client-go's reflector in asyncio, for any kind the caller can list and watch. The caller hands
over two functions (list: objects and the list's resource version; watch: typed events after a
version) and gets a cache of the objects by key and two callbacks:

1. List everything. Objects in the cache that the list no longer has were deleted while no
   watch was open: `on_delete` for each. Every listed object: `on_upsert(obj, relisted=True)`.
   `synced` is set after the first list.
2. Watch from the list's version. ADDED and MODIFIED: `on_upsert(obj, relisted=False)`;
   DELETED: `on_delete`; BOOKMARK only moves the version. When the server closes the watch
   (it does after its timeout), watch again from the last version seen.
3. 410 Gone (the version was compacted away): list again (step 1). Any other error: wait a
   jittered backoff, then list again; the backoff resets once a list succeeds.

Callbacks run on the event loop, one at a time, in the server's order.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from gputopo.runtime.backoff import Backoff
from gputopo.runtime.kube import GoneError, KubeClient, KubeError, NodeObject

__all__ = ["Informer", "bound_pod_informer", "node_informer"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_DEFAULT_BACKOFF = Backoff(base_s=0.5, cap_s=30.0)


class Informer(Generic[T]):
    """A cache of one kind of object, kept by list and watch (see the module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        list_objects: Callable[[], Awaitable[tuple[list[T], str]]],
        watch: Callable[[str], AsyncIterator[tuple[str, T]]],
        key: Callable[[T], str],
        version: Callable[[T], str],
        on_upsert: Callable[[T, bool], None] = lambda obj, relisted: None,
        on_delete: Callable[[T], None] = lambda obj: None,
        backoff: Backoff = _DEFAULT_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self._list = list_objects
        self._watch = watch
        self._key = key
        self._version = version
        self._on_upsert = on_upsert
        self._on_delete = on_delete
        self._backoff = backoff
        self._rng = rng or random.Random()
        self.cache: dict[str, T] = {}
        self.synced = asyncio.Event()
        self.relists = 0
        self.errors = 0

    async def run(self) -> None:
        """Keep the cache until cancelled."""
        attempt = 0
        while True:
            try:
                version = await self.relist()
                attempt = 0
                while True:
                    async for kind, obj in self._watch(version):
                        version = self._version(obj) or version
                        self._event(kind, obj)
            except GoneError:
                continue
            except KubeError as err:
                self.errors += 1
                delay = self._backoff.delay(attempt, self._rng)
                attempt += 1
                log.warning("%s informer: %s; listing again in %.1fs", self.name, err, delay)
                await asyncio.sleep(delay)

    async def relist(self) -> str:
        """List everything once (step 1); returns the version to watch from."""
        objects, version = await self._list()
        self.relists += 1
        listed = {self._key(obj): obj for obj in objects}
        for key in sorted(set(self.cache) - set(listed)):
            self._on_delete(self.cache.pop(key))
        for key, obj in listed.items():
            self.cache[key] = obj
            self._on_upsert(obj, True)
        self.synced.set()
        return version

    def _event(self, kind: str, obj: T) -> None:
        if kind == "BOOKMARK":
            return
        key = self._key(obj)
        if kind == "DELETED":
            self._on_delete(self.cache.pop(key, obj))
            return
        self.cache[key] = obj
        self._on_upsert(obj, False)


def node_informer(
    kube: KubeClient,
    *,
    on_upsert: Callable[[NodeObject, bool], None] = lambda obj, relisted: None,
    on_delete: Callable[[NodeObject], None] = lambda obj: None,
    backoff: Backoff = _DEFAULT_BACKOFF,
) -> Informer[NodeObject]:
    """An informer over every Node object."""
    return Informer(
        name="nodes",
        list_objects=kube.list_nodes,
        watch=kube.watch_nodes,
        key=lambda node: node.name,
        version=lambda node: node.resource_version,
        on_upsert=on_upsert,
        on_delete=on_delete,
        backoff=backoff,
    )


def bound_pod_informer(
    kube: KubeClient,
    *,
    on_upsert: Callable[[dict[str, Any], bool], None] = lambda obj, relisted: None,
    on_delete: Callable[[dict[str, Any]], None] = lambda obj: None,
    backoff: Backoff = _DEFAULT_BACKOFF,
) -> Informer[dict[str, Any]]:
    """An informer over every pod bound to a node, in every namespace, as the API's JSON."""

    def meta(pod: dict[str, Any]) -> dict[str, Any]:
        return pod.get("metadata") or {}

    return Informer(
        name="pods",
        list_objects=kube.list_bound_pods,
        watch=kube.watch_bound_pods,
        key=lambda pod: f"{meta(pod).get('namespace', '')}/{meta(pod).get('name', '')}",
        version=lambda pod: str(meta(pod).get("resourceVersion", "")),
        on_upsert=on_upsert,
        on_delete=on_delete,
        backoff=backoff,
    )
