"""Kueue's own TAS test cases (``kueue_tas_cases.json``) against the kueue-bestfit port.

The file is read from ``$GPUTOPO_KUEUE_CASES`` when set, else from the copy in ``tests/data``.
Short level names and resource units are translated as the file's ``format`` key describes.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gputopo.placement.kueue_tas import (
    HOSTNAME_LABEL,
    TasAssignment,
    TasFailure,
    TasNode,
    TasRequest,
    find_topology_assignment,
)

DEFAULT_CASES = Path(__file__).resolve().parent.parent / "data" / "kueue_tas_cases.json"

# The JSON's short level names and the node label keys Kueue's tests use for them.
LEVEL_KEYS = {
    "block": "cloud.com/topology-block",
    "rack": "cloud.com/topology-rack",
    "host": HOSTNAME_LABEL,
}
SHORT_NAMES = {key: short for short, key in LEVEL_KEYS.items()}

GIB = 2**30
# JSON resource name -> (Kubernetes resource name, factor to the resource's base unit).
RESOURCE_UNITS = {
    "cpu": ("cpu", 1),
    "memory_gi": ("memory", GIB),
    "memory_bytes": ("memory", 1),
    "pods": ("pods", 1),
}

KNOWN_GATES = {"TASBalancedPlacement", "TASProfileMixed"}


def cases_path() -> Path:
    override = os.environ.get("GPUTOPO_KUEUE_CASES")
    return Path(override) if override else DEFAULT_CASES


def load_cases() -> list[dict[str, Any]]:
    with cases_path().open(encoding="utf-8") as handle:
        cases: list[dict[str, Any]] = json.load(handle)["cases"]
    return cases


def level_key(short: str) -> str:
    return LEVEL_KEYS.get(short, short)


def resources(raw: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in raw.items():
        k8s_name, factor = RESOURCE_UNITS.get(name, (name, 1))
        out[k8s_name] = out.get(k8s_name, 0) + value * factor
    return out


def build_inputs(case: dict[str, Any]) -> tuple[list[str], list[TasNode], TasRequest]:
    levels = [level_key(level) for level in case["topology_levels"]]
    nodes = [
        TasNode(
            name=node["name"],
            labels={level_key(k): v for k, v in node["labels"].items()},
            allocatable=resources(node["allocatable"]),
        )
        for node in case["nodes"]
    ]
    raw = case["request"]
    topology = raw["topology"]
    slice_spec = raw.get("slice") or {}
    request = TasRequest(
        pods=raw["pods"],
        per_pod=resources(raw["per_pod"]),
        mode=topology["mode"],
        level=level_key(topology["level"]) if topology.get("level") else None,
        slice_level=level_key(slice_spec["level"]) if slice_spec else None,
        slice_size=slice_spec.get("size") if slice_spec else None,
    )
    return levels, nodes, request


def as_multiset(assignment: TasAssignment) -> Counter[tuple[tuple[str, ...], int]]:
    return Counter((tuple(d.values), d.pods) for d in assignment.domains)


CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c['id']}: {c['kueue_test_name']}" for c in CASES])
def test_kueue_case(case: dict[str, Any]) -> None:
    gates: dict[str, bool] = case.get("feature_gates") or {}
    unknown = set(gates) - KNOWN_GATES
    assert not unknown, f"case sets feature gates this port does not model: {sorted(unknown)}"
    levels, nodes, request = build_inputs(case)

    got = find_topology_assignment(
        levels=levels,
        nodes=nodes,
        request=request,
        balanced_placement=gates.get("TASBalancedPlacement", False),
        profile_mixed=gates.get("TASProfileMixed", True),
    )

    expected = case["expected"]
    if "failure" in expected:
        assert got == TasFailure(expected["failure"])
        return
    assert isinstance(got, TasAssignment), f"expected an assignment, got {got}"
    assert [SHORT_NAMES.get(level, level) for level in got.levels] == expected["assignment_levels"]
    want = Counter((tuple(item["domain"]), item["count"]) for item in expected["assignment"])
    assert as_multiset(got) == want


def test_every_case_has_a_verdict() -> None:
    """A case without an expected assignment or failure would pass vacuously."""
    assert CASES, f"no cases in {cases_path()}"
    for case in CASES:
        expected = case["expected"]
        assert ("failure" in expected) != ("assignment" in expected), case["id"]
