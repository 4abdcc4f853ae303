"""The topology page at /ui/, rendered in headless Chromium against the demo cluster.

The aggregator serves the demo's nodes (one of them with a degraded NVLink) and holds one
placement; Chromium loads `/ui/?reservation=ID#node=NAME`. The DOM must show every demo node
with its free GPU count, the fabric tree's levels, the chosen node's GPU link matrix (one cell
per GPU pair, the degraded link marked) and the placement's GPUs highlighted. A screenshot is
saved under the test's directory and its path printed.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from aggregator.server import Aggregator, AggregatorConfig
from exporter.simulate import SimulatedExporters
from gputopo.app.demo import demo_nodes
from gputopo.links import LinkHealth, LinkKind
from gputopo.request import request_from_mapping
from gputopo.runtime import grpcio
from gputopo.runtime.placement_client import PlacementClient
from gputopo.topology import NodeTopology
from tests.harness.chromium import dump_dom, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


class Elements(HTMLParser):
    """Every start tag's attributes, by tag, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    def having(self, cls: str) -> list[dict[str, str]]:
        return [a for _, a in self.found if cls in a.get("class", "").split()]


def _with_degraded_nvlink(topo: NodeTopology) -> NodeTopology:
    links = list(topo.links)
    i = next(
        i
        for i, lk in enumerate(links)
        if lk.kind is LinkKind.NVLINK and lk.a.index == 0 and lk.b.index == 1
    )
    lk = links[i]
    links[i] = replace(
        lk,
        lanes=max(1, lk.lanes // 2),
        nominal_gbps=lk.nominal_gbps / 2,
        health=LinkHealth.DEGRADED,
        health_reason="lanes_down",
    )
    return replace(topo, links=tuple(links))


def test_the_page_shows_the_tree_a_node_matrix_and_a_placement(
    tmp_path: Path, chromium: Path
) -> None:
    nodes = demo_nodes()
    chosen = next(n for n in nodes if n.name.startswith("h100-"))
    nodes = [_with_degraded_nvlink(n) if n is chosen else n for n in nodes]
    found: dict[str, object] = {}

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.5))
        await agg.start()
        try:
            async with SimulatedExporters(nodes, target=agg.grpc_target) as sim:
                await sim.wait_acked(timeout_s=60)
                async with grpcio.channel(agg.grpc_target) as channel:
                    answer = await PlacementClient(channel).place(
                        request_from_mapping(
                            {"job": "tp8", "groups": [{"name": "tp", "pods": 1, "gpus_per_pod": 8}]}
                        )
                    )
                assert answer.reservation is not None
                placed_node = answer.result.pods[0].node
                base = f"http://127.0.0.1:{agg.http_port}/ui/"
                url = f"{base}?reservation={answer.reservation.id}#node={chosen.name}"
                found["dom"] = await asyncio.to_thread(dump_dom, url, profile=tmp_path / "p1")
                found["explained"] = await asyncio.to_thread(
                    dump_dom, f"{base}?place=4", profile=tmp_path / "p3"
                )
                found["too_big"] = await asyncio.to_thread(
                    dump_dom, f"{base}?place=1000&refresh=2", profile=tmp_path / "p3"
                )
                shot = await asyncio.to_thread(
                    screenshot, url, tmp_path / "topology.png", profile=tmp_path / "p2"
                )
                found["placed_node"] = placed_node
                found["free"] = {n.name: len(agg.state.free_gpus(n.name)) for n in nodes}
                found["shot"] = shot
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(body(), timeout=240))
    dom = str(found["dom"])
    page = Elements()
    page.feed(dom)
    assert 'data-ready="true"' in dom, dom[:2000]
    cards = {a["data-node"]: a for a in page.having("node")}
    free = found["free"]
    assert isinstance(free, dict)
    assert set(cards) == set(free), "every demo node, and only those"
    for name, n_free in free.items():
        assert cards[name]["data-free"] == str(n_free), name
    levels = {a["data-level"] for a in page.having("domain") if a.get("data-level")}
    assert {"tier-0", "tier-1"} <= levels, levels
    assert page.having("nvgroup"), "the NVL72 rack's NVLink domain is shown"
    gpus = chosen.gpu_count
    assert len(page.having("cell")) == gpus * gpus, "one cell per GPU pair"
    degraded = page.having("degraded")
    assert len(degraded) == 2, "the degraded NVLink, both directions"
    assert "lanes_down" in degraded[0]["title"]
    assert re.search(r"degraded \(1 link\)", dom), "the matrix's key counts the degraded link"
    domains = [a for a in page.having("domain") if a.get("data-level")]
    assert len(page.having("bar")) == len(domains), "every fabric domain has its free-GPU bar"
    (label,) = [a for _, a in page.found if a.get("id") == "placement"]
    assert label["data-placed-gpus"] == "8", label
    assert f"8 GPUs on {found['placed_node']}" in dom, "the header says where it is"
    k = 8 if found["placed_node"] == chosen.name else 0  # the placement's GPUs on this matrix
    assert len(page.having("in-placement")) == k * (k - 1), "the links the placement uses"
    cells = {a["title"] for a in page.having("cell") if "title" in a}
    assert any(t.startswith("NVLINK 225 GB/s") for t in cells), "the halved link's bandwidth"

    explained = Elements()
    explained.feed(str(found["explained"]))
    (label,) = [a for _, a in explained.found if a.get("id") == "placement"]
    assert label.get("data-placed-gpus") == "4", "?place=4 highlights where Explain puts 4"
    assert len([p for p in explained.having("placed") if "data-gpu" in p]) == 4

    too_big = str(found["too_big"])
    assert re.search(r'id="placement"[^>]*>where 1000 GPUs would go: [^<]+<', too_big)
    assert 'data-ready="true"' in too_big, "an unplaceable ask still shows the cluster"
    assert 'class="gpu placed"' not in too_big.split("</header>", 1)[1]
    refreshes = re.search(r'data-refreshes="(\d+)"', too_big)
    assert refreshes, "?refresh=2 redraws the tree within the 8 s the page is given"
    assert int(refreshes.group(1)) >= 2
    assert len(re.findall(r'class="node', too_big)) == len(free), "redrawn, not appended"
    placed = [p for p in page.having("placed") if "data-gpu" in p]  # not the legend's
    assert len(placed) == 8
    on_card = [a for tag, a in page.found if a.get("data-node") == found["placed_node"]]
    assert on_card, "the placed node is on the page"
    assert re.search(r"\d+ nodes · \d+/\d+ GPUs free", dom)
    shot = found["shot"]
    assert isinstance(shot, Path)
    assert shot.stat().st_size > 10_000
    print(f"SCREENSHOT {shot}")
