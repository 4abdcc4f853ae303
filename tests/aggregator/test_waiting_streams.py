"""What a report stream costs the aggregator while its call waits to be taken.

After a failover every exporter connects at once, and the event loop takes new calls only
between the snapshots it decodes (about a quarter of a second each for the largest): most of a
herd waits in gRPC Core, which keeps what each stream's HTTP/2 window let in. The aggregator's
server options (`aggregator.server.SERVER_OPTIONS`) keep that window at the lookahead, so a
waiting stream costs about its TLS connection and 64 KiB, not its message; the README's memory
budget (nodes x 16 MiB + 128 MiB) rests on it.

The server (tests/aggregator/waiting_server.py) runs in its own process over mutual TLS with its
event loop blocked (every call waits, as in a herd far larger than the loop's pace); clients
here send a 4 MiB report each. The
same herd against gRPC's own defaults (BDP probing grows the window toward the message) is the
control: it proves the data did arrive and the measurement sees it, so a pass is not a herd
that never got there.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputopo.runtime import grpcio
from gputopo.runtime.tls import TlsFiles
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from gputopo.v1 import topology_pb2 as tpb
from tests.harness.certs import TestCA

ROOT = Path(__file__).resolve().parent.parent.parent
STREAMS = 12
MESSAGE_BYTES = 4 << 20
_MIB = 1 << 20


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _held_per_stream(kind: str, server_tls: TlsFiles, client_tls: TlsFiles) -> float:
    """MiB the server holds per waiting stream once its memory stops growing."""
    files = (str(server_tls.cert), str(server_tls.key), str(server_tls.ca))
    with subprocess.Popen(
        [sys.executable, "-m", "tests.aggregator.waiting_server", kind, *files],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    ) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            return asyncio.run(_herd(server.pid, port, client_tls))
        finally:
            server.kill()


async def _herd(pid: int, port: int, tls: TlsFiles) -> float:
    await asyncio.sleep(0.5)
    before = _rss_mib(pid)
    topology = tpb.NodeTopology(name="n" * MESSAGE_BYTES)  # never decoded: never taken
    message = rpb.ReportRequest(
        node_name="n", incarnation=1, sequence=1, snapshot=rpb.Snapshot(topology=topology)
    )
    channels = [grpcio.channel(f"localhost:{port}", tls=tls) for _ in range(STREAMS)]
    calls = [rgrpc.ReporterStub(c).Report() for c in channels]
    writes = [asyncio.create_task(call.write(message)) for call in calls]
    try:
        # 60 s: twelve TLS handshakes on a machine as slow as any CI runner
        await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in channels)), 60)
        # Settled: no change past 1 MiB for 2 s. On loopback a window fills in milliseconds;
        # the 30 s cap only ends a wait that never settles, and the control catches a herd
        # that never arrived.
        last, since = _rss_mib(pid), time.monotonic()
        deadline = since + 30
        while time.monotonic() - since < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            now = _rss_mib(pid)
            if abs(now - last) > 1:
                last, since = now, time.monotonic()
        return (_rss_mib(pid) - before) / STREAMS
    finally:
        for call in calls:
            call.cancel()
        for write in writes:
            write.cancel()
        await asyncio.gather(*writes, return_exceptions=True)
        for c in channels:
            await c.close()


@pytest.mark.slow
def test_a_waiting_report_stream_holds_its_window_not_its_message(tmp_path: Path) -> None:
    ca = TestCA("herd-ca")
    server_tls = ca.issue(tmp_path / "aggregator", "localhost")
    client_tls = ca.issue(tmp_path / "node", "system:node:herd")

    control = _held_per_stream("control", server_tls, client_tls)
    ours = _held_per_stream("aggregator", server_tls, client_tls)
    message_mib = MESSAGE_BYTES / _MIB
    # The control: BDP probing let most of each 4 MiB message in (measured 3-4 MiB), so the
    # data arrived and RSS saw it.
    assert control > message_mib / 2, f"control held {control:.2f} MiB a stream"
    # Ours: the 64 KiB window and the TLS connection, about 0.2 MiB measured; 1 MiB leaves
    # five times that for allocator slack on another machine, and is a quarter of the message.
    assert ours < 1.0, f"a waiting stream held {ours:.2f} MiB (control {control:.2f})"
