"""Reporter and placement messages over REAL gRPC against a running aggregator process
(issue 13, item 7): valid-shaped protobufs with absurd values and raw garbage bytes.

Counted and asserted at the end: crashes (the process died), hangs (an RPC past its deadline),
server errors (UNKNOWN/INTERNAL: an exception escaped a handler), tracebacks in the
aggregator's stderr, and the growth of its RSS (< 50 MiB). The aggregator is a subprocess
(`gputopo aggregator --inventory ... --inventory-nodes`, a simulated cluster to place on) so its
log and memory are its own."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import reporter_pb2 as rpb
from tests.fuzz.conftest import record_summary

INVENTORY = Path(__file__).resolve().parents[1] / "data" / "inventory_small.yaml"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
UNARY = [
    "/gputopo.v1.Placement/Place",
    "/gputopo.v1.Placement/Commit",
    "/gputopo.v1.Placement/Release",
    "/gputopo.v1.Placement/Explain",
    "/gputopo.v1.Placement/GetTopology",
]
SERVER_ERRORS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
U64 = 2**64 - 1
U32 = 2**32 - 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Aggregator:
    def __init__(self, workdir: Path) -> None:
        self.grpc_port, self.http_port = _free_port(), _free_port()
        self.log = workdir / "aggregator.log"
        self._log = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gputopo", "aggregator"),
                *("--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port)),
                *("--inventory", str(INVENTORY), "--inventory-nodes", "--reservation-ttl", "5"),
                "--insecure",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.counts: dict[str, Any] = {"rpcs": 0, "crashes": 0, "hangs": 0, "server_errors": 0}
        self.codes: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while True:
            try:
                url = f"http://127.0.0.1:{self.http_port}/healthz"
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                assert self.proc.poll() is None, self.log.read_text()
                assert time.monotonic() < deadline, "aggregator did not start"
                time.sleep(0.2)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.rss_start_kib = _rss_kib(self.proc.pid)

    def call(self, method: str, payload: bytes) -> grpc.StatusCode:
        fn = self.channel.unary_unary(method)  # raw bytes both ways
        try:
            fn(payload, timeout=20)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
        return self._count(code)

    def stream(self, payloads: list[bytes]) -> grpc.StatusCode:
        fn = self.channel.stream_stream("/gputopo.v1.Reporter/Report")
        try:
            for _ in fn(iter(payloads), timeout=5):
                pass
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
        # A stream that is still open after its last message ends by our deadline: not a hang.
        return self._count(code, stream=True)

    def _count(self, code: grpc.StatusCode, *, stream: bool = False) -> grpc.StatusCode:
        self.counts["rpcs"] += 1
        self.codes[code.name] = self.codes.get(code.name, 0) + 1
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and not stream:
            self.counts["hangs"] += 1
        if code in SERVER_ERRORS:
            self.counts["server_errors"] += 1
        if self.proc.poll() is not None:
            self.counts["crashes"] += 1
        return code

    def stop(self) -> dict[str, Any]:
        alive = self.proc.poll() is None
        rss = _rss_kib(self.proc.pid) if alive else 0
        self.channel.close()
        if alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        text = self.log.read_text(errors="replace")
        return {
            **self.counts,
            "crashes": self.counts["crashes"] + (0 if alive else 1),
            "codes": self.codes,
            "tracebacks_in_log": text.count("Traceback"),
            "rss_growth_mib": round((rss - self.rss_start_kib) / 1024, 1) if alive else None,
        }


@pytest.fixture(scope="module")
def agg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Aggregator]:
    a = Aggregator(tmp_path_factory.mktemp("grpc-fuzz"))
    try:
        yield a
    finally:
        summary = a.stop()
        SUMMARY.update(summary)
        record_summary({"suite": "grpc", **summary})


SUMMARY: dict[str, Any] = {}

absurd_u32 = st.one_of(st.integers(0, 16), st.sampled_from([U32, U32 - 1, 2**31, 10**6]))
absurd_u64 = st.one_of(st.integers(0, 16), st.sampled_from([U64, 2**63, 10**18, 2**53 + 1]))
absurd_f = st.one_of(st.floats(), st.sampled_from([1e308, -1.0, 0.0, 1e-308]))
names = st.one_of(st.text(max_size=12), st.just("a" * 10_000), st.just("node-01"))


@st.composite
def place_requests(draw: st.DrawFn) -> bytes:
    groups = [
        ppb.Group(
            name=draw(names),
            replicas=draw(absurd_u32),
            pods=draw(absurd_u32),
            gpus_per_pod=draw(absurd_u32),
            pattern=draw(st.integers(0, 40)),
            message_bytes=draw(absurd_u64),
            scope=ppb.Constraint(required=draw(st.integers(0, 40))),
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    edges = [
        ppb.Edge(
            source=draw(names),
            target=draw(names),
            min_gbps=draw(absurd_f),
            max_transfer_seconds=draw(absurd_f),
            transfer_bytes=draw(absurd_u64),
        )
        for _ in range(draw(st.integers(0, 2)))
    ]
    req = ppb.PlaceRequest(
        request=ppb.PlacementRequest(
            job=draw(names),
            groups=groups,
            edges=edges,
            priority=draw(st.integers(-(2**31), 2**31 - 1)),
            policy=draw(st.sampled_from(["", "gputopo", "first-fit", "nonsense"])),
        ),
        dry_run=draw(st.booleans()),
    )
    ttl = draw(st.one_of(st.none(), st.integers(-(10**12), 315_576_000_000)))
    if ttl is not None:
        req.reservation_ttl.seconds = ttl
    return req.SerializeToString()


@FUZZ
@given(payload=place_requests())
def test_place_with_absurd_values(agg: Aggregator, payload: bytes) -> None:
    for method in ("/gputopo.v1.Placement/Place", "/gputopo.v1.Placement/Explain"):
        assert agg.call(method, payload) not in SERVER_ERRORS


@FUZZ
@given(method=st.sampled_from(UNARY), payload=st.binary(max_size=300))
def test_unary_garbage_bytes(agg: Aggregator, method: str, payload: bytes) -> None:
    assert agg.call(method, payload) not in SERVER_ERRORS


@FUZZ
@given(rid=names)
def test_commit_release_unknown_ids(agg: Aggregator, rid: str) -> None:
    for method, msg in (
        ("/gputopo.v1.Placement/Commit", ppb.CommitRequest(reservation_id=rid)),
        ("/gputopo.v1.Placement/Release", ppb.ReleaseRequest(reservation_id=rid)),
    ):
        assert agg.call(method, msg.SerializeToString()) not in SERVER_ERRORS


@st.composite
def reports(draw: st.DrawFn) -> bytes:
    msg = rpb.ReportRequest(
        node_name=draw(names),
        incarnation=draw(absurd_u64),
        sequence=draw(absurd_u64),
        exporter_version=draw(st.text(max_size=8)),
        probe_address=draw(st.text(max_size=20)),
    )
    secs = draw(st.one_of(st.none(), st.integers(-(2**62), 2**62)))
    if secs is not None:
        msg.sent_at.seconds = secs
    kind = draw(st.sampled_from(["heartbeat", "snapshot", "delta", "none"]))
    if kind == "heartbeat":
        msg.heartbeat.SetInParent()
    elif kind == "snapshot":
        msg.snapshot.SetInParent()
    elif kind == "delta":
        msg.delta.problems.extend(draw(st.lists(st.text(max_size=5), max_size=3)))
        msg.delta.problems_changed = draw(st.booleans())
    return msg.SerializeToString()


@FUZZ
@given(msgs=st.lists(reports(), min_size=1, max_size=4))
def test_report_stream_with_absurd_values(agg: Aggregator, msgs: list[bytes]) -> None:
    assert agg.stream(msgs) not in SERVER_ERRORS


@FUZZ
@given(msgs=st.lists(st.binary(max_size=200), min_size=1, max_size=3))
def test_report_stream_garbage_bytes(agg: Aggregator, msgs: list[bytes]) -> None:
    assert agg.stream(msgs) not in SERVER_ERRORS


def test_zz_the_aggregator_survived_flat_and_quiet(agg: Aggregator) -> None:
    """Runs last in the module (name order is pytest's order here): the counts above."""
    assert agg.proc.poll() is None, "the aggregator died"
    assert agg.counts["crashes"] == 0
    assert agg.counts["hangs"] == 0
    assert agg.counts["server_errors"] == 0
    growth = (_rss_kib(agg.proc.pid) - agg.rss_start_kib) / 1024
    assert growth < 50, f"RSS grew {growth:.1f} MiB"
    text = agg.log.read_text(errors="replace")
    assert "Traceback" not in text, text[text.find("Traceback") - 300 :][:3000]
    # Hundreds of undecodable requests above; the log says so at most once per method per 10 s.
    undecodable = text.count("undecodable request")
    assert 1 <= undecodable <= 2 * (len(UNARY) + 1), undecodable
