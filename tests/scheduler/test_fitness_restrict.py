"""The binder's node fitness step, away from the API server (scheduler/fitness.py): each
request group gets the nodes all its pods fit, or the gang is stopped with kube-scheduler's
reason before Place."""

from __future__ import annotations

from typing import Any

from gputopo.fitness import FitnessView
from gputopo.request import request_from_mapping
from scheduler.fitness import restrict_request
from tests.test_fitness import node, pod


def _named(name: str, group: str = "", **kw: Any) -> dict[str, Any]:
    p = pod(**kw)
    p["metadata"] = {"namespace": "ns", "name": name, "labels": {}}
    if group:
        p["metadata"]["labels"]["gputopo.io/group"] = group
    return p


VIEW = FitnessView(
    [
        node("a", labels={"pool": "x"}),
        node("b", labels={"pool": "y"}),
        node("c", cordoned=True),
    ],
    [],
)


def test_a_group_gets_the_nodes_every_pod_of_it_fits() -> None:
    request = request_from_mapping({"groups": [{"name": "g", "pods": 2}]})
    pods = [_named("p0"), _named("p1", selector={"pool": "y"})]
    verdict = restrict_request(request, pods, VIEW)
    assert verdict.request is not None
    assert verdict.request.groups[0].allowed_nodes == frozenset({"b"})


def test_groups_are_judged_by_their_own_pods() -> None:
    request = request_from_mapping({"groups": [{"name": "x"}, {"name": "y"}]})
    pods = [
        _named("p0", "x", selector={"pool": "x"}),
        _named("p1", "y", selector={"pool": "y"}),
    ]
    verdict = restrict_request(request, pods, VIEW)
    assert verdict.request is not None
    assert [g.allowed_nodes for g in verdict.request.groups] == [
        frozenset({"a"}),
        frozenset({"b"}),
    ]


def test_a_pod_that_fits_nowhere_stops_the_gang_with_kube_schedulers_words() -> None:
    request = request_from_mapping({"groups": [{"name": "g", "pods": 2}]})
    pods = [_named("p0"), _named("p1", selector={"pool": "z"})]
    verdict = restrict_request(request, pods, VIEW)
    assert verdict.request is None
    assert verdict.message == (
        "pod ns/p1: 0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't"
        " match Pod's node affinity. (0/3 nodes fit (rejected by NodeUnschedulable: 1,"
        " NodeAffinity: 2))"
    )


def test_pods_with_no_node_in_common_stop_the_gang() -> None:
    request = request_from_mapping({"groups": [{"name": "g", "pods": 2}]})
    pods = [_named("p0", selector={"pool": "x"}), _named("p1", selector={"pool": "y"})]
    verdict = restrict_request(request, pods, VIEW)
    assert verdict.request is None
    assert verdict.message == "the pods of group g fit no node in common (pod ns/p1 fits only b)"


def test_the_requests_own_set_narrows_further() -> None:
    request = request_from_mapping({"groups": [{"name": "g", "allowed_nodes": ["a", "c"]}]})
    verdict = restrict_request(request, [_named("p0")], VIEW)
    assert verdict.request is not None
    assert verdict.request.groups[0].allowed_nodes == frozenset({"a"})


def test_a_request_set_that_no_pod_fits_is_said_so() -> None:
    request = request_from_mapping({"groups": [{"name": "g", "allowed_nodes": ["c"]}]})
    verdict = restrict_request(request, [_named("p0")], VIEW)
    assert verdict.request is None
    assert (
        verdict.message
        == "none of the nodes group g's request allows fits its pods (they fit a, b)"
    )
