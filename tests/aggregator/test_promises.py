"""GpuReservation objects: a reservation survives the trip to the API server and back."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from aggregator.promises import KubePromises, reservation_from_object, reservation_to_object
from aggregator.service import PlacementService
from aggregator.state import ClusterState
from gputopo import core as core_module
from gputopo.core import PlacementCore
from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.reservations import Reservation
from gputopo.v1 import placement_pb2 as ppb
from tests import looptime
from tests.builders import pcie_node

RESULT = PlacementResult(
    placed=True,
    policy="gputopo",
    pods=(PodPlacement(group="tp", replica=0, pod=0, rank=0, node="h100-01", gpus=(4, 5)),),
)


@pytest.mark.parametrize(
    "res",
    [
        pytest.param(
            Reservation(
                "a1b2", {"h100-01": frozenset({4, 5})}, 1795500000.5, job="j", result=RESULT
            ),
            id="a pending reservation with its placement, for Explain",
        ),
        pytest.param(
            Reservation(
                "c3d4", {"n1": frozenset({0}), "n2": frozenset({1, 2})}, None, owner="binder"
            ),
            id="a commitment across two nodes: no expiry",
        ),
    ],
)
def test_a_reservation_round_trips(res: Reservation) -> None:
    obj = reservation_to_object(res, "gputopo-system")
    assert obj["metadata"]["name"] == res.id
    back = reservation_from_object(obj)
    assert (back.id, back.gpus, back.expires_at, back.owner, back.job) == (
        res.id,
        res.gpus,
        res.expires_at,
        res.owner,
        res.job,
    )
    assert (back.result.allocation() if back.result else None) == (
        res.result.allocation() if res.result else None
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param(
            {"gpus": {"n1": ["0"]}, "committed": True}, "spec.gpus.n1", id="indices as text"
        ),
        pytest.param({"gpus": {}, "committed": False}, "spec.expiresAt", id="pending, no expiry"),
    ],
)
def test_a_malformed_object_is_named_by_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        reservation_from_object({"metadata": {"name": "x"}, "spec": spec})


def test_explain_waits_for_the_restore_instead_of_calling_a_live_reservation_unknown() -> None:
    """Seen in the kill -9 walk: a restarted aggregator answered Explain before it had restored
    its reservations, and a live one was reported NOT_FOUND."""
    state = ClusterState(clock=lambda: 1000.0)
    state.add_static(pcie_node("h100-01", gpus=8))
    promises = cast(KubePromises, object())  # stored somewhere: not ready until restored
    core = PlacementCore(state=state, clock=lambda: 1000.0, store=promises, restored=False)
    service = PlacementService(core, state, clock=lambda: 1000.0)
    restored = Reservation("a1b2", {"h100-01": frozenset({4, 5})}, 5000.0, result=RESULT)

    async def scenario() -> ppb.PlaceResponse:
        asking = asyncio.create_task(service.explain(ppb.ExplainRequest(reservation_id="a1b2")))
        # loop time, in no real time: most of how long a request waits for the restore
        await asyncio.sleep(0.9 * core_module._READY_WAIT_S)
        assert not asking.done()  # waits rather than answering from an empty book
        state.restore([restored])
        core.ready.set()
        return await asking

    answer = looptime.run(scenario())
    assert [a.node for a in answer.assignments] == ["h100-01"]
