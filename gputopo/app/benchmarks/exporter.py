"""`gputopo bench exporter`: discovery time, and the agent's memory and CPU when idle.

1. `discovery_seconds`: the median of full discovery passes (NVML calls, sysfs reads, assembly,
   health) of an 8-GPU NVSwitch machine (`dgx-h100`, fake NVML and a fake sysfs tree), beside
   importing the same machine from its recording, the cheapest way to the same graph.
2. `rss_mib`, `cpu_percent`: `gputopo exporter --simulate dgx-h100` runs as its own process,
   streaming to an aggregator, and idles between probes for `--idle-seconds` (60 by default);
   its resident memory at the end and its CPU time over the window, read from /proc. Beside it,
   the same figures of a bare Python process that imports the agent's libraries (grpc,
   aiohttp, prometheus_client, protobuf) and sleeps in an event loop: the floor any Python agent
   with this stack pays.

With `--real`, (1) runs on this machine's own NVML and /sys instead of the fake machine, and
the fake dgx-h100 figure is printed beside it (`fake_discovery_seconds`): how far the fakes'
cost is from the hardware's. It refuses with the reason when NVML is not up here.

Targets: discovery <= 0.2 s, RSS <= 100 MiB, CPU <= 1 % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HELP = "discovery time of an 8-GPU machine, the idle agent's memory and CPU (vs. a baseline)"

TARGETS = {"discovery_seconds": 0.2, "rss_mib": 100.0, "cpu_percent": 1.0}
_PROFILE = "dgx-h100"
_BASELINE = (
    "import asyncio, grpc, aiohttp.web, prometheus_client, google.protobuf\n"
    "async def main():\n"
    "    print('ready', flush=True)\n"
    "    await asyncio.sleep(3600)\n"
    "asyncio.run(main())\n"
)
_PORT = re.compile(r"metrics on [^:]+:(\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark."""
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--samples", type=int, default=31, help="discovery passes to time (default 31)"
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="time discovery on this machine's NVML and /sys (needs a GPU and driver)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="how long the agent idles while CPU is measured (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    """Measure and print."""
    from gputopo.app.progress import Progress

    with Progress("bench exporter", 3 if args.real else 2) as progress:
        if args.real:
            progress.advance(0, f"discovery on this machine's GPUs, {args.samples} passes")
            real = measure_real_discovery(samples=args.samples)
            if isinstance(real, str):
                print(f"gputopo bench exporter --real: {real}", file=sys.stderr)
                return 1
            progress.advance(1, f"discovery on the fake machine, {args.samples} passes")
            fake = measure_discovery(samples=args.samples)
            figures = real | {
                "fake_machine": fake["machine"],
                "fake_discovery_seconds": fake["discovery_seconds"],
                "real_vs_fake_ratio": round(
                    float(str(real["discovery_seconds"])) / float(str(fake["discovery_seconds"])),
                    2,
                ),
            }
        else:
            progress.advance(0, f"discovery on the fake machine, {args.samples} passes")
            figures = measure_discovery(samples=args.samples)
        progress.advance(1, f"an idle agent beside a bare Python, {args.idle_seconds} s")
        figures |= asyncio.run(_measure_idle(args.idle_seconds))
        progress.advance(1)
    figures["targets"] = TARGETS
    figures["meets_targets"] = {
        name: float(str(figures[name])) <= limit for name, limit in TARGETS.items()
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, value in figures.items():
            print(f"{name:<34} {value}")
    return 0


def measure_discovery(*, samples: int) -> dict[str, object]:
    """Median seconds of a discovery pass and of importing the machine's recording."""
    from exporter.discovery import Discovery
    from exporter.fake_machine import FakeMachine
    from exporter.fake_nvml import FakeNvml
    from exporter.fake_sysfs import write_sysfs
    from exporter.nvml import Nvml
    from exporter.sysfs import Sysfs
    from gputopo.importers import import_topology
    from gputopo.machines import load_profile, read_recording

    fake = FakeMachine.from_profile(_PROFILE, node_name="bench")
    recording = load_profile(_PROFILE).recording
    text = read_recording(recording.file)
    with tempfile.TemporaryDirectory() as root:
        discovery = Discovery(
            node_name="bench",
            nvml=Nvml(FakeNvml(fake).library),
            sysfs=Sysfs(write_sysfs(fake, Path(root))),
        )
        discovery.run()  # warm caches, as a running agent's passes are
        passes = []
        for _ in range(samples):
            began = time.perf_counter()
            result = discovery.run()
            passes.append(time.perf_counter() - began)
    imports = []
    for _ in range(samples):
        began = time.perf_counter()
        import_topology(text, recording_format=recording.format)
        imports.append(time.perf_counter() - began)
    seconds = statistics.median(passes)
    baseline = statistics.median(imports)
    return {
        "machine": _PROFILE,
        "gpus": result.topology.gpu_count,
        "samples": samples,
        "discovery_seconds": round(seconds, 5),
        "discovery_p90_seconds": round(statistics.quantiles(passes, n=10)[-1], 5),
        "baseline_import_recording_seconds": round(baseline, 5),
        "discovery_vs_import_ratio": round(seconds / baseline, 2),
    }


def measure_real_discovery(*, samples: int) -> dict[str, object] | str:
    """Median seconds of a discovery pass on this machine's NVML and /sys; the reason if NVML
    is not up here."""
    from exporter.discovery import Discovery
    from exporter.nvml import Nvml
    from exporter.sysfs import Sysfs

    nvml = Nvml()
    status = nvml.open()
    if not status.up:
        return f"NVML is not up on this machine: {status.reason}"
    discovery = Discovery(node_name="bench", nvml=nvml, sysfs=Sysfs())
    result = discovery.run()
    passes = []
    for _ in range(samples):
        began = time.perf_counter()
        result = discovery.run()
        passes.append(time.perf_counter() - began)
    nvml.close()
    names = sorted({g.name for g in result.topology.gpus})
    return {
        "machine": "this machine: " + ", ".join(names),
        "gpus": result.topology.gpu_count,
        "driver": status.driver_version,
        "samples": samples,
        "discovery_seconds": round(statistics.median(passes), 5),
        "discovery_p90_seconds": round(statistics.quantiles(passes, n=10)[-1], 5),
        "nvml_errors": result.nvml.errors,
    }


async def _measure_idle(idle_s: float) -> dict[str, object]:
    from aggregator.server import Aggregator, AggregatorConfig

    aggregator = Aggregator(AggregatorConfig())
    await aggregator.start()
    try:
        agent = await _spawn(
            [
                sys.executable,
                "-m",
                "gputopo",
                "exporter",
                "--simulate",
                _PROFILE,
                "--node-name",
                "bench",
                "--aggregator",
                aggregator.grpc_target,
                "--http-host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--probe-host",
                "127.0.0.1",
                "--probe-port",
                "0",
                "--insecure",
            ],
            ready=_PORT,
        )
        baseline = await _spawn([sys.executable, "-c", _BASELINE], ready=re.compile("ready"))
        try:
            for _ in range(100):
                if "bench" in aggregator.state.node_names:
                    break
                await asyncio.sleep(0.1)
            before = {p.pid: _cpu_seconds(p.pid) for p in (agent, baseline)}
            began = time.monotonic()
            await asyncio.sleep(idle_s)
            wall = time.monotonic() - began
            after = {p.pid: _cpu_seconds(p.pid) for p in (agent, baseline)}
            usage = {pid: (after[pid] - before[pid]) / wall * 100 for pid in before}
            reported = "bench" in aggregator.state.node_names
            return {
                "idle_seconds": round(wall, 1),
                "rss_mib": round(_rss_mib(agent.pid), 1),
                "cpu_percent": round(usage[agent.pid], 3),
                "baseline_python_stack_rss_mib": round(_rss_mib(baseline.pid), 1),
                "baseline_python_stack_cpu_percent": round(usage[baseline.pid], 3),
                "agent_reported_to_aggregator": reported,
            }
        finally:
            for process in (agent, baseline):
                await _stop(process)
    finally:
        await aggregator.stop(grace_s=0)


async def _spawn(argv: list[str], *, ready: re.Pattern[str]) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = await process.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[:4]} exited before it was ready")
            if ready.search(line.decode(errors="replace")):
                break
    # Keep draining its output so it never blocks on a full pipe.
    asyncio.get_running_loop().create_task(_drain(process))
    return process


async def _drain(process: asyncio.subprocess.Process) -> None:
    assert process.stdout is not None
    while await process.stdout.readline():
        pass


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
