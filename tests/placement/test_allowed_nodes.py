"""A group's `allowed_nodes`: every policy places only there, and says when the caller's set
is why it could not place (gputopo.placement.allowed)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from gputopo.codec.placement import request_from_proto, request_to_proto
from gputopo.placement import POLICIES, place
from gputopo.placement.result import RejectionCode
from gputopo.request import PlacementRequest, RequestError, request_from_mapping, validate
from tests.builders import nvswitch_node, snapshot
from tests.placement.test_properties import clusters, requests


@st.composite
def restricted(draw: st.DrawFn) -> tuple[Any, PlacementRequest]:
    cluster = draw(clusters())
    request = draw(requests())
    names = sorted(cluster.nodes)
    groups = []
    for g in request.groups:
        if draw(st.booleans()):
            chosen = draw(st.sets(st.sampled_from(names), min_size=1))
            g = dataclasses.replace(g, allowed_nodes=frozenset(chosen))  # noqa: PLW2901
        groups.append(g)
    return cluster, dataclasses.replace(request, groups=tuple(groups))


@given(restricted(), st.sampled_from(sorted(POLICIES)))
def test_no_policy_places_a_pod_outside_its_groups_allowed_nodes(
    case: tuple[Any, PlacementRequest], policy: str
) -> None:
    cluster, request = case
    result, _ = place(cluster, request, policy=policy)
    note(f"{policy}: {result.reason}")
    assert not any(r.code is RejectionCode.INTERNAL for r in result.rejections)
    for pod in result.pods:
        allowed = request.group(pod.group).allowed_nodes
        assert allowed is None or pod.node in allowed, pod


def _two_nodes() -> Any:
    return snapshot([nvswitch_node("a", tiers=("l", "s")), nvswitch_node("b", tiers=("l", "s"))])


def test_the_only_allowed_node_is_used_though_another_is_as_good() -> None:
    request = request_from_mapping(
        {"groups": [{"name": "g", "gpus_per_pod": 8, "allowed_nodes": ["b"]}]}
    )
    result, _ = place(_two_nodes(), request)
    assert result.placed
    assert {p.node for p in result.pods} == {"b"}


def test_groups_with_different_sets_each_keep_their_own() -> None:
    request = request_from_mapping(
        {
            "groups": [
                {"name": "x", "gpus_per_pod": 4, "allowed_nodes": ["b"]},
                {"name": "y", "gpus_per_pod": 4, "allowed_nodes": ["a"]},
            ]
        }
    )
    result, _ = place(_two_nodes(), request)
    assert result.placed
    assert {(p.group, p.node) for p in result.pods} == {("x", "b"), ("y", "a")}


def test_a_refusal_says_the_caller_excluded_nodes() -> None:
    request = request_from_mapping(
        {"groups": [{"name": "g", "pods": 2, "gpus_per_pod": 8, "allowed_nodes": ["a"]}]}
    )
    result, _ = place(_two_nodes(), request)
    assert not result.placed
    first = result.rejections[0]
    assert first.domain == "allowed_nodes"
    assert first.code is RejectionCode.SELECTOR
    assert "1 of 2 nodes excluded by the caller" in first.message


@pytest.mark.parametrize(
    ("group", "field", "reason"),
    [
        pytest.param({"allowed_nodes": []}, "groups[0].allowed_nodes", "is empty", id="empty set"),
        pytest.param({"allowed_nodes": "a"}, "groups[0].allowed_nodes", "a list", id="not a list"),
        pytest.param({"allowed_nodes": [""]}, "groups[0].allowed_nodes", "empty", id="no name"),
        pytest.param(
            {"allowed_nodes": ["ghost-1", "ghost-2"]},
            "groups[0].allowed_nodes",
            "names no node the aggregator knows (ghost-1, ghost-2)",
            id="only unknown nodes",
        ),
    ],
)
def test_a_bad_set_is_refused_naming_the_field(
    group: dict[str, Any], field: str, reason: str
) -> None:
    def judge() -> None:
        request = request_from_mapping({"groups": [{"name": "g", **group}]})
        validate(request)
        place(_two_nodes(), request)

    with pytest.raises(RequestError) as err:
        judge()
    assert err.value.field == field
    assert reason in err.value.reason


def test_unknown_names_beside_a_known_one_are_ignored() -> None:
    request = request_from_mapping(
        {"groups": [{"name": "g", "gpus_per_pod": 8, "allowed_nodes": ["b", "gone"]}]}
    )
    result, _ = place(_two_nodes(), request)
    assert {p.node for p in result.pods} == {"b"}


@pytest.mark.parametrize(
    "allowed",
    [
        pytest.param(None, id="unset stays unset"),
        pytest.param(frozenset(), id="empty stays empty (and is refused by validation)"),
        pytest.param(frozenset({"a", "b"}), id="names"),
    ],
)
def test_codec_round_trip(allowed: frozenset[str] | None) -> None:
    request = request_from_mapping({"groups": [{"name": "g"}, {"name": "h"}]})
    groups = (dataclasses.replace(request.groups[0], allowed_nodes=allowed), request.groups[1])
    request = dataclasses.replace(request, groups=groups)
    back = request_from_proto(request_to_proto(request))
    assert back == request
    assert back.groups[1].allowed_nodes is None
