"""DRA ResourceClaims hold GPUs: read from recorded `resource.k8s.io/v1` objects.

The 1.20 test API server does not serve that API (see the README), so the objects are recorded
to the upstream types rather than read from a server.
"""

from __future__ import annotations

import json
from pathlib import Path

from aggregator.claims import ClaimedDevice, claimed_devices
from aggregator.state import ClusterState
from tests.builders import pcie_node

CLAIMS = json.loads(
    (Path(__file__).parent.parent / "data" / "dra" / "resourceclaims_v1.json").read_text()
)


def test_allocated_gpu_claims_are_used_on_their_node_and_nothing_else_is() -> None:
    found = claimed_devices(CLAIMS["items"], nodes={"h100-01", "h100-02"})
    assert found == [
        ClaimedDevice("h100-01", 0, "gpu-0", "team-a/train-0-gpus"),
        ClaimedDevice("h100-01", 1, "gpu-1", "team-a/train-0-gpus"),
        # a MIG slice of GPU 3: GPU 3 is not free for a whole-GPU placement
        ClaimedDevice("h100-02", 3, "gpu-3-mig-1g10gb-0", "team-b/serve-mig", whole=False),
    ]


def test_a_node_selector_wins_over_the_pool_name() -> None:
    claim = json.loads(json.dumps(CLAIMS["items"][0]))
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = "pool-of-another-name"
    found = claimed_devices([claim], nodes={"h100-01"})
    assert {d.node for d in found} == {"h100-01"}


def test_other_drivers_count_when_named() -> None:
    found = claimed_devices(CLAIMS["items"], nodes={"h100-01"}, drivers={"rdma.example.com"})
    assert found == [ClaimedDevice("h100-01", None, "mlx5-0", "team-a/nic", whole=False)]


def test_claimed_gpus_leave_the_free_ones_and_come_back_when_deallocated() -> None:
    state = ClusterState(clock=lambda: 1000.0)
    state.add_static(pcie_node("h100-01", gpus=8))
    devices = claimed_devices(CLAIMS["items"], nodes={"h100-01"})
    state.set_claim("team-a/train-0-gpus", [d for d in devices if d.claim == "team-a/train-0-gpus"])
    assert state.snapshot().node("h100-01").free == frozenset(range(2, 8))
    state.set_claim("team-a/train-0-gpus", [])  # deallocated or deleted
    assert len(state.snapshot().node("h100-01").free) == 8


def test_a_claim_seen_before_its_node_reports_still_holds_when_it_does() -> None:
    state = ClusterState(clock=lambda: 1000.0)
    claim = CLAIMS["items"][0]
    state.set_claim("team-a/train-0-gpus", claimed_devices([claim]))  # no node known yet
    state.add_static(pcie_node("h100-01", gpus=8))
    assert state.snapshot().node("h100-01").free == frozenset(range(2, 8))
