"""Pods holding time-slicing replicas or MIG slices hold GPUs too, counted from their specs."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.occupancy import pod_gpus


def pod(limits: dict[str, str]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize(
    ("limits", "want"),
    [
        pytest.param({"nvidia.com/gpu": "2"}, 2, id="whole GPUs"),
        pytest.param({"nvidia.com/gpu.shared": "1"}, 1, id="a renamed time-slicing replica"),
        pytest.param({"nvidia.com/mig-1g.10gb": "2"}, 2, id="MIG slices, mixed strategy"),
        pytest.param(
            {"nvidia.com/mig-3g.40gb": "1", "nvidia.com/gpu": "1"}, 2, id="a slice and a GPU"
        ),
        pytest.param({"example.com/fpga": "1"}, 0, id="not a GPU"),
    ],
)
def test_shared_and_partitioned_gpus_count(limits: dict[str, str], want: int) -> None:
    assert pod_gpus(pod(limits)) == want
