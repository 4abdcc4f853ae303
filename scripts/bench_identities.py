"""Aggregator memory per node identity over mutual TLS, each node sending the largest report.

Issue 25's acceptance: N node identities, each sending the largest accepted report, keep the
aggregator under its documented budget (`gputopo.bounds.NODE_MEMORY_BUDGET` per node plus the
aggregator's own, README "Memory per node"). Set up as production runs it:

1. The aggregator is `gputopo aggregator` in its own process, with mutual TLS; only its
   resident memory (/proc/PID/status) is measured.
2. Every node has its own client certificate, CN `system:node:NAME` (what the aggregator
   accepts as a node identity), issued once by `gputopo.runtime.pki` and kept in `--certs`
   (a directory under the system's temp dir by default), so a rerun reuses them.
3. Clients run in `--workers` other processes (their memory is not the aggregator's), one
   TLS channel and one Report stream per node, `--rate` new nodes per second in all, each
   started whatever the answers to the ones before (a herd: with `--rate 1000` every node is
   in flight at once, as after a failover). Each sends the largest accepted report: a 128-GPU
   PCIe server on an uneven switch tree with every GPU pair measured (the worst shape of
   tests/aggregator/test_node_memory.py, about 450 KB), renamed for its node; then it keeps
   its stream open with heartbeats. Answers are counted from every worker as they come.
4. RSS is read before the first node, after the last one is accepted, and again after one
   Place (so the placement snapshot built from those nodes counts too); the peak (VmHWM)
   covers whatever was in flight in between.

    .venv/bin/python scripts/bench_identities.py --identities 1000 --rate 1000

Prints one JSON object: identities, accepted, report_bytes, the aggregator's RSS before and
after and its peak, MiB per identity, the documented budget for N, and whether the peak stayed
under it. Stops early (and says so) if the aggregator and clients together pass
`--max-total-gib`, or not every node has its answer within `--timeout`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))  # run as a file: the checkout's packages, not an installed copy

import grpc  # noqa: E402

from exporter.fake_machine import FakeMachine  # noqa: E402
from gputopo.bounds import NODE_MEMORY_BUDGET  # noqa: E402
from gputopo.codec import topology_to_proto  # noqa: E402
from gputopo.request import request_from_mapping  # noqa: E402
from gputopo.runtime.grpcio import channel  # noqa: E402
from gputopo.runtime.identity import NODE_PREFIX  # noqa: E402
from gputopo.runtime.pki import CLIENT_AUTH, SERVER_AUTH, SecretSpec, issue_bundle  # noqa: E402
from gputopo.runtime.placement_client import PlacementCallError, PlacementClient  # noqa: E402
from gputopo.runtime.tls import TlsFiles  # noqa: E402
from gputopo.sim.pcieserver import measured_with_noise, pcie_tree, uneven_tree  # noqa: E402
from gputopo.v1 import reporter_pb2 as rpb  # noqa: E402
from gputopo.v1 import topology_pb2 as tpb  # noqa: E402

# The aggregator's own memory beside its nodes' (README "Memory per node").
AGGREGATOR_OWN_MIB = 128.0
_MIB = 2**20
_OPERATOR = "bench-operator"
_REPORT_METHOD = "/gputopo.v1.Reporter/Report"  # gputopo.v1.reporter_pb2_grpc


def node_name(i: int) -> str:
    return f"big-{i:04}"


# --- certificates, made once and kept, and the report ---------------------------------------


def ensure_certs(directory: Path, identities: int) -> None:
    """A CA, the aggregator's certificate, an operator's, and one per node up to `identities`;
    what `directory` already holds is kept (the CA too, so old and new leaves agree)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_files = (directory / "ca.crt", directory / "ca.key")
    ca = (ca_files[0].read_bytes(), ca_files[1].read_bytes()) if ca_files[1].exists() else None
    wanted = [
        SecretSpec(
            "aggregator",
            "",
            "gputopo-aggregator",
            ("localhost", "127.0.0.1"),
            (SERVER_AUTH, CLIENT_AUTH),
        ),
        SecretSpec(_OPERATOR, "", _OPERATOR, (), (CLIENT_AUTH,)),
        *(
            SecretSpec(node_name(i), "", NODE_PREFIX + node_name(i), (), (CLIENT_AUTH,))
            for i in range(identities)
        ),
    ]
    missing = [s for s in wanted if ca is None or not (directory / s.name / "tls.key").exists()]
    if not missing:
        return
    bundle = issue_bundle(
        missing, days=7, now=datetime.datetime.now(datetime.UTC), ca=ca, ca_name="bench-ca"
    )
    if ca is None:
        _write(ca_files[0], bundle.ca_cert)
        _write(ca_files[1], bundle.ca_key)
    for issued in bundle.issued:
        leaf = directory / issued.spec.name
        leaf.mkdir(exist_ok=True)
        _write(leaf / "tls.crt", issued.cert)
        _write(leaf / "ca.crt", issued.ca)
        _write(leaf / "tls.key", issued.key)  # last: its presence says the leaf is whole


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def tls_of(directory: Path, name: str) -> TlsFiles:
    leaf = directory / name
    return TlsFiles(cert=leaf / "tls.crt", key=leaf / "tls.key", ca=leaf / "ca.crt")


def report_path(directory: Path, shape: str) -> Path:
    return directory / f"{shape}-report.bin"


def make_report(directory: Path, shape: str = "largest") -> bytes:
    """A report's topology (serialized NodeTopology), made afresh each run and left in
    `directory` for the workers: the largest accepted one, or a machine profile's (`dgx-h100`:
    what the identity itself costs beside a small node). Not kept from an earlier run: it takes
    a quarter of a second, and a kept one would go on measuring a shape the code no longer
    makes."""
    path = report_path(directory, shape)
    if shape != "largest":
        small = topology_to_proto(FakeMachine.from_profile(shape, node_name=shape).topology)
        _write(path, small.SerializeToString())
        return path.read_bytes()
    topo = measured_with_noise(pcie_tree("largest", sockets=uneven_tree(128, seed=4)), seed=4)
    data = topology_to_proto(topo).SerializeToString()
    _write(path, data)
    return data


# --- the clients: one process holds many nodes' streams --------------------------------------


async def run_worker(
    certs: Path, target: str, names: list[str], *, rate: float, shape: str
) -> None:
    """Report as each node, starting at most `rate` new nodes a second whatever the answers
    (a herd: a node does not wait for the one before it to be accepted); one line per node on
    stdout when its answer comes, then hold every stream open with heartbeats until terminated."""
    # Serialized once: a node's report is these bytes and its own name (protobuf merges
    # concatenated messages, the last name wins), so a node whose call waits costs this
    # client its wire size, not a decoded copy (1,000 waiting nodes held 5 GiB here that way).
    topology = tpb.NodeTopology.FromString(report_path(certs, shape).read_bytes())
    base = rpb.ReportRequest(snapshot=rpb.Snapshot(topology=topology)).SerializeToString()
    del topology
    held: list[asyncio.Task[None]] = []
    started = time.monotonic()
    for n, name in enumerate(names):
        delay = started + n / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        accepted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        accepted.add_done_callback(functools.partial(_say, name))
        held.append(asyncio.create_task(_one_node(certs, target, name, base, accepted)))
    await asyncio.gather(*held)


def _say(name: str, answer: asyncio.Future[str]) -> None:
    print(json.dumps({"node": name, "answer": answer.result()}), flush=True)


async def _one_node(
    certs: Path, target: str, name: str, base: bytes, accepted: asyncio.Future[str]
) -> None:
    try:
        async with channel(target, tls=tls_of(certs, name)) as chan:
            report = chan.stream_stream(
                _REPORT_METHOD,
                request_serializer=bytes,  # written already serialized
                response_deserializer=rpb.ReportResponse.FromString,
            )
            call = report()
            own = rpb.ReportRequest(
                node_name=name,
                incarnation=1,
                sequence=1,
                snapshot=rpb.Snapshot(topology=tpb.NodeTopology(name=name)),
            )
            await call.write(base + own.SerializeToString())
            answer = await call.read()
            if not isinstance(answer, rpb.ReportResponse):  # grpc.aio.EOF
                accepted.set_result("stream ended")
                return
            status = rpb.ReportResponse.Status.Name(answer.status)
            accepted.set_result(status if not answer.message else f"{status}: {answer.message}")
            interval = answer.heartbeat_interval.ToNanoseconds() / 1e9 or 10.0
            sequence = 1
            while True:
                await asyncio.sleep(interval)
                sequence += 1
                beat = rpb.ReportRequest(
                    node_name=name, incarnation=1, sequence=sequence, heartbeat=rpb.Heartbeat()
                )
                await call.write(beat.SerializeToString())
                await call.read()
    except grpc.aio.AioRpcError as error:
        if not accepted.done():
            accepted.set_result(f"{error.code().name}: {error.details()}")
    except Exception as error:  # said on stdout, so the parent never waits
        if not accepted.done():
            accepted.set_result(f"ERROR: {type(error).__name__}: {error}")


# --- the parent: the aggregator, the workers, the figures ------------------------------------


def _forward(stream: Iterable[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of `pid` in MiB; `field="VmHWM"`: its peak since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_aggregator(certs: Path, grpc_port: int, health_port: int) -> subprocess.Popen[bytes]:
    tls = tls_of(certs, "aggregator")
    argv = [
        sys.executable, "-m", "gputopo", "aggregator",
        "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", "0",
        "--health-port", str(health_port),
        "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca),
        "--operator", _OPERATOR, "--no-labels",
    ]  # fmt: skip
    log = open(certs / "aggregator.log", "wb")  # noqa: SIM115 - the child keeps it open
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": str(HERE)}
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the aggregator exited: see {certs / 'aggregator.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=1):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the aggregator did not become healthy in 60 s")


async def place_once(certs: Path, target: str) -> str:
    """One 1-GPU Place as the operator: the aggregator builds its placement snapshot."""
    async with channel(target, tls=tls_of(certs, _OPERATOR)) as chan:
        try:
            answer = await PlacementClient(chan).place(
                request_from_mapping(
                    {"job": "bench", "groups": [{"name": "one", "gpus_per_pod": 1}]}
                ),
                dry_run=True,
            )
        except PlacementCallError as error:
            return f"place failed: {error}"
    return "placed" if answer.result.placed else f"not placed: {answer.result.reason}"


def documented_budget_mib(identities: int) -> float:
    """README "Memory per node": every node's budget plus the aggregator's own."""
    return identities * NODE_MEMORY_BUDGET / _MIB + AGGREGATOR_OWN_MIB


def default_guard_gib(identities: int) -> float:
    """Where the run stops itself: past the documented budget (plus the clients' 2 GiB) the
    answer is known, and a machine with less memory stops before it swaps or kills."""
    available_mib = next(
        int(line.split()[1]) / 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemAvailable:")
    )
    return min(documented_budget_mib(identities) + 2048, 0.8 * available_mib) / 1024


def measure(args: argparse.Namespace) -> dict[str, object]:
    certs: Path = args.certs
    began = time.monotonic()
    ensure_certs(certs, args.identities)
    report_bytes = len(make_report(certs, args.report))
    prepared_s = time.monotonic() - began
    grpc_port, health_port = free_port(), free_port()
    target = f"127.0.0.1:{grpc_port}"
    aggregator = start_aggregator(certs, grpc_port, health_port)
    workers: list[subprocess.Popen[str]] = []
    figures: dict[str, object] = {}
    try:
        time.sleep(2)  # let it settle after start
        before = rss_mib(aggregator.pid)
        names = [node_name(i) for i in range(args.identities)]
        count = max(1, min(args.workers, len(names)))
        for w in range(count):
            mine = names[w::count]
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--worker",
                        "--certs",
                        str(certs),
                        "--target",
                        target,
                        "--rate",
                        str(args.rate / count),
                        "--report",
                        args.report,
                        *mine,
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=os.environ | {"PYTHONPATH": str(HERE)},
                )
            )
        answers: dict[str, int] = {}
        stopped = ""
        connect_began = time.monotonic()
        lines: queue.Queue[str] = queue.Queue()
        for worker in workers:  # every worker's answers as they come, whichever worker
            assert worker.stdout is not None
            threading.Thread(target=_forward, args=(worker.stdout, lines), daemon=True).start()
        deadline = connect_began + args.timeout
        while sum(answers.values()) < len(names):
            try:
                answer = json.loads(lines.get(timeout=1.0))["answer"]
            except queue.Empty:
                answer = None
            if answer is not None:
                kind = answer.split(":")[0]
                answers[kind] = answers.get(kind, 0) + 1
                if answer != "STATUS_ACCEPTED":
                    figures.setdefault("first_refusal", answer)
            # checked while no answer comes too: a herd in flight grows with no line
            total = rss_mib(aggregator.pid) + sum(
                rss_mib(w.pid) for w in workers if w.poll() is None
            )
            if total > args.max_total_gib * 1024:
                stopped = f"stopped: aggregator and clients at {total:.0f} MiB"
            elif time.monotonic() > deadline:
                stopped = f"stopped: {args.timeout:.0f} s without every answer"
            elif aggregator.poll() is not None:
                stopped = f"stopped: the aggregator exited ({aggregator.returncode})"
            if stopped:
                break
        connect_s = time.monotonic() - connect_began
        time.sleep(args.settle)
        after = rss_mib(aggregator.pid)
        peak_reports = rss_mib(aggregator.pid, "VmHWM")
        placed = asyncio.run(place_once(certs, target)) if not stopped else "skipped"
        time.sleep(1)
        after_place = rss_mib(aggregator.pid)
        peak = rss_mib(aggregator.pid, "VmHWM")
        accepted = answers.get("STATUS_ACCEPTED", 0)
        budget_mib = documented_budget_mib(args.identities)
        per_identity = (after_place - before) / accepted if accepted else 0.0
        figures = {
            "identities": args.identities,
            "report": args.report,
            "accepted": accepted,
            "answers": answers,
            **({"stopped": stopped} if stopped else {}),
            **({"first_refusal": figures["first_refusal"]} if "first_refusal" in figures else {}),
            "report_bytes": report_bytes,
            "workers": count,
            "connect_seconds": round(connect_s, 1),
            "prepare_seconds": round(prepared_s, 1),
            "aggregator_rss_mib_before": round(before, 1),
            "aggregator_rss_mib_after_reports": round(after, 1),
            "place_after_reports": placed,
            "aggregator_rss_mib_after_place": round(after_place, 1),
            "mib_per_identity": round(per_identity, 2),
            "node_memory_budget_mib": NODE_MEMORY_BUDGET / _MIB,
            "documented_budget_mib": round(budget_mib, 1),
            "aggregator_peak_rss_mib": round(peak, 1),
            "aggregator_peak_rss_mib_during_reports": round(peak_reports, 1),
            "under_documented_budget": peak <= budget_mib,
            "stop_guard_mib": round(args.max_total_gib * 1024),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        aggregator.send_signal(signal.SIGTERM)
        try:
            aggregator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            aggregator.kill()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=100)
    parser.add_argument(
        "--certs",
        type=Path,
        default=Path(tempfile.gettempdir()) / "gputopo-bench-identities",
        help="where certificates are made once and reused, and the report written",
    )
    parser.add_argument(
        "--report",
        default="largest",
        help="what each node reports: largest (the default: the largest accepted report) or a"
        " machine profile such as dgx-h100, to see what an identity costs beside its topology",
    )
    parser.add_argument("--workers", type=int, default=4, help="client processes (default 4)")
    parser.add_argument(
        "--rate", type=float, default=50.0, help="new nodes a second, all workers (default 50)"
    )
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds after the last answer (default 5)"
    )
    parser.add_argument(
        "--max-total-gib",
        type=float,
        default=None,
        help="stop when the aggregator and clients together pass this (default: the documented"
        " budget for the identities plus 2 GiB for the clients, at most 80%% of the memory"
        " available at start)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="stop when not every node has its answer after this many seconds (default 1800)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(
            run_worker(args.certs, args.target, args.names, rate=args.rate, shape=args.report)
        )
        return 0
    if args.max_total_gib is None:
        args.max_total_gib = default_guard_gib(args.identities)
    print(json.dumps(measure(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
