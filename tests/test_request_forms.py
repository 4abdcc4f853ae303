"""One meaning of a request in every form: YAML, JSON (the HTTP mirror), gRPC and the page.

Seen before: a request without `pattern` meant all-reduce in YAML but "no communication" over
HTTP and gRPC (protobuf's zero value), so the same 2 x 8 went to different leaves, and
`PATTERN_ALL_REDUCE` worked over HTTP but not in a file. Each case below is one request written
in several spellings; every spelling through every form must give the same domain request.
The end-to-end half (`tests/placement/test_request_forms_http.py`) places one over the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from gputopo.codec import request_from_proto, request_to_proto
from gputopo.codec.placement import request_json_with_wire_names
from gputopo.request import (
    Constraint,
    Edge,
    Group,
    Pairing,
    Pattern,
    PlacementRequest,
    RequestError,
    Scope,
    Spread,
    request_from_mapping,
    validate,
)
from gputopo.v1 import placement_pb2 as ppb


def from_yaml(data: dict[str, Any]) -> PlacementRequest:
    """A request file, as `gputopo place -f` reads it."""
    return request_from_mapping(yaml.safe_load(yaml.safe_dump(data)))


def from_json(data: dict[str, Any]) -> PlacementRequest:
    """The HTTP mirror's body `request`, parsed the way `aggregator.http_placement` does."""
    msg = json_format.ParseDict(request_json_with_wire_names(data), ppb.PlacementRequest())
    request = request_from_proto(msg)
    validate(request)
    return request


def from_grpc(data: dict[str, Any]) -> PlacementRequest:
    """A gRPC client's message: built by protobuf's own JSON parser from the wire names only
    (so an absent field is protobuf's zero value), then sent as bytes."""
    msg = json_format.ParseDict(request_json_with_wire_names(data), ppb.PlacementRequest())
    wire = ppb.PlacementRequest.FromString(msg.SerializeToString())
    request = request_from_proto(wire)
    validate(request)
    return request


FORMS = {"yaml": from_yaml, "json": from_json, "grpc": from_grpc}


@dataclass(frozen=True)
class Case:
    spellings: tuple[dict[str, Any], ...]
    want: PlacementRequest
    forms: tuple[str, ...] = ("yaml", "json", "grpc")


def _one(group: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"job": "j", "groups": [{"name": "tp", **group}], **top}


CASES = [
    pytest.param(
        Case(
            spellings=(
                _one({"pods": 2, "gpus_per_pod": 8}),
                _one({"pods": 2, "gpus_per_pod": 8, "pattern": "all_reduce"}),
                _one({"pods": 2, "gpus_per_pod": 8, "pattern": "all-reduce"}),
                _one({"pods": 2, "gpus_per_pod": 8, "pattern": "PATTERN_ALL_REDUCE"}),
                _one({"pods": 2, "gpus_per_pod": 8, "pattern": "PATTERN_UNSPECIFIED"}),
                _one({"pods": 2, "gpus_per_pod": 8, "pattern": "pattern_all_reduce"}),
            ),
            want=PlacementRequest(
                job="j", groups=(Group("tp", pods=2, gpus_per_pod=8, pattern=Pattern.ALL_REDUCE),)
            ),
        ),
        id="a 2x8 without a pattern is an all-reduce in every form and spelling",
    ),
    pytest.param(
        Case(
            spellings=(
                _one({"gpus_per_pod": 4, "pattern": "none"}),
                _one({"gpus_per_pod": 4, "pattern": "PATTERN_NONE"}),
            ),
            want=PlacementRequest(
                job="j", groups=(Group("tp", gpus_per_pod=4, pattern=Pattern.NONE),)
            ),
        ),
        id="no communication must be said, and is said either way",
    ),
    pytest.param(
        Case(
            spellings=(
                _one({"gpus_per_pod": 4, "pattern": "all-to-all"}),
                _one({"gpus_per_pod": 4, "pattern": "PATTERN_ALL_TO_ALL"}),
                _one({"gpus_per_pod": 4, "pattern": 3}),
            ),
            want=PlacementRequest(
                job="j", groups=(Group("tp", gpus_per_pod=4, pattern=Pattern.ALL_TO_ALL),)
            ),
            forms=("json", "grpc"),  # a bare number is protobuf's, not the YAML form's
        ),
        id="all-to-all by name, proto name or number",
    ),
    pytest.param(
        Case(
            spellings=(
                _one({"gpus_per_pod": 8}, scope={"required": "leaf", "preferred": "nvlink"}),
                _one(
                    {"gpus_per_pod": 8},
                    scope={"required": "SCOPE_LEAF", "preferred": "SCOPE_NVLINK"},
                ),
                _one(
                    {"gpus_per_pod": 8}, scope={"required": "tier-0", "preferred": "nvlink-domain"}
                ),
            ),
            want=PlacementRequest(
                job="j",
                groups=(Group("tp", gpus_per_pod=8),),
                scope=Constraint(Scope.LEAF, Scope.NVLINK),
            ),
        ),
        id="scopes by name, alias or proto name",
    ),
    pytest.param(
        Case(
            spellings=(
                _one({"gpus_per_pod": 8}, scope={"required": "SCOPE_UNSPECIFIED"}),
                _one({"gpus_per_pod": 8}, scope={}),
                _one({"gpus_per_pod": 8}),
            ),
            want=PlacementRequest(job="j", groups=(Group("tp", gpus_per_pod=8),)),
        ),
        id="an unspecified scope is no constraint",
    ),
    pytest.param(
        Case(
            spellings=tuple(
                {
                    "job": "pd",
                    "scope": {"required": leaf},
                    "groups": [
                        {"name": "prefill", "replicas": 2, "gpus_per_pod": 4},
                        {
                            "name": "decode",
                            "replicas": 2,
                            "gpus_per_pod": 4,
                            "spread": {"across": node, "required": True},
                        },
                    ],
                    "edges": [
                        {"from": "prefill", "to": "decode", "min_gbps": 300, "pairing": pairing}
                    ],
                }
                for leaf, node, pairing in (
                    ("leaf", "node", "one_to_one"),
                    ("tier-0", "hostname", "one-to-one"),
                    ("SCOPE_LEAF", "SCOPE_NODE", "PAIRING_ONE_TO_ONE"),
                )
            ),
            want=PlacementRequest(
                job="pd",
                groups=(
                    Group("prefill", replicas=2, gpus_per_pod=4),
                    Group(
                        "decode",
                        replicas=2,
                        gpus_per_pod=4,
                        spread=Spread(Scope.NODE, required=True),
                    ),
                ),
                edges=(Edge("prefill", "decode", min_gbps=300, pairing=Pairing.ONE_TO_ONE),),
                scope=Constraint(Scope.LEAF),
            ),
        ),
        id="a P/D graph: spread, pairing and scope spelt three ways",
    ),
]


@pytest.mark.parametrize(
    ("form", "case"),
    [
        pytest.param(form, param.values[0], id=f"{form}: {param.id}")
        for param in CASES
        for form in sorted(FORMS)
        if form in param.values[0].forms  # type: ignore[union-attr]
    ],
)
def test_every_spelling_in_every_form_is_the_same_request(form: str, case: Case) -> None:
    for spelling in case.spellings:
        got = FORMS[form](spelling)
        assert got == case.want, spelling


def test_the_codec_round_trip_keeps_every_pattern_explicit() -> None:
    """What gputopo's own clients send: every pattern, none included, survives the wire."""
    for pattern in Pattern:
        request = PlacementRequest(groups=(Group("g", gpus_per_pod=2, pattern=pattern),))
        wire = ppb.PlacementRequest.FromString(request_to_proto(request).SerializeToString())
        assert request_from_proto(wire) == request, pattern


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_misspelt_pattern_is_refused_in_every_form_naming_the_field(form: str) -> None:
    with pytest.raises(RequestError) as err:
        FORMS[form](_one({"gpus_per_pod": 4, "pattern": "PATTERN_ALLREDUCE"}))
    assert err.value.field.endswith("groups[0].pattern")
    assert "all_reduce" in err.value.reason
