"""The load side of `bench ingest`: one process's share of the simulated nodes.

Each node is one Report stream doing what `exporter.stream` does on the wire: a snapshot, then a
delta every `delta_interval` seconds (its phase drawn at random) and a heartbeat whenever it was
silent for the heartbeat interval its last acknowledgement announced (the configured
`heartbeat_interval` until one does, or when one announces none), every message numbered and
stamped with its send time. With the aggregator's default 5 s and deltas every 10 s that is a
heartbeat half-way between deltas; told 20 s (a paced aggregator at 20,000 nodes), no
heartbeats at all, as a real exporter whose deltas keep it from ever being silent that long.
What makes it cheap enough to leave the CPU to the aggregator it measures:

1. messages encoded once per node (its name, incarnation and payload); a send appends only the
   sequence and the send time, hand-encoded (protobuf merges concatenated fields);
2. HTTP/2 through h2 with no gRPC client library above it (`_h2load`: a message is one DATA
   frame), `nodes_per_connection` streams per connection, so the streams spread over many
   connections, as exporters on many machines would;
3. one timer for all the nodes (a heap of due times), not a sleeping task per node;
4. streams opened at a bounded rate with a bounded number of snapshots waiting for their
   acknowledgement: connecting 20,000 nodes is paced by what the aggregator acknowledges, not
   a flood the server must queue.

A stream that ends before the bench stops it is a failure (counted by its gRPC status, or
by its reason where the server sent none: RST_STREAM, GOAWAY, a lost connection), and its
node stops; a node whose snapshot was never acknowledged is counted apart.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import random
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputopo.app.benchmarks._h2load import H2Connection, H2Stream

__all__ = ["fabric_tiers", "run_load"]

_REPORT = "/gputopo.v1.Reporter/Report"
_LEAF, _SPINE = 32, 512
_TICK_S = 0.01
# An announced interval is clamped as the exporter clamps it (`exporter.stream.HEARTBEAT_RANGE_S`,
# not imported: the load processes stay free of the exporter's imports; a test holds them equal).
HEARTBEAT_RANGE_S = (0.1, 300.0)


def fabric_tiers(index: int) -> list[str]:
    """Node `index`'s fabric position: leaves of 32 nodes under spines of 512."""
    return [f"leaf-{index // _LEAF}", f"spine-{index // _SPINE}", "core"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _stamp(sequence: int, sent_ns: int) -> bytes:
    """`ReportRequest(sequence=..., sent_at=...)` on the wire (fields 3 and 4)."""
    ts = b"\x08" + _varint(sent_ns // 1_000_000_000) + b"\x10" + _varint(sent_ns % 1_000_000_000)
    return b"\x18" + _varint(sequence) + b"\x22" + _varint(len(ts)) + ts


class _Node:
    __slots__ = (
        "due",
        "every",
        "first",
        "index",
        "kind",
        "last_sent",
        "load",
        "messages",
        "name",
        "next_delta",
        "sent",
        "seq",
        "stream",
    )

    def __init__(self, load: _Load, index: int, name: str, messages: dict[str, list[bytes]]):
        self.load = load
        self.index = index
        self.name = name
        self.messages = messages
        self.seq = 0
        self.kind = 0  # deltas sent: they alternate between the node's payloads
        self.sent: collections.deque[tuple[str, float]] = collections.deque()
        self.first = True
        self.stream: H2Stream | None = None
        self.every = load.heartbeat_s  # the heartbeat interval last announced
        self.last_sent = 0.0
        self.next_delta = 0.0
        self.due = 0.0  # of the node's live entry in the timer heap (others are left over)

    def send(self, kind: str, k: int = 0) -> None:
        assert self.stream is not None
        self.seq += 1
        now = time.monotonic()
        self.last_sent = now
        self.sent.append((kind, now))
        window = self.load.window
        if window is not None and window[0] <= now < window[1]:
            self.load.sent_in_window += 1
            self.load.sent_kinds[kind] += 1
        options = self.messages[kind]
        self.stream.send(options[k % len(options)] + _stamp(self.seq, time.time_ns()))

    def on_message(self, data: bytes) -> None:
        load = self.load
        resp = load.decode(data)
        kind, at = self.sent.popleft()
        if resp.status != load.accepted:
            load.errors.append(f"{self.name} seq {resp.acked_sequence}: status {resp.status}")
            return
        if self.first:
            self.first = False
            load.settle(ok=True)
        announced = resp.heartbeat_interval
        every = announced.seconds + announced.nanos / 1e9
        every = min(max(every, HEARTBEAT_RANGE_S[0]), HEARTBEAT_RANGE_S[1]) if every else 0.0
        every = every or load.heartbeat_s
        if every != self.every:
            self.every = every
            self.schedule()
        window = load.window
        if window is not None and window[0] <= at < window[1]:
            load.counts[kind] += 1
            load.announced[every] += 1
            if kind == "delta":
                load.samples.append(time.monotonic() - at)

    def fire(self, now: float, delta_interval: float) -> None:
        """Send what is due at `now` (the node's timer went off): its delta if that is due,
        which also resets the silence, else a heartbeat; then queue the next."""
        if self.next_delta <= now:
            self.send("delta", self.kind)
            self.kind += 1
            self.next_delta += delta_interval
        else:
            self.send("heartbeat")
        self.schedule()

    def schedule(self) -> None:
        """Queue the node's next message: its next delta, or a heartbeat after the announced
        interval of silence, whichever comes first."""
        due = min(self.next_delta, self.last_sent + self.every)
        if due != self.due:
            self.due = due
            heapq.heappush(self.load.timers, (due, next(self.load.pushes), self))

    def on_end(self, reason: str) -> None:
        load = self.load
        if not load.stopping:
            # Counted by gRPC status where there is one: its message may name the node.
            status = self.stream.status if self.stream is not None else ""
            load.failed[f"grpc-status {status}" if status else reason] += 1
            load.errors.append(f"{self.name}: {reason}")
        if self.first:
            self.first = False
            load.settle(ok=False)


class _Load:
    """Counters and phases of one process's nodes."""

    def __init__(self, nodes: int, heartbeat_s: float = 5.0) -> None:
        from gputopo.v1 import reporter_pb2 as rpb

        self.heartbeat_s = heartbeat_s  # until an acknowledgement announces one
        # (due, push number, node): one timer for every node; the number breaks ties (a
        # node's left-over entry may share its due time with its live one)
        self.timers: list[tuple[float, int, _Node]] = []
        self.pushes = itertools.count()
        self.announced: collections.Counter[float] = collections.Counter()  # by acks, window

        self.decode = rpb.ReportResponse.FromString
        self.accepted = rpb.ReportResponse.STATUS_ACCEPTED
        self.samples: list[float] = []
        self.counts: collections.Counter[str] = collections.Counter()  # acked, by send time
        self.sent_in_window = 0
        self.sent_kinds: collections.Counter[str] = collections.Counter()  # in the window
        self.errors: list[str] = []
        self.failed: collections.Counter[str] = collections.Counter()
        self.unacked = 0
        self.pending = nodes  # snapshots neither acknowledged nor failed
        self.stopping = False
        self.window: tuple[float, float] | None = None
        self.all_settled = asyncio.Event()
        self.settled = asyncio.Event()  # one more snapshot settled: the ramp may go on

    def settle(self, *, ok: bool) -> None:
        self.unacked += not ok
        self.pending -= 1
        self.settled.set()
        if self.pending == 0:
            self.all_settled.set()


def _messages(name: str, index: int, base: tuple[bytes, list[bytes]]) -> dict[str, list[bytes]]:
    """A node's messages without sequence and send time (appended per send)."""
    from gputopo.v1 import reporter_pb2 as rpb
    from gputopo.v1 import topology_pb2 as tpb

    topo = tpb.NodeTopology.FromString(base[0])
    topo.name = name
    topo.fabric.tiers[:] = fabric_tiers(index)
    incarnation = time.time_ns()
    head = rpb.ReportRequest(node_name=name, incarnation=incarnation).SerializeToString()
    return {
        "snapshot": [
            head + rpb.ReportRequest(snapshot=rpb.Snapshot(topology=topo)).SerializeToString()
        ],
        "delta": [
            head + rpb.ReportRequest(delta=rpb.Delta.FromString(d)).SerializeToString()
            for d in base[1]
        ],
        "heartbeat": [head + rpb.ReportRequest(heartbeat=rpb.Heartbeat()).SerializeToString()],
    }


async def run_load(
    conn: Connection,
    target: str,
    names: list[str],
    options: dict[str, Any],
    base: tuple[bytes, list[bytes]],
) -> dict[str, Any]:
    """Stream `names` to `target` until the parent's window is over; the figures of this
    process. Protocol with the parent: ("ready", snapshots not acknowledged, settled) once all
    are settled (`settled` True) or at `options["settle_by"]` (monotonic) at the latest
    (False: the ramp stopped there), then (start, end)."""
    rng = random.Random(options["seed"])
    interval = options["delta_interval"]
    load = _Load(len(names), options["heartbeat_interval"])
    host, port = target.rsplit(":", 1)
    # h2 (the `bench` extra) only where the load runs: the image and `gputopo --help` do without.
    from gputopo.app.benchmarks._h2load import H2Connection, grpc_headers

    headers = grpc_headers(target, _REPORT)
    per_conn = options["nodes_per_connection"]
    connections: list[H2Connection] = []
    heap = load.timers
    nodes = [
        _Node(load, i, name, _messages(name, i, base))
        for i, name in zip(options["indices"], names, strict=True)
    ]

    async def ramp() -> None:
        """Open the streams at most `ramp` per second, with at most `in_flight` snapshots
        not yet acknowledged."""
        began = time.monotonic()
        for n, node in enumerate(nodes):
            while n - (len(nodes) - load.pending) >= options["in_flight"]:
                load.settled.clear()
                await load.settled.wait()
            ahead = began + n / options["ramp"] - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            if not connections or connections[-1].capacity <= 0 or n % per_conn == 0:
                connections.append(await H2Connection.open(host, int(port), headers))
            node.stream = connections[-1].open_stream(node.on_message, node.on_end)
            node.send("snapshot")
            node.next_delta = node.last_sent + rng.uniform(0, interval)
            node.schedule()

    async def tick() -> None:
        """Every node's next message when it is due: a delta every `interval` (due times
        advance by it, so they do not drift), a heartbeat after the announced interval of
        silence (a delta resets it)."""
        while True:
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                due, _, node = heapq.heappop(heap)
                assert node.stream is not None
                if node.stream.ended or due != node.due:
                    continue  # left over from a moved interval
                node.fire(now, interval)
            # At least a tick between turns: the messages due in it leave in one socket write
            # per connection, not one wake-up each (the send time is taken when each leaves).
            wait = heap[0][0] - time.monotonic() if heap else _TICK_S
            await asyncio.sleep(min(max(wait, _TICK_S), 0.05))

    ramping = asyncio.create_task(ramp())
    ticking = asyncio.create_task(tick())

    async def connected() -> None:
        await ramping  # a connection the server refused ends the run here
        await load.all_settled.wait()

    settled = True
    try:
        try:
            await asyncio.wait_for(connected(), max(0.0, options["settle_by"] - time.monotonic()))
        except TimeoutError:  # measured anyway: nodes not connected by now count as not acked
            ramping.cancel()
            settled = False
        conn.send(("ready", load.unacked + load.pending, settled))
        start, end = await asyncio.to_thread(conn.recv)
        load.window = (start, end)
        await asyncio.sleep(max(0.0, end - time.monotonic()) + 3.0)  # outstanding acks
    finally:
        load.stopping = True
        ramping.cancel()
        ticking.cancel()
        for connection in connections:
            connection.close()
    return {
        "samples": load.samples,
        "counts": dict(load.counts),
        "sent_in_window": load.sent_in_window,
        "sent_kinds": dict(load.sent_kinds),
        "announced": {str(k): v for k, v in load.announced.items()},
        "errors": load.errors,
        "failed_streams": dict(load.failed),
        "unacked_snapshots": load.unacked,
        "channels": len(connections),
    }
