"""Inventories in topograph's model format, with gputopo's profile and `used` extensions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputopo.inventory import (
    InventoryError,
    expand_hostlist,
    inventory_topologies,
    load_inventory,
    parse_inventory,
)

SMALL = Path(__file__).parent / "data" / "inventory_small.yaml"


@pytest.mark.parametrize(
    ("pattern", "want"),
    [
        pytest.param("node7", ["node7"], id="a plain name is itself"),
        pytest.param("n[1-3]", ["n1", "n2", "n3"], id="a range"),
        pytest.param("gpu[001-003]", ["gpu001", "gpu002", "gpu003"], id="zero padding is kept"),
        pytest.param(
            "node[0028-0030,0032]",
            ["node0028", "node0029", "node0030", "node0032"],
            id="ranges and singles mixed",
        ),
        pytest.param("rack[1-2]-a", ["rack1-a", "rack2-a"], id="a suffix after the range"),
    ],
)
def test_hostlists_expand(pattern: str, want: list[str]) -> None:
    assert expand_hostlist(pattern) == want


@pytest.mark.parametrize("pattern", ["n[3-1]", "n[a-b]", "n[1-2", "", "n[1-2][3-4]"])
def test_bad_hostlists_are_errors(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        expand_hostlist(pattern)


def test_small_inventory_nodes_tiers_and_domains() -> None:
    inv = load_inventory(str(SMALL))
    assert len(inv.nodes) == 4 + 3 + 18
    h = inv.nodes["h100-02"]
    assert h.tiers == ("leaf-1", "spine-1", "core")
    assert h.labels["topology.kubernetes.io/zone"] == "zone-1"
    assert h.labels["topology.kubernetes.io/region"] == "us-east"
    tray = inv.nodes["gb200-007"]
    assert (tray.accelerator_domain, tray.accelerator_sub_domain) == ("nvl72-a", "nvl72-a.1")
    assert tray.profile == "gb200-tray"
    assert inv.nodes["h100-01"].used == frozenset({0, 1, 2, 3})
    assert inv.nodes["a100-07"].used == frozenset({7})
    assert inv.depth == 3
    fabric = tray.fabric()
    assert fabric.source == "inventory"
    assert fabric.confidence == "high"
    assert fabric.zone == "zone-2"


def test_small_inventory_builds_topologies() -> None:
    nodes, used = inventory_topologies(load_inventory(str(SMALL)))
    by_name = {n.name: n for n in nodes}
    assert by_name["a100-01"].profile == "hgx-a100-roce"
    assert by_name["h100-03"].fabric.tiers == ("leaf-1", "spine-1", "core")
    assert all(g.fabric is not None for g in by_name["gb200-001"].gpus)
    assert used == {"h100-01": frozenset({0, 1, 2, 3}), "a100-07": frozenset({7})}


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        pytest.param("[]", "inventory", id="not a mapping"),
        pytest.param(
            "switches: {a: {switches: [b]}, c: {switches: [b]}}\nblocks: []",
            "switches.c.switches",
            id="a switch with two parents",
        ),
        pytest.param(
            "switches: {a: {switches: [b]}, b: {switches: [a]}}\nblocks: []",
            "switches.b",
            id="a cycle",
        ),
        pytest.param(
            "switches: {a: {name: z}}\nblocks: []",
            "switches.a.name",
            id="a name that differs from the key",
        ),
        pytest.param(
            "blocks: [{switch: nowhere, nodes: [n1]}]",
            "blocks[0].switch",
            id="a block on an undeclared switch",
        ),
        pytest.param("blocks: [{nodes: []}]", "blocks[0].nodes", id="an empty block"),
        pytest.param(
            "blocks: [{nodes: [n1]}, {nodes: [n1]}]", "blocks[1].nodes", id="a node in two blocks"
        ),
        pytest.param("blocks: [{nodes: ['n[2-1]']}]", "blocks[0].nodes[0]", id="a bad range"),
        pytest.param(
            "blocks: [{nodes: [n1], used: {n2: [0]}}]",
            "blocks[0].used",
            id="used GPUs of a node outside the block",
        ),
        pytest.param(
            "blocks: [{nodes: [n1], used: {n1: [-1]}}]",
            "blocks[0].used.n1",
            id="a negative GPU index",
        ),
        pytest.param(
            "blocks: [{nodes: [n1]}]\nnodes: {n9: {used: [0]}}",
            "nodes.n9",
            id="an override of an unknown node",
        ),
        pytest.param("switchez: {}", "switchez", id="a misspelt top-level key"),
        pytest.param(
            "blocks: [{nodes: [n1], nodeprofile: dgx-h100}]",
            "blocks[0].nodeprofile",
            id="a key in the wrong case inside a block",
        ),
        pytest.param(
            "blocks: [{nodes: [n1], usde: {n1: [0]}}]", "blocks[0].usde", id="a misspelt used"
        ),
        pytest.param(
            "blocks: [{nodes: [n1], anotations: {}}]",
            "blocks[0].anotations",
            id="misspelt annotations",
        ),
        pytest.param("switches: {a: {lables: {}}}", "switches.a.lables", id="in a switch"),
        pytest.param("defaults: {profile: x}", "defaults.profile", id="in the defaults"),
        pytest.param(
            "blocks: [{nodes: [n1]}]\nnodes: {n1: {use: [0]}}", "nodes.n1.use", id="in a node"
        ),
        pytest.param("blocks: [{nodes: [n1]\n", "inventory:2", id="broken YAML"),
    ],
)
def test_invalid_inventories_say_where(doc: str, where: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(doc)
    assert info.value.where == where


def test_an_unknown_key_names_the_key_it_looks_like() -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory("blocks: [{nodes: [n1], nodeprofile: dgx-h100}]")
    assert str(info.value) == "blocks[0].nodeprofile: unknown key; did you mean nodeProfile?"


def test_nodes_need_a_profile_to_become_machines() -> None:
    inv = parse_inventory("blocks: [{nodes: [n1]}]")
    with pytest.raises(InventoryError, match="nodeProfile"):
        inventory_topologies(inv)
    nodes, _ = inventory_topologies(inv, default_profile="g5-a10g-8x")
    assert nodes[0].gpu_count == 8


def test_used_gpus_must_exist_on_the_machine() -> None:
    inv = parse_inventory("blocks: [{nodes: [n1], nodeProfile: gb200-tray, used: {n1: [5]}}]")
    with pytest.raises(InventoryError, match="GPU 5 does not exist"):
        inventory_topologies(inv)


def test_a_host_range_bomb_is_counted_not_expanded() -> None:
    """`h-[1-100000]` five times over is refused by counting, in well under a second."""
    import time

    from gputopo.inventory import MAX_NODES, expand_hostlist

    start = time.monotonic()
    with pytest.raises(ValueError, match="at most 50000"):
        expand_hostlist("h-[" + ",".join(["1-100000"] * 5) + "]")
    with pytest.raises(ValueError, match="bad range"):
        expand_hostlist("h-[1-" + "9" * 5000 + "]")
    with pytest.raises(ValueError, match="at least 3 nodes"):
        expand_hostlist("h-[1-3]", limit=2)
    assert time.monotonic() - start < 1
    assert len(expand_hostlist(f"h-[1-{MAX_NODES}]")) == MAX_NODES


def test_an_inventory_names_at_most_max_nodes_in_all() -> None:
    blocks = "\n".join(
        f'  - {{switch: leaf, nodes: ["h{i}-[1-20000]"], nodeProfile: dgx-h100}}' for i in range(3)
    )
    with pytest.raises(InventoryError, match=r"blocks\[2\]\.nodes\[0\].*at most 50000"):
        parse_inventory(f"switches: {{leaf: {{}}}}\nblocks:\n{blocks}\n")
