"""Desired labels, valid values, and patches that touch only what this aggregator owns."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.labels import (
    LabelScheme,
    NodeFacts,
    desired_labels,
    fingerprint,
    fnv64a,
    label_value,
    plan_patch,
)
from gputopo.links import LinkHealth
from gputopo.topology import FabricPosition, Measurement
from tests.builders import nvswitch_node, pcie_node

SCHEME = LabelScheme()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("", 0xCBF29CE484222325, id="empty string is the offset basis"),
        pytest.param("a", 0xAF63DC4C8601EC8C, id="published test vector a"),
        pytest.param("foobar", 0x85944171F73967E8, id="published test vector foobar"),
    ],
)
def test_fnv64a_matches_the_reference_vectors(text: str, want: int) -> None:
    assert fnv64a(text) == want


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param("leaf-1", "leaf-1", id="a valid value stays"),
        pytest.param("a" * 63, "a" * 63, id="63 characters stay"),
        pytest.param("a" * 64, f"x{fnv64a('a' * 64):016x}", id="64 characters hash as topograph"),
        pytest.param("spine/1", f"x{fnv64a('spine/1'):016x}", id="invalid characters hash"),
        pytest.param("-edge", f"x{fnv64a('-edge'):016x}", id="must start alphanumeric"),
    ],
)
def test_label_values_are_valid(value: str, want: str) -> None:
    assert label_value(value) == want


@given(st.text(max_size=100))
def test_every_value_becomes_a_valid_label_value(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63
    assert value == "" or (value[0].isalnum() and value[-1].isalnum() and value.isascii())


NVL = replace(
    nvswitch_node("gb-01", gpus=4, nics=4),
    fabric=FabricPosition(
        tiers=("leaf-4", "spine-2", "core-1"),
        accelerator_domain="uuid-1",
        accelerator_sub_domain="uuid-1.32766",
        source="nvml",
        confidence="high",
    ),
)


@dataclass(frozen=True)
class DesiredCase:
    id: str
    facts: NodeFacts
    scheme: LabelScheme
    want: dict[str, str]
    absent: tuple[str, ...] = ()


DESIRED = [
    DesiredCase(
        "an NVL72 tray: topograph keys, aliases, domain size of the whole rack",
        NodeFacts(NVL, generation=3, nvlink_domain_gpus=72),
        SCHEME,
        {
            "fabric.topograph.run/tier-0": "leaf-4",
            "fabric.topograph.run/tier-1": "spine-2",
            "fabric.topograph.run/tier-2": "core-1",
            "accelerator.topograph.run/domain": "uuid-1",
            "accelerator.topograph.run/sub-domain": "uuid-1.32766",
            "gputopo.io/leaf": "leaf-4",
            "gputopo.io/spine": "spine-2",
            "gputopo.io/core": "core-1",
            "gputopo.io/nvlink-domain-size": "72",
            "gputopo.io/interconnect": "mnnvl",
            "gputopo.io/gpu-count": "4",
            "gputopo.io/nic-count": "4",
            "gputopo.io/numa-count": "0",
            "gputopo.io/degraded-links": "0",
            "gputopo.io/stale": "false",
            "gputopo.io/topology-generation": "3",
            "gputopo.io/topology-source": "nvml",
            "gputopo.io/topology-confidence": "high",
        },
    ),
    DesiredCase(
        "a PCIe server with bridged pairs: NVLink domain of two, one tier padded",
        NodeFacts(
            replace(
                pcie_node("p1", bridged_pairs=[(0, 1), (2, 3)]), fabric=FabricPosition(("leaf-3",))
            )
        ),
        SCHEME,
        {
            "fabric.topograph.run/tier-0": "leaf-3",
            "gputopo.io/leaf": "leaf-3",
            "gputopo.io/spine": "leaf-3",
            "gputopo.io/core": "leaf-3",
            "gputopo.io/nvlink-domain-size": "2",
            "gputopo.io/interconnect": "nvlink",
        },
        absent=("fabric.topograph.run/tier-1", "accelerator.topograph.run/domain"),
    ),
    DesiredCase(
        "a stale node with no fabric position says so and names no tier",
        NodeFacts(nvswitch_node("s1", gpus=8), stale=True),
        SCHEME,
        {"gputopo.io/stale": "true", "gputopo.io/interconnect": "nvswitch"},
        absent=("gputopo.io/leaf", "fabric.topograph.run/tier-0", "gputopo.io/topology-source"),
    ),
    DesiredCase(
        "a leaf name reused under two spines gets a path hash, cluster-wide unique",
        NodeFacts(NVL, ambiguous_tiers=frozenset({0})),
        SCHEME,
        {
            "fabric.topograph.run/tier-0": f"x{fnv64a('core-1/spine-2/leaf-4'):016x}",
            "fabric.topograph.run/tier-1": "spine-2",
        },
    ),
    DesiredCase(
        "topograph v0 keys, three tiers at most, no sub-domain",
        NodeFacts(NVL),
        LabelScheme(profile="topograph-v0"),
        {
            "network.topology.nvidia.com/leaf": "leaf-4",
            "network.topology.nvidia.com/core": "core-1",
            "network.topology.nvidia.com/accelerator": "uuid-1",
        },
        absent=("accelerator.topograph.run/domain", "fabric.topograph.run/tier-0"),
    ),
    DesiredCase(
        "the own profile writes nothing outside its prefix",
        NodeFacts(NVL),
        LabelScheme(profile="own", prefix="topo.example.com/"),
        {
            "topo.example.com/tier-0": "leaf-4",
            "topo.example.com/accelerator-domain": "uuid-1",
            "topo.example.com/gpu-count": "4",
        },
        absent=("fabric.topograph.run/tier-0", "gputopo.io/gpu-count"),
    ),
]


@pytest.mark.parametrize("case", DESIRED, ids=[c.id for c in DESIRED])
def test_desired_labels(case: DesiredCase) -> None:
    got = desired_labels(case.facts, case.scheme)
    assert {k: got.get(k) for k in case.want} == case.want
    for key in case.absent:
        assert key not in got
    if case.scheme.profile == "own":
        assert all(k.startswith(case.scheme.prefix) for k in got)


def test_degraded_links_are_counted() -> None:
    node = nvswitch_node("d", gpus=4, nics=0)
    links = (replace(node.links[0], health=LinkHealth.DEGRADED), *node.links[1:])
    got = desired_labels(NodeFacts(replace(node, links=links)), SCHEME)
    assert got["gputopo.io/degraded-links"] == "1"


def test_the_fingerprint_ignores_measurements_but_not_health() -> None:
    node = nvswitch_node("f", gpus=2, nics=1)
    measured = replace(node.links[0], measured=Measurement(401.0, "cuda", measured_at=5.0))
    assert fingerprint(replace(node, links=(measured, *node.links[1:]))) == fingerprint(node)
    down = replace(node.links[0], health=LinkHealth.DOWN)
    assert fingerprint(replace(node, links=(down, *node.links[1:]))) != fingerprint(node)


@dataclass(frozen=True)
class PatchCase:
    id: str
    labels: dict[str, str]
    # label key -> its field managers ("me" is gputopo), as metadata.managedFields says
    managers: dict[str, frozenset[str]]
    desired: dict[str, str]
    want_changes: dict[str, str | None]
    want_apply: dict[str, str]
    want_foreign: tuple[str, ...] = ()
    keep: tuple[str, ...] = field(default=())


ME = frozenset({"me"})
TOPOGRAPH = frozenset({"topograph"})
BOTH = frozenset({"me", "topograph"})

PATCHES = [
    PatchCase(
        "a fresh node gets every label, and owns them by applying them",
        {"kubernetes.io/hostname": "n1"},
        {"kubernetes.io/hostname": frozenset({"kubelet"})},
        {"a/x": "1", "a/y": "2"},
        {"a/x": "1", "a/y": "2"},
        {"a/x": "1", "a/y": "2"},
    ),
    PatchCase(
        "nothing changes when the node already carries what we want",
        {"a/x": "1"},
        {"a/x": ME},
        {"a/x": "1"},
        {},
        {"a/x": "1"},
    ),
    PatchCase(
        "only the value that changed is a change; the apply names all we own",
        {"a/x": "1", "a/y": "2"},
        {"a/x": ME, "a/y": ME},
        {"a/x": "1", "a/y": "3"},
        {"a/y": "3"},
        {"a/x": "1", "a/y": "3"},
    ),
    PatchCase(
        "a label another manager set is neither changed nor claimed",
        {"fabric.topograph.run/tier-0": "theirs", "team": "ml"},
        {"fabric.topograph.run/tier-0": TOPOGRAPH, "team": frozenset({"kubectl"})},
        {"fabric.topograph.run/tier-0": "ours", "a/x": "1"},
        {"a/x": "1"},
        {"a/x": "1"},
        want_foreign=("fabric.topograph.run/tier-0",),
    ),
    PatchCase(
        "a key we wrote that topograph then changed is theirs now: not reverted",
        {"fabric.topograph.run/tier-0": "theirs"},
        {"fabric.topograph.run/tier-0": TOPOGRAPH},
        {"fabric.topograph.run/tier-0": "ours"},
        {},
        {},
        want_foreign=("fabric.topograph.run/tier-0",),
    ),
    PatchCase(
        "a key shared with another manager is not changed without force",
        {"a/x": "1"},
        {"a/x": BOTH},
        {"a/x": "2"},
        {},
        {},
        want_foreign=("a/x",),
    ),
    PatchCase(
        "a key shared with another manager, same value, stays ours too",
        {"a/x": "1"},
        {"a/x": BOTH},
        {"a/x": "1"},
        {},
        {"a/x": "1"},
    ),
    PatchCase(
        "an owned label no longer wanted is left out (removed); a foreign one never",
        {"a/old": "1", "team": "ml", "a/x": "1"},
        {"a/old": ME, "a/x": ME, "team": frozenset({"kubectl"})},
        {"a/x": "1"},
        {"a/old": None},
        {"a/x": "1"},
    ),
    PatchCase(
        "an owned label no longer wanted that another also owns stays (not a change)",
        {"a/old": "1", "a/x": "1"},
        {"a/old": BOTH, "a/x": ME},
        {"a/x": "1"},
        {},
        {"a/x": "1"},
    ),
    PatchCase(
        "an owned label someone deleted is written again",
        {},
        {},
        {"a/x": "1"},
        {"a/x": "1"},
        {"a/x": "1"},
    ),
    PatchCase(
        "kept keys stay owned and in place (a stale node keeps its other labels)",
        {"a/x": "1", "a/stale": "false"},
        {"a/x": ME, "a/stale": ME},
        {"a/stale": "true"},
        {"a/stale": "true"},
        {"a/x": "1", "a/stale": "true"},
        keep=("a/stale", "a/x"),
    ),
]


@pytest.mark.parametrize("case", PATCHES, ids=[c.id for c in PATCHES])
def test_patches_touch_only_owned_labels(case: PatchCase) -> None:
    patch = plan_patch(
        labels=case.labels,
        managers=case.managers,
        me="me",
        desired=case.desired,
        keep=case.keep,
    )
    assert dict(patch.labels) == case.want_changes
    assert dict(patch.apply_labels) == case.want_apply
    assert patch.foreign == case.want_foreign
    theirs = {k for k, who in case.managers.items() if "me" not in who}
    assert not theirs & set(patch.apply_labels), "a label we do not own was claimed"


def test_annotations_we_own_are_kept_and_extra_ones_applied() -> None:
    patch = plan_patch(
        labels={},
        managers={},
        me="me",
        desired={},
        annotations={"a/fp": "old", "other": "x"},
        annotation_managers={"a/fp": ME, "other": TOPOGRAPH},
    )
    assert dict(patch.apply_annotations) == {"a/fp": "old"}
    assert patch.empty
    patch = plan_patch(
        labels={},
        managers={},
        me="me",
        desired={},
        annotations={"a/fp": "old"},
        annotation_managers={"a/fp": ME},
        extra_annotations={"a/fp": "new"},
    )
    assert dict(patch.annotations) == {"a/fp": "new"}


def _apply(
    labels: dict[str, str], managers: dict[str, frozenset[str]], apply: dict[str, str]
) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    """What the API server does with a non-forced apply by "me" (structured-merge-diff): the
    applied keys are set and owned; a key "me" owned and left out loses "me", and is removed
    when nobody else owns it."""
    after, owners = dict(labels), {k: set(v) for k, v in managers.items()}
    for key, value in apply.items():
        assert not (owners.get(key, set()) - {"me"} and labels.get(key, value) != value), (
            f"{key}: the apply would conflict"
        )
        after[key] = value
        owners.setdefault(key, set()).add("me")
    for key in [k for k, who in owners.items() if "me" in who and k not in apply]:
        owners[key].discard("me")
        if not owners[key]:
            del owners[key]
            after.pop(key, None)
    return after, {k: frozenset(v) for k, v in owners.items()}


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from("123"), max_size=6),
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([ME, TOPOGRAPH, BOTH]), max_size=6),
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from("123"), max_size=6),
)
def test_applying_a_plan_reaches_the_wanted_state_and_a_second_plan_is_empty(
    labels: dict[str, str], managers: dict[str, frozenset[str]], desired: dict[str, str]
) -> None:
    managers = {k: v for k, v in managers.items() if k in labels}
    patch = plan_patch(labels=labels, managers=managers, me="me", desired=desired)
    after, owners = _apply(labels, managers, dict(patch.apply_labels))
    theirs = {k for k, who in managers.items() if who - {"me"}}
    unowned = set(labels) - set(managers)
    for key in theirs | unowned:
        assert after.get(key) == labels[key], "a label someone else owns changed"
    for key, value in desired.items():
        if key not in theirs and key not in unowned:
            assert after.get(key) == value
    again = plan_patch(labels=after, managers=owners, me="me", desired=desired)
    assert again.empty
