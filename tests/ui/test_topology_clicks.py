"""Clicking on the topology page, in headless Chromium driven over the DevTools protocol.

`--dump-dom` shows the page as loaded; a person clicks. Clicking a node's square in the overview
must show that node's matrix (and mark the square chosen), a row of the list must do the same,
Enter in the search box must open the first match, and the choice must live in the address
(`#node=`) so it can be shared.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aggregator.server import Aggregator, AggregatorConfig
from exporter.simulate import SimulatedExporters
from gputopo.app.demo import demo_nodes
from tests.harness.chromium import Browser

pytestmark = [pytest.mark.browser]

_MATRIX = "(() => { const t = document.querySelector('table.matrix');"
_MATRIX += " return t && [t.dataset.node, t.querySelectorAll('td.cell.gg').length]; })()"
_SEARCH_GB200_03 = (
    "(() => { const s = document.getElementById('search'); s.focus(); s.value = 'GB200-03';"
    " s.dispatchEvent(new Event('input'));"
    " s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'})); })()"
)


def test_clicking_a_node_shows_its_matrix_and_search_enter_does_too(
    tmp_path: Path, chromium: Path
) -> None:
    nodes = demo_nodes()
    gpus = {n.name: n.gpu_count for n in nodes}
    seen: dict[str, object] = {}

    async def body() -> None:
        agg = Aggregator(AggregatorConfig(http_port=0, heartbeat_interval_s=0.5))
        await agg.start()
        try:
            async with (
                SimulatedExporters(nodes, target=agg.grpc_target) as sim,
                Browser.start(profile=tmp_path / "cdp") as page,
            ):
                await sim.wait_acked(timeout_s=60)
                await page.goto(f"http://127.0.0.1:{agg.http_port}/ui/")
                await page.wait_for("document.body.dataset.ready === 'true'")
                seen["before"] = await page.evaluate(_MATRIX)
                await page.evaluate("document.querySelector('.sq[data-node=\"pcie-01\"]').click()")
                seen["clicked"] = await page.wait_for(f"{_MATRIX}?.[0] === 'pcie-01' && {_MATRIX}")
                seen["hash"] = await page.evaluate("location.hash")
                seen["selected"] = await page.evaluate(
                    "[...document.querySelectorAll('.sq.selected')].map(c => c.dataset.node)"
                )
                await page.evaluate(_SEARCH_GB200_03)
                seen["entered"] = await page.wait_for(f"{_MATRIX}?.[0] === 'gb200-03' && {_MATRIX}")
                seen["listed"] = await page.evaluate(
                    "[...document.querySelectorAll('#list .row')].map(r => r.dataset.node)"
                )
                await page.evaluate(
                    "(() => { const s = document.getElementById('search'); s.value = '';"
                    " s.dispatchEvent(new Event('input'));"
                    " document.querySelector('#list .row[data-node=\"a100-02\"]').click(); })()"
                )
                seen["row"] = await page.wait_for(f"{_MATRIX}?.[0] === 'a100-02' && {_MATRIX}")
        finally:
            await agg.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(body(), timeout=120))
    assert seen["before"] is None, "no matrix until a node is chosen"
    pairs = {n: g * (g - 1) for n, g in gpus.items()}
    assert seen["clicked"] == ["pcie-01", pairs["pcie-01"]]
    assert seen["hash"] == "#node=pcie-01"
    assert seen["selected"] == ["pcie-01"]
    assert seen["entered"] == ["gb200-03", pairs["gb200-03"]]
    assert seen["listed"] == ["gb200-03"], "the search narrows the list, case aside"
    assert seen["row"] == ["a100-02", pairs["a100-02"]], "a row of the list opens its node"
