"""GpuReservation objects: a reservation survives the trip to the API server and back."""

from __future__ import annotations

import pytest

from aggregator.promises import reservation_from_object, reservation_to_object
from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.reservations import Reservation

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
