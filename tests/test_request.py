"""Request validation: every error names the field a user has to fix."""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.request import Pairing, Pattern, RequestError, Scope, request_from_mapping


def test_the_simple_case_is_one_line() -> None:
    req = request_from_mapping({"groups": [{"name": "tp", "gpus_per_pod": 8}]})
    (group,) = req.groups
    assert (group.pods, group.gpus_per_pod, group.replicas) == (1, 8, 1)
    assert group.pattern is Pattern.ALL_REDUCE
    assert req.total_gpus == 8


def test_full_form() -> None:
    req = request_from_mapping(
        {
            "job": "serve",
            "scope": {"required": "spine", "preferred": "leaf"},
            "node_selector": {"gpu": "h100"},
            "groups": [
                {
                    "name": "prefill",
                    "replicas": 2,
                    "gpus_per_pod": 4,
                    "spread": {"across": "node", "required": True},
                },
                {
                    "name": "decode",
                    "replicas": 2,
                    "gpus_per_pod": 4,
                    "pattern": "all_to_all",
                    "scope": {"required": "nvlink"},
                    "message_bytes": 1024,
                },
            ],
            "edges": [
                {"from": "prefill", "to": "decode", "min_gbps": 300, "pairing": "one_to_one"}
            ],
        }
    )
    assert req.scope.required is Scope.SPINE
    assert req.scope.preferred is Scope.LEAF
    assert req.groups[1].scope.required is Scope.NVLINK
    assert req.groups[0].spread is not None
    assert req.groups[0].spread.required
    assert req.edges[0].pairing is Pairing.ONE_TO_ONE
    assert req.edges[0].required_gbps == 300
    assert req.total_gpus == 16


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        pytest.param({}, "groups", "list", id="groups are required"),
        pytest.param({"groups": []}, "groups", "at least one", id="an empty request"),
        pytest.param(
            {"groups": [{"gpus_per_pod": 8}]},
            "groups[0].name",
            "required",
            id="a group needs a name",
        ),
        pytest.param(
            {"groups": [{"name": "a", "gpus_per_pod": 0}]},
            "groups[0].gpus_per_pod",
            "at least 1",
            id="zero GPUs per pod",
        ),
        pytest.param(
            {"groups": [{"name": "a", "pods": "4"}]},
            "groups[0].pods",
            "integer",
            id="a string where a number belongs",
        ),
        pytest.param(
            {"groups": [{"name": "a", "pods": True}]},
            "groups[0].pods",
            "integer",
            id="a boolean is not a count",
        ),
        pytest.param(
            {"groups": [{"name": "a"}, {"name": "a"}]},
            "groups[1].name",
            "duplicate",
            id="duplicate group names",
        ),
        pytest.param(
            {"groups": [{"name": "Bad Name"}]},
            "groups[0].name",
            "valid name",
            id="names follow Kubernetes rules",
        ),
        pytest.param(
            {"groups": [{"name": "a", "scope": {"required": "rackk"}}]},
            "groups[0].scope.required",
            "unknown scope",
            id="a misspelt scope",
        ),
        pytest.param(
            {"groups": [{"name": "a", "pattern": "allreduce"}]},
            "groups[0].pattern",
            "unknown value",
            id="a misspelt pattern",
        ),
        pytest.param(
            {"groups": [{"name": "a", "gpu": 8}]},
            "groups[0].gpu",
            "unknown field",
            id="an unknown field is not silently ignored",
        ),
        pytest.param(
            {"groups": [{"name": "a"}], "edges": [{"from": "a", "to": "b"}]},
            "edges[0].to",
            "no group named",
            id="an edge to nowhere is named by its YAML key",
        ),
        pytest.param(
            {"groups": [{"name": "a"}], "edges": [{"from": "c", "to": "a"}]},
            "edges[0].from",
            "no group named",
            id="an edge from nowhere is named by its YAML key",
        ),
        pytest.param(
            {"groups": [{"name": "a"}], "edges": [{"from": "a", "to": "a"}]},
            "edges[0]",
            "two different",
            id="a self edge",
        ),
        pytest.param(
            {
                "groups": [{"name": "a"}, {"name": "b"}],
                "edges": [{"from": "a", "to": "b", "min_gbps": -1}],
            },
            "edges[0].min_gbps",
            "negative",
            id="negative bandwidth",
        ),
        pytest.param(
            {
                "groups": [{"name": "a"}, {"name": "b"}],
                "edges": [{"from": "a", "to": "b", "max_transfer_seconds": 1}],
            },
            "edges[0]",
            "together",
            id="a time without a size",
        ),
        pytest.param(
            {
                "groups": [{"name": "a", "replicas": 2}, {"name": "b"}],
                "edges": [{"from": "a", "to": "b", "pairing": "one_to_one"}],
            },
            "edges[0].pairing",
            "equal replicas",
            id="one-to-one needs equal replicas",
        ),
        pytest.param(
            {"scope": {"required": "leaf", "preferred": "spine"}, "groups": [{"name": "a"}]},
            "scope.preferred",
            "wider",
            id="a preference wider than the requirement",
        ),
        pytest.param(
            {"groups": [{"name": "a", "spread": {"across": "node", "required": True}}]},
            "groups[0].spread",
            "2 replicas",
            id="a required spread of one replica",
        ),
        pytest.param(
            {"groups": [{"name": "a", "pods": 10**6, "gpus_per_pod": 8}]},
            "groups",
            "more than",
            id="an absurd size is a typo",
        ),
        pytest.param([], "request", "mapping", id="not a mapping at all"),
    ],
)
def test_errors_name_the_field(data: Any, field: str, reason: str) -> None:
    with pytest.raises(RequestError) as info:
        request_from_mapping(data)
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value).startswith(f"{field}: ")


def test_transfer_time_becomes_a_bandwidth_need() -> None:
    req = request_from_mapping(
        {
            "groups": [{"name": "p"}, {"name": "d"}],
            "edges": [
                {
                    "from": "p",
                    "to": "d",
                    "transfer_bytes": 6 * 10**9,
                    "max_transfer_seconds": 0.02,
                    "min_gbps": 100,
                }
            ],
        }
    )
    assert req.edges[0].required_gbps == pytest.approx(300)


def test_scope_aliases() -> None:
    req = request_from_mapping({"scope": {"required": "tier-0"}, "groups": [{"name": "a"}]})
    assert req.scope.required is Scope.LEAF
