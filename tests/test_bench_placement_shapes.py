"""`gputopo bench placement --shapes` offers exactly the shapes the simulation builds: the
bench writes its list again so that building the CLI does not load the simulation."""

from __future__ import annotations

import pytest

from gputopo.app.benchmarks import placement
from gputopo.sim.scenarios import SHAPES, shape_request


def test_the_cli_offers_the_shapes_the_simulation_builds() -> None:
    assert placement.SHAPES == SHAPES


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("per_pod", [4, 8])
def test_every_shape_builds_a_request(shape: str, per_pod: int) -> None:
    request = shape_request(shape, per_pod)
    assert request.total_gpus > 0


def test_an_unknown_shape_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="tp8, gang64, gang512, pd"):
        shape_request("tp9", 8)
