"""The generic informer: list, watch, relist on 410 Gone, deletes seen either way."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from gputopo.runtime.backoff import Backoff
from gputopo.runtime.informer import Informer
from gputopo.runtime.kube import GoneError, KubeError


@dataclass(frozen=True)
class Obj:
    name: str
    version: str
    value: str = ""


class FakeServer:
    """Lists and watches scripted by the test: each watch call plays the next script."""

    def __init__(self, lists: list[list[Obj]], watches: list[list[tuple[str, Obj] | Exception]]):
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []
        self.listed = 0

    async def list_objects(self) -> tuple[list[Obj], str]:
        items = self.lists[min(self.listed, len(self.lists) - 1)]
        self.listed += 1
        return items, f"list-{self.listed}"

    async def watch(self, version: str) -> AsyncIterator[tuple[str, Obj]]:
        self.watched_from.append(version)
        if not self.watches:
            await asyncio.Event().wait()  # an open watch with nothing happening
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item


def informer(server: FakeServer, log: list[str]) -> Informer[Obj]:
    return Informer(
        name="test",
        list_objects=server.list_objects,
        watch=server.watch,
        key=lambda o: o.name,
        version=lambda o: o.version,
        on_upsert=lambda o, relisted: log.append(f"{'list' if relisted else 'upsert'} {o.name}"),
        on_delete=lambda o: log.append(f"delete {o.name}"),
        backoff=Backoff(base_s=0.001, cap_s=0.002),
        rng=random.Random(1),
    )


async def settle(inf: Informer[Obj]) -> None:
    task = asyncio.create_task(inf.run())
    for _ in range(50):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_watch_events_update_the_cache_and_bookmarks_only_move_the_version() -> None:
    a, b = Obj("a", "1"), Obj("b", "2")
    server = FakeServer(
        [[a]],
        [
            [("ADDED", b), ("MODIFIED", Obj("a", "3", "x")), ("BOOKMARK", Obj("", "4"))],
            [("DELETED", Obj("b", "5"))],
        ],
    )
    log: list[str] = []
    inf = informer(server, log)
    asyncio.run(settle(inf))
    assert log == ["list a", "upsert b", "upsert a", "delete b"]
    assert inf.cache == {"a": Obj("a", "3", "x")}
    # The second watch resumes after the bookmark's version, without listing again.
    assert server.watched_from[:2] == ["list-1", "4"]
    assert server.listed == 1
    assert inf.synced.is_set()


def test_gone_relists_and_deletes_what_vanished_meanwhile() -> None:
    a, b = Obj("a", "1"), Obj("b", "2")
    server = FakeServer([[a, b], [Obj("a", "9")]], [[GoneError(410, "too old")]])
    log: list[str] = []
    inf = informer(server, log)
    asyncio.run(settle(inf))
    assert log == ["list a", "list b", "delete b", "list a"]
    assert inf.cache == {"a": Obj("a", "9")}
    assert (server.listed, inf.errors) == (2, 0)


def test_other_errors_back_off_then_relist() -> None:
    server = FakeServer([[Obj("a", "1")]], [[KubeError(500, "boom")]])
    log: list[str] = []

    async def body() -> Informer[Obj]:
        relisted = asyncio.Event()
        inf = informer(server, log)

        def upsert(obj: Obj, relisted_now: bool) -> None:
            log.append(obj.name)
            if server.listed >= 2:
                relisted.set()

        inf._on_upsert = upsert
        task = asyncio.create_task(inf.run())
        await relisted.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return inf

    inf = asyncio.run(asyncio.wait_for(body(), 5))
    assert inf.errors == 1
    assert (log, server.listed) == (["a", "a"], 2)
