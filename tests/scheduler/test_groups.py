"""Which pods form a gang, the request it asks for, and which pod takes which placement."""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.placement.result import PlacementResult, PodPlacement
from gputopo.request import Pattern, RequestError, Scope
from scheduler.groups import (
    GroupKey,
    GroupSpec,
    assign,
    build_request,
    group_key,
    missing,
    pod_gpus,
    record_annotations,
    spec_from_coscheduling,
    spec_from_native,
    spec_of_lone_pod,
    stray_label,
)
from tests.scheduler.kubeutil import gpu_pod, pod_group

# A native scheduling.k8s.io/v1beta1 PodGroup as Kubernetes 1.35+ serves it (the test API
# server, 1.20, cannot): field names from k8s.io/api scheduling/v1beta1/types.go
# (PodGroupSpec.schedulingPolicy.gang.minCount, schedulingConstraints.topology[].key).
NATIVE = {
    "apiVersion": "scheduling.k8s.io/v1beta1",
    "kind": "PodGroup",
    "metadata": {"name": "trainer-0", "namespace": "ml"},
    "spec": {
        "workloadRef": {"name": "trainer"},
        "schedulingPolicy": {"gang": {"minCount": 4}},
        "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]},
    },
}


def _native_pod(name: str) -> dict[str, Any]:
    pod = gpu_pod("ml", name, 8, scheduler="gputopo")
    pod["spec"]["schedulingGroup"] = {"podGroupName": "trainer-0"}
    return pod


@pytest.mark.parametrize(
    ("pod", "key"),
    [
        (gpu_pod("a", "p", 1, scheduler="s", pod_group="g"), GroupKey("a", "podgroup", "g")),
        (_native_pod("w-0"), GroupKey("ml", "workload", "trainer-0")),
        (gpu_pod("a", "lone", 1, scheduler="s"), GroupKey("a", "pod", "lone")),
    ],
)
def test_a_pod_belongs_to_its_coscheduling_group_its_native_group_or_itself(
    pod: dict[str, Any], key: GroupKey
) -> None:
    assert group_key(pod) == key


def test_a_native_podgroup_gives_its_gang_minimum_and_its_topology_key_as_a_node_label() -> None:
    spec = spec_from_native(NATIVE)
    assert spec == GroupSpec(
        GroupKey("ml", "workload", "trainer-0"), 4, "", "topology.kubernetes.io/rack"
    )
    pods = [_native_pod(f"w-{i}") for i in range(4)]
    request = build_request(spec, pods)
    (group,) = request.groups
    assert (group.pods, group.gpus_per_pod, group.pattern) == (4, 8, Pattern.ALL_REDUCE)
    # A rack is whatever the label's values say: the binder places once per value, so the
    # request itself carries no scope guessed from the key's name.
    assert group.scope.required is None
    assert request.job == "trainer-0"
    assert request.namespace == "ml"
    assert missing(request, pods[:3]) == {"pods": 1}
    assert missing(request, pods) == {}


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("fabric.topograph.run/tier-0", id="gputopo's own published leaf key"),
        pytest.param("accelerator.topograph.run/domain", id="topograph's NVLink domain key"),
        pytest.param("cloud.google.com/gke-nodepool", id="a GKE key"),
        pytest.param("topology.k8s.aws/network-node-layer-1", id="an AWS key"),
        pytest.param("network.topology.nvidia.com/leaf", id="topograph v0's key"),
        pytest.param("rack", id="a key without a prefix"),
    ],
)
def test_any_node_label_key_is_a_topology_key(key: str) -> None:
    obj = {
        **NATIVE,
        "spec": {**NATIVE["spec"], "schedulingConstraints": {"topology": [{"key": key}]}},
    }  # type: ignore[dict-item]
    spec = spec_from_native(obj)
    assert spec.topology_key == key
    (group,) = build_request(spec, [_native_pod("w-0")]).groups
    assert group.scope.required is None


def test_the_hostname_key_is_the_node_scope() -> None:
    obj = {
        **NATIVE,
        "spec": {
            **NATIVE["spec"],
            "schedulingConstraints": {"topology": [{"key": "kubernetes.io/hostname"}]},
        },
    }  # type: ignore[dict-item]
    (group,) = build_request(spec_from_native(obj), [_native_pod("w-0")]).groups
    assert group.scope.required == Scope.NODE


@pytest.mark.parametrize("key", ["Not A Key", "a/b/c", "-x", "", 7, "x" * 64], ids=repr)
def test_a_topology_key_that_is_no_label_key_is_named(key: object) -> None:
    obj = {
        **NATIVE,
        "spec": {**NATIVE["spec"], "schedulingConstraints": {"topology": [{"key": key}]}},
    }  # type: ignore[dict-item]
    with pytest.raises(RequestError) as err:
        spec_from_native(obj)
    assert err.value.field == "spec.schedulingConstraints.topology[0].key"


def test_the_request_annotation_maps_labelled_pods_to_its_groups() -> None:
    request_text = (
        "groups:\n"
        "  - {name: prefill, pods: 1, gpus_per_pod: 4}\n"
        "  - {name: decode, pods: 2, gpus_per_pod: 2}\n"
        "edges:\n"
        "  - {from: prefill, to: decode, min_gbps: 10}\n"
    )
    spec = spec_from_coscheduling(pod_group("ns", "pd", 3, request_text))
    assert spec.minimum == 3
    pods = [
        gpu_pod("ns", "d-b", 2, scheduler="s", pod_group="pd", group="decode"),
        gpu_pod("ns", "p", 4, scheduler="s", pod_group="pd", group="prefill"),
        gpu_pod("ns", "d-a", 2, scheduler="s", pod_group="pd", group="decode"),
    ]
    request = build_request(spec, pods)
    assert [g.name for g in request.groups] == ["prefill", "decode"]
    assert missing(request, pods[:2]) == {"decode": 1}
    result = PlacementResult(
        placed=True,
        policy="gputopo",
        pods=(
            PodPlacement("decode", 0, 1, 1, "n2", (2, 3)),
            PodPlacement("decode", 0, 0, 0, "n2", (0, 1)),
            PodPlacement("prefill", 0, 0, 0, "n1", (0, 1, 2, 3)),
        ),
    )
    where = assign(request, result, pods)
    assert where["ns/d-a"].gpus == (0, 1)
    assert where["ns/d-b"].gpus == (2, 3)
    assert where["ns/p"].node == "n1"
    assert record_annotations("r1", where["ns/d-b"], 3)["gputopo.io/gpus"] == "2,3"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("groups: [{name: x, pods: 0}]", "gputopo.io/request: groups[0].pods"),
        ("groups: [", "gputopo.io/request"),
        ("{groups: [{name: x, bogus: 1}]}", "gputopo.io/request: groups[0]"),
    ],
)
def test_a_bad_request_annotation_is_named_by_field(text: str, field: str) -> None:
    spec = spec_from_coscheduling(pod_group("ns", "g", 1, text))
    with pytest.raises(RequestError) as err:
        build_request(spec, [gpu_pod("ns", "p", 1, scheduler="s", pod_group="g")])
    assert err.value.field.startswith(field)


def test_a_lone_pod_is_a_gang_of_one_with_its_own_gpus() -> None:
    pod = gpu_pod("ns", "solo", 8, scheduler="s")
    request = build_request(spec_of_lone_pod(pod), [pod])
    assert (request.groups[0].pods, request.groups[0].gpus_per_pod) == (1, 8)
    assert pod_gpus(pod) == 8
    nogpu = gpu_pod("ns", "cpu", 0, scheduler="s")
    with pytest.raises(RequestError, match=r"nvidia\.com/gpu"):
        build_request(spec_of_lone_pod(nogpu), [nogpu])


def test_the_scheduler_serves_the_metric_names_the_conventions_fix() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from scheduler.metrics import SchedulerCollector, SchedulerStats

    stats = SchedulerStats(groups_pending=2, bind_attempts=5, repairs=1)
    stats.decided("bound")
    stats.bound_after(0.3)
    stats.bound_after(400.0)
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(stats))
    text = generate_latest(registry).decode()
    for line in (
        "gputopo_scheduler_groups_pending 2.0",
        'gputopo_scheduler_time_to_bind_seconds_bucket{le="0.5"} 1.0',
        'gputopo_scheduler_time_to_bind_seconds_bucket{le="+Inf"} 2.0',
        "gputopo_scheduler_bind_attempts_total 5.0",
        "gputopo_scheduler_repairs_total 1.0",
        'gputopo_scheduler_decisions_total{outcome="bound"} 1.0',
    ):
        assert line in text


def test_a_label_that_names_no_group_of_the_request_is_said_not_waited_for() -> None:
    """Seen in testing: a lone pod labelled gputopo.io/group=g (its request has one group,
    named for the pod) was never counted, and waited for its gang's minimum forever."""
    pods = [gpu_pod("ns", "p-0", 8, scheduler="s", group="g")]
    request = build_request(spec_of_lone_pod(pods[0]), pods)
    why = stray_label(request, pods)
    assert why is not None
    assert why.startswith("gputopo.io/group: 'g' of pod ns/p-0 names no group of the request")
    unlabelled = [gpu_pod("ns", "p-1", 8, scheduler="s")]
    assert (
        stray_label(build_request(spec_of_lone_pod(unlabelled[0]), unlabelled), unlabelled) is None
    )
