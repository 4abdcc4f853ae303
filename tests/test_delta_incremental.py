"""Applying a delta by amending the topology equals building the result afresh.

`apply_delta` shares every part of the node a delta leaves alone (`NodeTopology.amended`);
this holds it to the plain definition (a dict of links by pair, upserts after removals, the
constructor normalising and sorting) on random deltas, with links given back to front, pairs
new and old, removals of pairs that are not there, and GPU and NIC upserts.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.delta import NodeDelta, apply_delta
from gputopo.links import LinkHealth, LinkKind
from gputopo.topology import (
    DeviceRef,
    FabricPosition,
    Gpu,
    Link,
    Measurement,
    Nic,
    NodeTopology,
    NvmlStatus,
    gpu,
    nic,
    numa,
)
from tests.builders import nvswitch_node

BASE = nvswitch_node("n1", gpus=4, nics=2, tiers=("leaf-1",))


def rebuilt(topology: NodeTopology, delta: NodeDelta) -> NodeTopology:
    """What a delta means, built the plain way (what `apply_delta` did before it amended)."""
    gpus = {g.index: g for g in topology.gpus} | {g.index: g for g in delta.gpus}
    nics = {n.index: n for n in topology.nics} | {n.index: n for n in delta.nics}
    links = {lk.key: lk for lk in topology.links}
    for a, b in delta.removed_links:
        links.pop((a, b) if a < b else (b, a), None)
    for lk in delta.links:
        normal = lk if lk.a < lk.b else replace(lk, a=lk.b, b=lk.a)
        links[normal.key] = normal
    return NodeTopology(
        name=topology.name,
        gpus=tuple(gpus[i] for i in sorted(gpus)),
        nics=tuple(nics[i] for i in sorted(nics)),
        numa_nodes=topology.numa_nodes,
        links=tuple(links.values()),
        fabric=delta.fabric if delta.fabric is not None else topology.fabric,
        machine=topology.machine,
        profile=topology.profile,
        nvml=delta.nvml if delta.nvml is not None else topology.nvml,
        partial=topology.partial,
        problems=delta.problems if delta.problems is not None else topology.problems,
    )


# Pairs a delta may name: every pair of BASE, and some it does not have (NIC-NIC, GPU-host,
# a fifth GPU and a third NIC that the delta may add).
_PAIRS = sorted(
    {lk.key for lk in BASE.links}
    | {(nic(0), nic(1)), (gpu(0), numa(0)), (gpu(0), gpu(4)), (gpu(1), nic(2))}
)


@st.composite
def links(draw: st.DrawFn) -> Link:
    a, b = draw(st.sampled_from(_PAIRS))
    if draw(st.booleans()):
        a, b = b, a  # given back to front: normalised on the way in
    old = BASE.link(a, b)
    link = old or Link(a, b, LinkKind.PIX, nominal_gbps=50.0)
    gbps = draw(st.sampled_from([100.0, 360.0, 361.0, 5000.0]))  # 5000: above any ceiling
    return replace(
        link,
        a=a,
        b=b,
        measured=Measurement(gbps, "test", measured_at=1.0),
        generation=draw(st.sampled_from([link.generation, 0])),
        health=draw(st.sampled_from([LinkHealth.OK, LinkHealth.DEGRADED])),
    )


@st.composite
def deltas(draw: st.DrawFn) -> NodeDelta:
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-n1-{i}", nvlink_generation=draw(st.sampled_from([3, 4, 5])))
        for i in draw(st.lists(st.sampled_from([0, 3, 4]), max_size=2, unique=True))
    )
    nics = tuple(
        Nic(index=i, name=f"mlx5_{i}", speed_mbps=draw(st.sampled_from([100_000, 400_000])))
        for i in draw(st.lists(st.sampled_from([1, 2]), max_size=2, unique=True))
    )
    removed: list[tuple[DeviceRef, DeviceRef]] = draw(st.lists(st.sampled_from(_PAIRS), max_size=3))
    return NodeDelta(
        gpus=gpus,
        nics=nics,
        links=tuple(draw(st.lists(links(), max_size=4))),
        removed_links=tuple((b, a) if draw(st.booleans()) else (a, b) for a, b in removed),
        fabric=draw(st.sampled_from([None, FabricPosition(tiers=("leaf-2",))])),
        nvml=draw(st.sampled_from([None, NvmlStatus(up=True)])),
        problems=draw(st.sampled_from([None, (), ("x",)])),
    )


@settings(max_examples=300)
@given(st.lists(deltas(), min_size=1, max_size=4))
def test_applying_deltas_equals_building_the_result_afresh(steps: list[NodeDelta]) -> None:
    amended = built = BASE
    for delta in steps:
        amended, built = apply_delta(amended, delta), rebuilt(built, delta)
        assert amended == built
        assert [amended.link(lk.a, lk.b) for lk in built.links] == list(built.links)
        assert amended.link(gpu(0), nic(1)) == built.link(nic(1), gpu(0))


def test_a_delta_of_one_link_shares_every_other_part_of_the_node() -> None:
    old = BASE.gpu_link(0, 1)
    assert old is not None
    new = apply_delta(BASE, NodeDelta(links=(replace(old, measured=Measurement(300.0, "t")),)))
    assert new.gpus is BASE.gpus
    assert new.nics is BASE.nics
    assert new.fabric is BASE.fabric
    assert [a is b for a, b in zip(new.links, BASE.links, strict=True)].count(False) == 1


def test_an_amended_link_from_a_device_to_itself_is_refused_as_by_the_constructor() -> None:
    with pytest.raises(ValueError, match="link from gpu0 to itself"):
        BASE.amended(links=[Link(gpu(0), gpu(0), LinkKind.NVLINK)])
