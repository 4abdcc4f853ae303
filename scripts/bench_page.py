"""The topology page's first paint at scale, in headless Chromium: time and bytes fetched.

    .venv/bin/python scripts/bench_page.py --nodes 10000 --runs 2

Builds the acceptance test's cluster (tests/ui/test_page_at_scale.py, 200 nodes per spine) in an
aggregator on a free loopback port, loads /ui/ `--runs` times with an empty browser profile each
time (nothing cached; the first run also pays the summary's first build) and prints one JSON line
per run: the page's `overview-painted` mark (ms after navigation), the bytes fetched by then and
per resource, and the squares drawn. A benchmark, not a test: the time depends on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.server import Aggregator, AggregatorConfig
from tests.harness.chromium import Browser
from tests.ui.test_page_at_scale import METRICS, cluster


async def bench(nodes: int, runs: int) -> None:
    started = time.perf_counter()
    agg = Aggregator(AggregatorConfig(http_port=0))
    cluster(agg, spines=max(1, nodes // 200))
    await agg.start()
    print(
        json.dumps(
            {"nodes": len(agg.state.node_names), "built_s": round(time.perf_counter() - started, 1)}
        )
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(runs):
                async with Browser.start(profile=Path(tmp) / f"p{run}") as page:
                    # as the acceptance test: the browser opens the server once first
                    await page.goto(f"http://127.0.0.1:{agg.http_port}/healthz")
                    await page.wait_for("document.readyState === 'complete'")
                    await page.goto(f"http://127.0.0.1:{agg.http_port}/ui/")
                    await page.wait_for(
                        "performance.getEntriesByName('overview-painted').length", timeout_s=120
                    )
                    got = await page.evaluate(METRICS)
                    got.pop("tiles")
                    print(json.dumps({"run": run, **got}))
    finally:
        await agg.stop(grace_s=0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="nodes (multiples of 200)")
    parser.add_argument("--runs", type=int, default=2, help="page loads, each with a new profile")
    args = parser.parse_args()
    asyncio.run(bench(args.nodes, args.runs))


if __name__ == "__main__":
    main()
