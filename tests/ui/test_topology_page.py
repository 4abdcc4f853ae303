"""The topology page at /ui/, rendered in headless Chromium against the demo cluster.

The aggregator serves the demo's nodes (one of them with a degraded NVLink) and holds one
placement; Chromium loads `/ui/?reservation=ID#node=NAME`. The DOM must show every demo node
with its free GPU count in the overview's tiles (one per tier-0 domain), the chosen node's
matrix as `gputopo topo show` prints it (GPUs and NICs, lane counts, the degraded link marked,
PHB and SYS in different colours) and the placement's GPUs highlighted. `?place=4` must send an
all-reduce, say so, and land on one NVLink domain. A screenshot is saved under the test's
directory and its path printed. (The 1,000-node acceptance test is test_page_at_scale.py.)
"""

from __future__ import annotations

import asyncio
import json
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
    squares = {a["data-node"]: a for a in page.having("sq")}
    free = found["free"]
    assert isinstance(free, dict)
    assert set(squares) == set(free), "every demo node, and only those"
    for name, n_free in free.items():
        assert squares[name]["data-free"] == str(n_free), name
    tiles = {a["data-domain"] for a in page.having("domain")}
    assert tiles == {
        f"core-1/spine-{s}/leaf-{leaf}" for s, leaf in ((1, 1), (1, 2), (2, 3), (2, 4))
    }
    assert len(page.having("nvl")) == 18, "the NVL72 rack's trays are marked as one NVLink domain"
    assert "1 NVLink domain<" in dom
    gpus = chosen.gpu_count
    assert len(page.having("gg")) == gpus * (gpus - 1), "one cell per GPU pair"
    nics = len(chosen.nics)
    assert len(page.having("cell")) == (gpus + nics) ** 2, "GPUs and NICs, as topo show"
    degraded = page.having("degraded")
    degraded_cells = [a for a in degraded if "cell" in a.get("class", "").split()]
    assert len(degraded_cells) == 2, "the degraded NVLink, both directions"
    assert "lanes_down" in degraded_cells[0]["title"]
    assert "NVLINK, 9/18 lanes" in degraded_cells[0]["title"], "the lane count, as topo show"
    assert "225.0 GB/s" in degraded_cells[0]["title"], "the halved link's bandwidth"
    assert re.search(r"degraded \(1 link\)", dom), "the matrix's key counts the degraded link"
    kinds = {a["data-kind"] for a in page.having("cell") if "data-kind" in a}
    assert {"NVLINK", "PIX", "PHB", "SYS"} <= kinds, kinds
    colours = {
        a["data-kind"]: a["style"]
        for a in page.having("cell")
        if a.get("data-kind") in ("PHB", "SYS")
    }
    assert colours["PHB"] != colours["SYS"], "PHB and SYS links look different"
    (label,) = [a for _, a in page.found if a.get("id") == "placement"]
    assert label["data-placed-gpus"] == "8", label
    assert f"8 GPUs on {found['placed_node']}" in dom, "the header says where it is"
    k = 8 if found["placed_node"] == chosen.name else 0  # the placement's GPUs on this matrix
    assert len(page.having("in-placement")) == k * (k - 1), "the links the placement uses"
    placed_squares = [a["data-node"] for a in page.having("sq") if "placed" in a["class"].split()]
    assert placed_squares == [found["placed_node"]]
    assert re.search(r"\d+ nodes · \d+/\d+ GPUs free", dom)

    explained = Elements()
    explained.feed(str(found["explained"]))
    (label,) = [a for _, a in explained.found if a.get("id") == "placement"]
    assert label.get("data-placed-gpus") == "4", "?place=4 highlights where Explain puts 4"
    assert json.loads(label["data-request"])["groups"][0]["pattern"] == "all_reduce"
    assert "running an all-reduce" in str(found["explained"]), "the page says what it assumed"
    (where,) = label["data-placed-nodes"].split(",")
    placed_rows = [a for a in explained.having("gpu-row") if "placed" in a["class"].split()]
    assert len(placed_rows) == 4, "the node view opens on the placed node, its 4 GPUs marked"
    on = {int(a["data-gpu"]) for a in placed_rows}
    topo = next(n for n in nodes if n.name == where)
    kinds_between = {
        lk.kind for lk in topo.links if {lk.a.index, lk.b.index} <= on and lk.a.kind is lk.b.kind
    }
    assert kinds_between == {LinkKind.NVLINK}, (
        f"?place=4 picked {where} {sorted(on)}: not one NVLink domain"
    )
    assert not where.startswith("pcie-"), "not the PCIe server's bridged pairs"

    too_big = str(found["too_big"])
    assert re.search(r'id="placement"[^>]*>where 1000 GPUs would go [^<]*: not placed', too_big)
    assert 'data-ready="true"' in too_big, "an unplaceable ask still shows the cluster"
    unplaced = Elements()
    unplaced.feed(too_big)
    assert not [a for a in unplaced.having("sq") if "placed" in a["class"].split()]
    refreshes = re.search(r'data-refreshes="(\d+)"', too_big)
    assert refreshes, "?refresh=2 redraws the overview within the 8 s the page is given"
    assert int(refreshes.group(1)) >= 2
    assert len(re.findall(r'class="sq[ "]', too_big)) == len(free), "redrawn, not appended"
    shot = found["shot"]
    assert isinstance(shot, Path)
    assert shot.stat().st_size > 10_000
    print(f"SCREENSHOT {shot}")
