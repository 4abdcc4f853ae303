"""Every user-writable value the binder reads, fuzzed: each is either understood or refused as
a `RequestError` naming its field, never any other exception (which used to end the binder
task while the process kept its Lease). `MALFORMED` holds the kinds of value the fuzzer found
refused; the API-server test binds other groups beside a group carrying each of them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.request import PlacementRequest, RequestError
from scheduler.groups import (
    SIZE_ANNOTATION,
    GroupKey,
    build_request,
    gang_size,
    pod_gpus,
    spec_from_coscheduling,
    spec_from_native,
    spec_from_workload_v1alpha1,
)
from tests.scheduler.kubeutil import gpu_pod

_T = TypeVar("_T")

# Values of each JSON type, nested a little: what a user (or a typo) can put in an object.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["3", " 2 ", "+4", "-1", "0", "1e3", "0x10", "٣", "2147483648", "true"]),
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
# Text that is often YAML of the request schema's shape, often not.
REQUEST_TEXT = st.one_of(
    st.text(max_size=60),
    JSON.map(json.dumps),
    st.fixed_dictionaries(
        {
            "groups": st.lists(
                st.dictionaries(
                    st.sampled_from(
                        ["name", "pods", "gpus_per_pod", "pattern", "replicas", "scope", "spread"]
                    ),
                    JSON,
                    max_size=5,
                ),
                max_size=2,
            )
        },
        optional={"edges": JSON, "scope": JSON, "node_selector": JSON, "priority": JSON},
    ).map(json.dumps),
)

# The kinds of malformed value the fuzzing below refuses, for the API-server test.
MALFORMED: dict[str, list[str]] = {
    "gputopo.io/request": ["{", "[1, 2]", "groups: 7", '{"groups": [{"pods": "x"}]}', "- -"],
    SIZE_ANNOTATION: ["", "abc", "0", "-3", "2.5", "99999999999", "true", "¹"],
}


def _outcome(call: Callable[[], _T]) -> tuple[_T | None, str | None]:
    """What a read gave, or the field its `RequestError` named (any other exception fails)."""
    try:
        return call(), None
    except RequestError as err:
        return None, err.field


def _podgroup(spec: Any, annotations: Any = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "g", "namespace": "n", "annotations": annotations or {}},
        "spec": spec,
    }


@settings(max_examples=300, deadline=None)
@given(min_member=JSON, timeout=JSON)
def test_a_coscheduling_podgroup_is_read_or_refused_by_field(min_member: Any, timeout: Any) -> None:
    obj = _podgroup({"minMember": min_member, "scheduleTimeoutSeconds": timeout})
    spec, field = _outcome(lambda: spec_from_coscheduling(obj))
    if field is not None:
        assert field in ("spec.minMember", "spec.scheduleTimeoutSeconds")
        return
    assert spec is not None
    assert spec.minimum >= 1
    assert spec.timeout_s is None or spec.timeout_s >= 1


@settings(max_examples=300, deadline=None)
@given(policy=JSON, constraints=JSON)
def test_a_native_podgroup_is_read_or_refused_by_field(policy: Any, constraints: Any) -> None:
    obj = _podgroup({"schedulingPolicy": policy, "schedulingConstraints": constraints})
    spec, field = _outcome(lambda: spec_from_native(obj))
    if field is not None:
        assert field.startswith(("spec.schedulingPolicy", "spec.schedulingConstraints"))
        return
    assert spec is not None
    assert spec.minimum >= 1


@settings(max_examples=200, deadline=None)
@given(groups=JSON)
def test_a_1_35_workload_is_read_or_refused_by_field(groups: Any) -> None:
    key = GroupKey("n", "workloadref", "w/workers")
    spec, field = _outcome(
        lambda: spec_from_workload_v1alpha1({"spec": {"podGroups": groups}}, key)
    )
    if field is not None:
        assert field.startswith("spec.podGroups")
        return
    assert spec is not None
    assert spec.minimum >= 1


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.text(max_size=12), JSON))
def test_a_recorded_gang_size_is_read_or_refused_by_field(value: Any) -> None:
    pod = {"metadata": {"annotations": {SIZE_ANNOTATION: value}}}
    size, field = _outcome(lambda: gang_size(pod))
    if field is not None:
        assert field == f"metadata.annotations[{SIZE_ANNOTATION}]"
        return
    assert size is not None
    assert size >= 1


@settings(max_examples=300, deadline=None)
@given(text=REQUEST_TEXT)
def test_a_request_annotation_is_read_or_refused_by_field(text: str) -> None:
    spec = spec_from_coscheduling(_podgroup({"minMember": 2}, {"gputopo.io/request": text}))
    pods = [gpu_pod("n", f"p-{i}", 2, scheduler="s", pod_group="g") for i in range(2)]
    request, field = _outcome(lambda: build_request(spec, pods))
    if field is not None:
        assert field.startswith("gputopo.io/request")
        return
    assert request is not None
    assert isinstance(request, PlacementRequest)


@settings(max_examples=200, deadline=None)
@given(limit=JSON, init=JSON)
def test_a_pods_gpu_count_is_read_or_refused_by_field(limit: Any, init: Any) -> None:
    pod = {
        "spec": {
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": limit}}}],
            "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": init}}}],
        }
    }
    gpus, field = _outcome(lambda: pod_gpus(pod))
    if field is not None:
        assert field.startswith(("spec.containers[0]", "spec.initContainers[0]"))
        return
    assert gpus is not None
    assert gpus >= 0


def test_the_listed_malformed_values_are_refused() -> None:
    """The values the API-server test uses are refused here too (so it tests refusals)."""
    pods = [gpu_pod("n", "p", 2, scheduler="s", pod_group="g")]
    for text in MALFORMED["gputopo.io/request"]:
        spec = spec_from_coscheduling(_podgroup({"minMember": 1}, {"gputopo.io/request": text}))
        try:
            build_request(spec, pods)
        except RequestError:
            continue
        raise AssertionError(f"not refused: {text!r}")
    for value in MALFORMED[SIZE_ANNOTATION]:
        try:
            gang_size({"metadata": {"annotations": {SIZE_ANNOTATION: value}}})
        except RequestError:
            continue
        raise AssertionError(f"not refused: {value!r}")


def test_a_pods_gpus_follow_kubernetes_with_init_containers() -> None:
    def pod(regular: list[int], init: list[int]) -> dict[str, Any]:
        def c(n: int) -> dict[str, Any]:
            return {"resources": {"limits": {"nvidia.com/gpu": str(n)}}}

        return {
            "spec": {"containers": [c(n) for n in regular], "initContainers": [c(n) for n in init]}
        }

    assert pod_gpus(pod([2, 2], [])) == 4
    assert pod_gpus(pod([2, 2], [8, 1])) == 8  # the largest init container wins
    assert pod_gpus(pod([2, 2], [3])) == 4  # the sum of the regular ones wins
    requests_only = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": 2}}}]}}
    assert pod_gpus(requests_only) == 2
