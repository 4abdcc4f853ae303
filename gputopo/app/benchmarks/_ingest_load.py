"""The load side of `bench ingest`: one process's share of the simulated nodes.

Each node is one Report stream doing what `exporter.stream` does on the wire: a snapshot, then a
delta every `delta_interval` seconds and a heartbeat half-way between (its phase drawn at
random), every message numbered and stamped with its send time. What makes it cheap enough
to leave the CPU to the aggregator it measures:

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
    __slots__ = ("first", "index", "kind", "load", "messages", "name", "sent", "seq", "stream")

    def __init__(self, load: _Load, index: int, name: str, messages: dict[str, list[bytes]]):
        self.load = load
        self.index = index
        self.name = name
        self.messages = messages
        self.seq = 0
        self.kind = 0  # steady cycle position: even a delta, odd a heartbeat
        self.sent: collections.deque[tuple[str, float]] = collections.deque()
        self.first = True
        self.stream: H2Stream | None = None

    def send(self, kind: str, k: int = 0) -> None:
        assert self.stream is not None
        self.seq += 1
        now = time.monotonic()
        self.sent.append((kind, now))
        window = self.load.window
        if window is not None and window[0] <= now < window[1]:
            self.load.sent_in_window += 1
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
        window = load.window
        if window is not None and window[0] <= at < window[1]:
            load.counts[kind] += 1
            if kind == "delta":
                load.samples.append(time.monotonic() - at)

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

    def __init__(self, nodes: int) -> None:
        from gputopo.v1 import reporter_pb2 as rpb

        self.decode = rpb.ReportResponse.FromString
        self.accepted = rpb.ReportResponse.STATUS_ACCEPTED
        self.samples: list[float] = []
        self.counts: collections.Counter[str] = collections.Counter()  # acked, by send time
        self.sent_in_window = 0
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
    load = _Load(len(names))
    host, port = target.rsplit(":", 1)
    # h2 (the `bench` extra) only where the load runs: the image and `gputopo --help` do without.
    from gputopo.app.benchmarks._h2load import H2Connection, grpc_headers

    headers = grpc_headers(target, _REPORT)
    per_conn = options["nodes_per_connection"]
    connections: list[H2Connection] = []
    heap: list[tuple[float, int, _Node]] = []
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
            due = time.monotonic() + rng.uniform(0, interval)
            heapq.heappush(heap, (due, node.index, node))

    async def tick() -> None:
        """Every node's next message when it is due: a delta, then a heartbeat half an
        interval later, and so on (due times advance by the interval, so they do not drift)."""
        half = interval / 2
        while True:
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                due, index, node = heapq.heappop(heap)
                assert node.stream is not None
                if node.stream.ended:
                    continue
                if node.kind % 2 == 0:
                    node.send("delta", node.kind // 2)
                else:
                    node.send("heartbeat")
                node.kind += 1
                heapq.heappush(heap, (due + half, index, node))
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
        "errors": load.errors,
        "failed_streams": dict(load.failed),
        "unacked_snapshots": load.unacked,
        "channels": len(connections),
    }
