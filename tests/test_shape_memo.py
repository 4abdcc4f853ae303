"""`node_shape` answers clones of one machine from their shared device tuples, never answers a
node whose devices differ from a remembered one, reads a topology once per set of fresh
measurements, and reads each link as `Link` says."""

from __future__ import annotations

import copy
import gc
import math
import random
import weakref
from dataclasses import replace

import numpy as np
import pytest

from gputopo import shape
from gputopo.links import LinkHealth, LinkKind
from gputopo.machines import PROFILES, load_machine
from gputopo.shape import node_shape
from gputopo.topology import DEFAULT_MEASUREMENT_MAX_AGE_S, DeviceKind, Measurement, NodeTopology
from tests.builders import nvswitch_node, pcie_node


def test_a_clone_sharing_the_device_tuples_gets_the_same_shape() -> None:
    template = nvswitch_node("template")
    clone = copy.copy(template)
    object.__setattr__(clone, "name", "clone")
    assert node_shape(clone) is node_shape(template)


def test_a_node_with_a_downed_gpu_is_not_mistaken_for_its_template() -> None:
    template = nvswitch_node("template")
    before = node_shape(template)
    gpus = (replace(template.gpus[0], health=LinkHealth.DOWN), *template.gpus[1:])
    changed = replace(template, gpus=gpus)
    assert node_shape(changed) is not before
    assert node_shape(changed).nvlink_gbps[0] == 0.0
    assert node_shape(template) is before


def test_equal_devices_in_new_tuples_still_share_one_interned_shape() -> None:
    a = nvswitch_node("a")
    b = nvswitch_node("b")  # built afresh: equal devices, other tuples
    assert a.links is not b.links
    assert node_shape(a) is node_shape(b)


def _with_measurements(topo: NodeTopology, *, at: float) -> NodeTopology:
    """Every GPU pair measured at time `at`, at 90 % of nominal."""
    links = tuple(
        replace(lk, measured=Measurement(gbps=lk.nominal_gbps * 0.9, method="t", measured_at=at))
        if lk.a.kind is DeviceKind.GPU and lk.b.kind is DeviceKind.GPU and lk.nominal_gbps > 0
        else lk
        for lk in topo.links
    )
    return replace(topo, links=links)


def test_a_topology_is_read_once_per_set_of_fresh_measurements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snapshot's clock moves every rebuild; a 128-GPU report costs milliseconds to read,
    so only a change in which measurements are fresh may read it again."""
    reads: list[float | None] = []
    real = shape._signature

    def counted(
        topology: NodeTopology, now: float | None
    ) -> tuple[tuple[object, ...], np.ndarray, np.ndarray]:
        reads.append(now)
        return real(topology, now)

    monkeypatch.setattr(shape, "_signature", counted)
    topo = _with_measurements(pcie_node("m", gpus=8), at=1000.0)
    fresh = node_shape(topo, now=1000.0)
    assert node_shape(topo, now=1000.0 + DEFAULT_MEASUREMENT_MAX_AGE_S) is fresh
    assert len(reads) == 1
    stale = node_shape(topo, now=1000.0 + DEFAULT_MEASUREMENT_MAX_AGE_S + 1)
    assert stale is not fresh
    assert node_shape(topo, now=1e12) is stale
    assert node_shape(topo) is fresh  # no clock: every measurement counts
    assert len(reads) == 2
    pair = next(lk for lk in topo.links if lk.measured is not None)
    a, b = pair.a.index, pair.b.index
    assert fresh.bw[a][b] == round(pair.nominal_gbps * 0.9, 3)
    assert stale.bw[a][b] == round(pair.nominal_gbps, 3)


def _reference(topo: NodeTopology, now: float | None) -> tuple[object, ...]:
    """What the shape's fields mean, link by link (the vectorised reader must agree)."""
    n = topo.gpu_count
    bw = [[0.0] * n for _ in range(n)]
    kind = [[LinkKind.SYS] * n for _ in range(n)]
    near: list[list[tuple[LinkKind, int, float]]] = [[] for _ in range(n)]
    for lk in topo.links:
        ends = {lk.a.kind, lk.b.kind}
        if ends == {DeviceKind.GPU}:
            gbps = round(lk.bandwidth_gbps(now=now), 3)
            bw[lk.a.index][lk.b.index] = bw[lk.b.index][lk.a.index] = gbps
            kind[lk.a.index][lk.b.index] = kind[lk.b.index][lk.a.index] = lk.kind
        elif ends == {DeviceKind.GPU, DeviceKind.NIC}:
            g, nic = (lk.a, lk.b) if lk.a.kind is DeviceKind.GPU else (lk.b, lk.a)
            if topo.nics[nic.index].up:
                near[g.index].append((lk.kind, nic.index, lk.bandwidth_gbps(now=now)))
    for i in range(n):
        kind[i][i] = LinkKind.NVLINK
    nics = []
    for options in near:
        best = min((k for k, _, _ in options), default=None)
        row = []
        for k, idx, path in sorted(options, key=lambda o: o[1]):
            line = topo.nics[idx].speed_mbps / 8000
            if k == best:
                row.append((idx, round(min(line, path) if path > 0 else line, 3)))
        nics.append(tuple(row))
    return (tuple(map(tuple, bw)), tuple(map(tuple, kind)), tuple(nics))


@pytest.mark.parametrize("profile", PROFILES)
def test_the_shape_reads_every_link_as_the_link_says(profile: str) -> None:
    topo = load_machine(profile, node_name="n")
    variants = [topo, _with_measurements(topo, at=50.0)]
    if topo.links:
        links = list(topo.links)
        links[0] = replace(links[0], health=LinkHealth.DOWN)
        variants.append(replace(topo, links=tuple(links)))
    if topo.nics:
        variants.append(replace(topo, nics=(replace(topo.nics[0], up=False), *topo.nics[1:])))
    for variant in variants:
        for now in (None, 100.0, 1e9):
            found = node_shape(variant, now=now)
            assert (found.bw, found.kind, found.nics) == _reference(variant, now), (profile, now)
            assert found.bw_array.tolist() == [list(r) for r in found.bw]
            assert found.kind_array.tolist() == [[int(k) for k in r] for r in found.kind]


def test_a_topology_no_one_holds_takes_its_shapes_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node's shapes are kept with its topology (and its clones): once it is gone (departed,
    or re-reported in new tuples) nothing keeps its links or its shape alive, while the live
    nodes keep theirs and are not read again."""
    kept = [pcie_node(f"kept{i}", gpus=8) for i in range(3)]
    shapes = [node_shape(t) for t in kept]
    gone = pcie_node("gone", gpus=4)
    first = gone.links[0]  # one bandwidth no other test uses: a shape of its own
    only = replace(first, measured=Measurement(gbps=12.345678, method="t"))
    gone = replace(gone, links=(only, *gone.links[1:]))
    held = weakref.ref(node_shape(gone))
    assert held() is not None
    del gone
    gc.collect()
    assert held() is None
    reads: list[NodeTopology] = []
    real = shape._signature

    def counted(
        topology: NodeTopology, now: float | None
    ) -> tuple[tuple[object, ...], np.ndarray, np.ndarray]:
        reads.append(topology)
        return real(topology, now)

    monkeypatch.setattr(shape, "_signature", counted)
    assert all(node_shape(t) is s for t, s in zip(kept, shapes, strict=True))
    assert all(node_shape(copy.copy(t)) is s for t, s in zip(kept, shapes, strict=True))
    assert reads == []


def test_bandwidths_are_rounded_on_arrays_as_python_rounds_them() -> None:
    """`_round3` must round as `round(x, 3)` does, bit for bit, or one model splits into
    shapes: halves of a thousandth (decimal ties that are not binary ones), big, tiny,
    negative and non-finite values included."""
    rng = random.Random(3)
    values = [k / 2000 for k in range(-4000, 4000)]
    values += [k / 2000 + d for k in range(0, 400_000, 997) for d in (-1e-12, 0.0, 1e-12)]
    values += [rng.uniform(0, 1000) for _ in range(5000)] + [
        rng.uniform(0, 1e15) for _ in range(50)
    ]
    values += [0.0, -0.0, 2.0**40, 2.0**53, 1e300, math.inf, -math.inf, 5e-324]
    found = shape._round3(np.array(values)).tolist()
    assert found == [round(v, 3) for v in values]
    assert math.isnan(shape._round3(np.array([math.nan]))[0])
