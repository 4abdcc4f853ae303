"""The pod vocabulary: one GPU-count rule, as Kubernetes counts, for every process that reads pods.

The cases follow k8s.io/component-helpers `resource/helpers.go` (`PodRequests`): regular
containers and sidecars (init containers with `restartPolicy: Always`) add up, each plain init
container runs beside the sidecars started before it, and `spec.overhead` is added on top.
"""

from __future__ import annotations

from typing import Any

import pytest

import scheduler.groups
from aggregator.occupancy import pod_use
from gputopo.placement.result import PodPlacement
from gputopo.pods import PodRecord, decode_gpus, pod_ask, pod_gpus
from gputopo.request import RequestError
from scheduler.groups import record_annotations


def _c(gpus: int | str | None, *, limit: bool = True, sidecar: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "resources": {}}
    if gpus is not None:
        container["resources"]["limits" if limit else "requests"] = {"nvidia.com/gpu": gpus}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


def _pod(
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    overhead: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, "nodeName": "n1"}
    if init is not None:
        spec["initContainers"] = init
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"namespace": "ns", "name": "p"}, "spec": spec}


CASES = [
    pytest.param(_pod([_c(2), _c(1)]), 3, id="containers add up"),
    pytest.param(_pod([_c(2, limit=False)]), 2, id="a request counts when there is no limit"),
    pytest.param(_pod([_c(None)]), 0, id="a container without GPUs asks for none"),
    pytest.param(_pod([_c("two")]), 0, id="a count that is not a number asks for none"),
    pytest.param(_pod([_c(2)], init=[_c(4)]), 4, id="an init container asking more sets it"),
    pytest.param(_pod([_c(4)], init=[_c(2), _c(3)]), 4, id="smaller init containers do not add"),
    pytest.param(_pod([_c(2)], init=[_c(1, sidecar=True)]), 3, id="a sidecar runs beside"),
    pytest.param(
        _pod([_c(1)], init=[_c(1, sidecar=True), _c(4)]),
        5,
        id="an init container after a sidecar runs beside it",
    ),
    pytest.param(
        _pod([_c(1)], init=[_c(4), _c(1, sidecar=True)]),
        4,
        id="an init container before the sidecar runs alone",
    ),
    pytest.param(
        _pod([_c(2)], overhead={"nvidia.com/gpu": "1", "cpu": "250m"}),
        3,
        id="overhead that names GPUs adds to them",
    ),
    pytest.param(_pod([_c(2)], overhead={"cpu": "250m"}), 2, id="overhead of other resources"),
]


@pytest.mark.parametrize(("pod", "want"), CASES)
def test_every_reader_counts_a_pod_as_kubernetes_does(pod: dict[str, Any], want: int) -> None:
    # The aggregator's occupancy, the extender and the binder read the same rule; the binder
    # refuses a count that is not a whole number instead of reading none (next test).
    use = pod_use(pod)
    assert (pod_gpus(pod), use.gpus if use else 0, pod_ask(pod).gpus) == (want, want, want)
    try:
        binder = scheduler.groups.pod_gpus(pod)
    except RequestError:
        binder = None
    assert binder == (None if want == 0 and "two" in repr(pod) else want)


def test_the_binder_refuses_a_gpu_count_that_is_not_a_number() -> None:
    with pytest.raises(RequestError, match=r"spec\.containers"):
        scheduler.groups.pod_gpus(_pod([_c("two")]))


def test_the_record_is_what_the_binder_writes_and_reads_back() -> None:
    where = PodPlacement("tp", 1, 2, 5, "n1", (3, 1))
    record = PodRecord("r1", "n1", (3, 1), 8, replica=1, pod=2, rank=5, uuids=("GPU-3", "GPU-1"))
    written = record_annotations("r1", where, 8, {3: "GPU-3", 1: "GPU-1"})
    assert record.annotations() == written
    assert PodRecord.from_annotations(written) == record
    assert decode_gpus(written["gputopo.io/gpus"], 2) == frozenset({1, 3})


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({}, None, id="no reservation: no record"),
        pytest.param(
            {"gputopo.io/reservation": "r", "gputopo.io/gpus": "0,x"}, None, id="a bad index"
        ),
        pytest.param(
            {"gputopo.io/reservation": "r", "gputopo.io/gang-size": "many"}, None, id="bad size"
        ),
    ],
)
def test_a_partial_record_is_no_record(annotations: dict[str, str], want: None) -> None:
    assert PodRecord.from_annotations(annotations) is want


@pytest.mark.parametrize(
    ("text", "count", "want"),
    [
        pytest.param("0,1", 2, {0, 1}, id="as many indices as the pod holds"),
        pytest.param("0,1", 3, set(), id="another count locates nothing"),
        pytest.param("0,-1", None, set(), id="a negative index"),
        pytest.param("", None, set(), id="absent"),
    ],
)
def test_decoding_recorded_gpus(text: str, count: int | None, want: set[int]) -> None:
    assert decode_gpus(text, count) == frozenset(want)


@pytest.mark.parametrize(
    ("limits", "want"),
    [
        pytest.param({"nvidia.com/gpu.shared": "1"}, 1, id="a renamed time-slicing replica"),
        pytest.param({"nvidia.com/mig-1g.10gb": "2"}, 2, id="MIG slices, one GPU each"),
        pytest.param({"example.com/fpga": "1"}, 0, id="another device is no GPU"),
    ],
)
def test_shared_and_sliced_gpus_count_as_held(limits: dict[str, str], want: int) -> None:
    pod = _pod([{"name": "c", "resources": {"limits": limits}}])
    assert pod_gpus(pod) == want
