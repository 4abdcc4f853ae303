"""The Placement transports only translate: what to answer is the placement core's.

The import contract "The Placement transports hold no placement logic" keeps the engine out of
`aggregator.service` and `aggregator.http_placement`; this holds the rest of the seam: neither
touches the reservation book or the store (persistence goes only through the core), and each
Placement verb reaches the core through exactly one of its methods.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import aggregator.http_placement
import aggregator.service
from gputopo.core import PlacementCore

# Names whose use would mean a transport decides, reserves or stores something itself.
_CORE_ONLY = {"book", "reserve", "store", "promises", "restore", "_reserving", "place_kept"}


@pytest.mark.parametrize("module", [aggregator.service, aggregator.http_placement])
def test_a_transport_touches_neither_the_book_nor_the_store(module: object) -> None:
    tree = ast.parse(Path(inspect.getfile(module)).read_text())  # type: ignore[arg-type]
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert used & _CORE_ONLY == set()


def test_each_placement_verb_is_one_method_of_the_core() -> None:
    source = inspect.getsource(aggregator.service.PlacementService)
    calls = {verb: source.count(f"self.core.{verb}(") for verb in ("place", "commit", "release")}
    assert calls == {"place": 1, "commit": 1, "release": 1}
    assert source.count("self.core.explain(") == 2  # a request, or a reservation id
    for verb in ("place", "commit", "release", "explain"):
        assert inspect.iscoroutinefunction(getattr(PlacementCore, verb))
