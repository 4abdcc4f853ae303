"""The committed dashboard JSON is what the generator makes of today's metric names."""

from __future__ import annotations

from dashboards.generate import DASHBOARDS, HERE, render


def test_the_committed_dashboards_are_fresh() -> None:
    rendered = render()
    assert set(rendered) == set(DASHBOARDS)
    for name, text in rendered.items():
        assert (HERE / name).read_text(encoding="utf-8") == text, (
            f"dashboards/{name} is stale: run make dashboards"
        )
