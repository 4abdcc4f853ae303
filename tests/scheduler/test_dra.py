"""The claim allocation the binder writes, on objects shaped as resource.k8s.io/v1 types."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from aggregator.claims import SliceIndex, claimed_devices, located
from gputopo.machines import load_machine
from scheduler.dra import DraError, SliceDevice, claim_names, claim_status, slice_devices
from tests.scheduler.test_dra_kube import resource_slice

NODE = "h100-01"
TOPOLOGY = load_machine("dgx-h100", node_name=NODE)
UUIDS = [g.uuid for g in TOPOLOGY.gpus]
SLICE = resource_slice("s", NODE, UUIDS)
DEVICES = slice_devices([SLICE], node=NODE)
POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}
NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def request(name: str = "gpus", **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}


def claim(*requests: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": list(requests)}},
        "status": status or {},
    }


@dataclass(frozen=True)
class Case:
    claim: dict[str, Any]
    gpus: tuple[int, ...]
    want_devices: tuple[tuple[str, str], ...] = ()  # (request, device)
    want_left: tuple[int, ...] = ()
    want_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    pytest.param(
        Case(claim(request(count=2)), (5, 4), (("gpus", "gpu-2"), ("gpus", "gpu-3"))),
        id="two GPUs by uuid: the devices are named by minor, in rank order",
    ),
    pytest.param(
        Case(claim(request()), (0, 1), (("gpus", "gpu-7"),), want_left=(1,)),
        id="count defaults to one; the rest is left for the pod's next claim",
    ),
    pytest.param(
        Case(
            claim(request("a", count=1), request("b", allocationMode="All")),
            (3, 2, 1),
            (("a", "gpu-4"), ("b", "gpu-5"), ("b", "gpu-6")),
        ),
        id="requests take their share in order; All takes the rest",
    ),
    pytest.param(
        Case(claim(request(count=3)), (0, 1), want_error="spec.devices.requests[0].exactly.count"),
        id="more GPUs asked than chosen names the count",
    ),
    pytest.param(
        Case(
            claim({"name": "x", "firstAvailable": []}),
            (0,),
            want_error="spec.devices.requests[0].firstAvailable",
        ),
        id="firstAvailable is refused by field",
    ),
    pytest.param(
        Case(
            claim(request(adminAccess=True)),
            (0,),
            want_error="spec.devices.requests[0].exactly.adminAccess",
        ),
        id="adminAccess is not a workload's GPU",
    ),
    pytest.param(
        Case(
            claim({"name": "n", "exactly": {"deviceClassName": "rdma.example.com"}}),
            (0,),
            want_error="spec.devices.requests[0].exactly.deviceClassName",
        ),
        id="another device class is refused by field",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_claim_status(case: Case) -> None:
    chosen = [UUIDS[g] for g in case.gpus]
    if case.want_error:
        with pytest.raises(DraError) as info:
            claim_status(case.claim, pod=POD, node=NODE, gpus=chosen, devices=DEVICES, now=NOW)
        assert info.value.field == case.want_error
        return
    status, left = claim_status(
        case.claim, pod=POD, node=NODE, gpus=chosen, devices=DEVICES, now=NOW
    )
    results = status["allocation"]["devices"]["results"]
    assert tuple((r["request"], r["device"]) for r in results) == case.want_devices
    assert {(r["driver"], r["pool"]) for r in results} == {("gpu.nvidia.com", NODE)}
    assert left == [UUIDS[g] for g in case.want_left]
    assert status["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "u-1"}]
    assert status["allocation"]["allocationTimestamp"] == "2026-11-25T12:00:00Z"
    # Read back as the aggregator reads it: the same GPUs, by UUID.
    index = SliceIndex()
    index.set_slice("s", SLICE)
    allocated = {**case.claim, "status": status}
    held, unlocated = located(claimed_devices([allocated], slices=index), TOPOLOGY)
    assert held == set(case.gpus) - set(case.want_left)
    assert unlocated == 0


def test_a_gpu_missing_from_the_slice_stops_the_pod() -> None:
    with pytest.raises(DraError, match=r"no gpu\.nvidia\.com device with uuid GPU-gone"):
        claim_status(claim(request()), pod=POD, node=NODE, gpus=["GPU-gone"], devices=DEVICES)


def test_an_allocated_shared_claim_is_only_reserved_for_the_pod_too() -> None:
    allocated = {"allocation": {"devices": {"results": []}}, "reservedFor": [{"uid": "u-0"}]}
    status, left = claim_status(
        claim(request(), status=allocated), pod=POD, node=NODE, gpus=[UUIDS[0]], devices=DEVICES
    )
    assert status["allocation"] == allocated["allocation"]
    assert [r["uid"] for r in status["reservedFor"]] == ["u-0", "u-1"]
    assert left == [UUIDS[0]]


def test_mig_devices_are_not_whole_gpus_and_other_nodes_slices_are_not_read() -> None:
    mig = resource_slice("m", NODE, UUIDS[:1])
    mig["spec"]["devices"][0]["attributes"]["type"] = {"string": "mig"}
    other = resource_slice("o", "elsewhere", UUIDS[1:2])
    assert slice_devices([mig, other], node=NODE) == {}
    assert slice_devices([SLICE], node=NODE)[UUIDS[0].lower()] == SliceDevice(
        "gpu.nvidia.com", NODE, "gpu-7"
    )


def test_claim_names_follow_the_pod_spec_and_the_template_claims_made() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "t"},
                {"name": "c", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]},
    }
    assert claim_names(pod) == ["shared", "p-b-x1"]  # c: not created yet


def test_admin_access_results_hold_nothing() -> None:
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "r",
                        "driver": "gpu.nvidia.com",
                        "pool": NODE,
                        "device": "gpu-0",
                        "adminAccess": True,
                    }
                ]
            }
        }
    }
    assert claimed_devices([claim(request(), status=status)]) == []
