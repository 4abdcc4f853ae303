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
OWNED = SCHEME.owned_annotation


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
    owned: str | None
    desired: dict[str, str]
    want_labels: dict[str, str | None]
    want_owned: str | None = None  # the new annotation value; None: unchanged
    want_foreign: tuple[str, ...] = ()
    keep: tuple[str, ...] = field(default=())


PATCHES = [
    PatchCase(
        "a fresh node gets every label and the ownership record",
        {"kubernetes.io/hostname": "n1"},
        None,
        {"a/x": "1", "a/y": "2"},
        {"a/x": "1", "a/y": "2"},
        want_owned="a/x,a/y",
    ),
    PatchCase(
        "nothing to do when the node already carries what we want",
        {"a/x": "1"},
        "a/x",
        {"a/x": "1"},
        {},
    ),
    PatchCase(
        "only the value that changed is sent",
        {"a/x": "1", "a/y": "2"},
        "a/x,a/y",
        {"a/x": "1", "a/y": "3"},
        {"a/y": "3"},
    ),
    PatchCase(
        "a label someone else wrote is neither changed nor claimed",
        {"fabric.topograph.run/tier-0": "theirs", "team": "ml"},
        None,
        {"fabric.topograph.run/tier-0": "ours", "a/x": "1"},
        {"a/x": "1"},
        want_owned="a/x",
        want_foreign=("fabric.topograph.run/tier-0",),
    ),
    PatchCase(
        "an owned label no longer wanted is removed, a foreign one never",
        {"a/old": "1", "team": "ml", "a/x": "1"},
        "a/old,a/x",
        {"a/x": "1"},
        {"a/old": None},
        want_owned="a/x",
    ),
    PatchCase(
        "an owned label someone deleted is written again",
        {},
        "a/x",
        {"a/x": "1"},
        {"a/x": "1"},
    ),
    PatchCase(
        "kept keys stay owned and in place (a stale node keeps its other labels)",
        {"a/x": "1", "a/stale": "false"},
        "a/stale,a/x",
        {"a/stale": "true"},
        {"a/stale": "true"},
        keep=("a/stale", "a/x"),
    ),
]


@pytest.mark.parametrize("case", PATCHES, ids=[c.id for c in PATCHES])
def test_patches_touch_only_owned_labels(case: PatchCase) -> None:
    annotations = {OWNED: case.owned} if case.owned is not None else {}
    patch = plan_patch(
        labels=case.labels,
        annotations=annotations,
        desired=case.desired,
        scheme=SCHEME,
        keep=case.keep,
    )
    assert dict(patch.labels) == case.want_labels
    assert patch.foreign == case.want_foreign
    assert patch.annotations.get(OWNED) == case.want_owned
    foreign = set(case.labels) - set((case.owned or "").split(","))
    assert not foreign & set(patch.labels), "a label we do not own was touched"


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from("123"), max_size=6),
    st.sets(st.sampled_from("abcdef")),
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from("123"), max_size=6),
)
def test_applying_a_plan_reaches_the_wanted_state_and_a_second_plan_is_empty(
    labels: dict[str, str], owned: set[str], desired: dict[str, str]
) -> None:
    owned &= set(labels)
    annotations = {OWNED: ",".join(sorted(owned))} if owned else {}
    patch = plan_patch(labels=labels, annotations=annotations, desired=desired, scheme=SCHEME)
    after = {**labels, **{k: v for k, v in patch.labels.items() if v is not None}}
    after = {k: v for k, v in after.items() if patch.labels.get(k, "") is not None}
    ann = {**annotations, **{k: v for k, v in patch.annotations.items() if v is not None}}
    ann = {k: v for k, v in ann.items() if patch.annotations.get(k, "") is not None}
    foreign = set(labels) - owned
    assert {k: after[k] for k in foreign} == {k: labels[k] for k in foreign}
    assert all(after.get(k) == v for k, v in desired.items() if k not in foreign)
    again = plan_patch(labels=after, annotations=ann, desired=desired, scheme=SCHEME)
    assert again.empty
