"""Deltas: apply(old, diff(old, new)) == new, for any change a delta can express."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gputopo.delta import NodeDelta, apply_delta, diff_topology
from gputopo.links import LinkHealth
from gputopo.topology import FabricPosition, Measurement, NodeTopology, NvmlStatus
from tests.builders import nvswitch_node

BASE = nvswitch_node("n1", gpus=4, nics=2, tiers=("leaf-1",))


@st.composite
def changed(draw: st.DrawFn) -> NodeTopology:
    """BASE with some links measured, degraded or removed, and node facts changed."""
    links = []
    for link in BASE.links:
        action = draw(st.sampled_from(["keep", "measure", "degrade", "drop"]))
        if action == "measure":
            gbps = draw(st.floats(min_value=1, max_value=500, allow_nan=False))
            links.append(replace(link, measured=Measurement(gbps, "test", measured_at=1.0)))
        elif action == "degrade":
            links.append(replace(link, health=LinkHealth.DEGRADED, health_reason="lane down"))
        elif action == "keep":
            links.append(link)
    fabric = FabricPosition(tiers=tuple(draw(st.lists(st.sampled_from(["a", "b"]), max_size=2))))
    problems = tuple(draw(st.lists(st.sampled_from(["x", "y"]), max_size=2)))
    nvml = NvmlStatus(up=draw(st.booleans()))
    return replace(BASE, links=tuple(links), fabric=fabric, problems=problems, nvml=nvml)


@given(changed())
def test_apply_of_diff_reproduces_the_new_topology(new: NodeTopology) -> None:
    delta = diff_topology(BASE, new)
    assert delta is not None
    assert apply_delta(BASE, delta) == new


def test_no_change_is_an_empty_delta() -> None:
    delta = diff_topology(BASE, BASE)
    assert delta == NodeDelta()
    assert delta is not None
    assert delta.empty


def test_a_removed_gpu_needs_a_snapshot() -> None:
    assert diff_topology(BASE, replace(BASE, gpus=BASE.gpus[:-1])) is None


def test_a_renamed_node_needs_a_snapshot() -> None:
    assert diff_topology(BASE, replace(BASE, name="other")) is None
