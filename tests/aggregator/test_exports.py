"""Scheduler objects and Slurm topology from the cluster graph, in their consumers' formats."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aggregator.exports import (
    HOSTNAME,
    Placed,
    block_sizes,
    check_hypernode,
    check_topology,
    kai_topologies,
    kueue_topologies,
    slurm_block,
    slurm_tree,
    topology_levels,
    volcano_hypernodes,
)
from aggregator.labels import LabelScheme
from gputopo.app.demo import demo_nodes
from gputopo.inventory import expand_hostlist, inventory_topologies, load_inventory
from gputopo.topology import FabricPosition

SCHEME = LabelScheme()
DEMO = [Placed(n.name, n.fabric) for n in demo_nodes()]
SMALL = Path(__file__).parent.parent / "data" / "inventory_small.yaml"


def f(*tiers: str, domain: str = "", sub: str = "") -> FabricPosition:
    return FabricPosition(tiers=tiers, accelerator_domain=domain, accelerator_sub_domain=sub)


def test_slurm_tree_matches_topographs_format() -> None:
    # The layout of topograph's own tree test (a core, one spine, two ToRs, a loose node).
    nodes = [
        Placed("node11", f("tor1", "spine", "core")),
        Placed("node12", f("tor1", "spine", "core")),
        Placed("node21", f("tor2", "spine", "core")),
        Placed("node22", f("tor2", "spine", "core")),
        Placed("node31", f()),
    ]
    assert slurm_tree(nodes) == (
        "# switch.3.1=core\n"
        "SwitchName=switch.3.1 Switches=switch.2.1\n"
        "SwitchName=no-topology Nodes=node31\n"
        "# switch.2.1=spine\n"
        "SwitchName=switch.2.1 Switches=switch.1.[1-2]\n"
        "# switch.1.1=tor1\n"
        "SwitchName=switch.1.1 Nodes=node[11-12]\n"
        "# switch.1.2=tor2\n"
        "SwitchName=switch.1.2 Nodes=node[21-22]\n"
    )


def test_slurm_block_matches_topographs_format_and_block_sizes() -> None:
    nodes = [Placed(f"Node{i}", f(domain="B1")) for i in (104, 105, 106)]
    nodes += [Placed(f"Node{i}", f(domain="B2")) for i in (201, 202, 205, 206)]
    assert slurm_block(nodes) == (
        "# block001=B1\n"
        "BlockName=block001 Nodes=Node[104-106]\n"
        "# block002=B2\n"
        "BlockName=block002 Nodes=Node[201-202,205-206]\n"
        "BlockSizes=3,6\n"
    )


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        pytest.param([18], [18], id="one NVL72 rack of 18 trays"),
        pytest.param([18, 18, 18, 18], [18, 36, 72], id="four racks: 2^floor(log2 4) levels"),
        pytest.param([16, 18, 18], [16, 32], id="the smallest domain sets the base"),
    ],
)
def test_block_sizes_follow_topographs_default(sizes: list[int], want: list[int]) -> None:
    assert block_sizes(sizes) == want


_SWITCH_LINE = re.compile(r"^SwitchName=(\S+) (Switches|Nodes)=(\S+)$")


def parse_tree(text: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A strict reader of Slurm's tree format: every line a comment or one switch line."""
    switches: dict[str, list[str]] = {}
    nodes: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# switch\.\d+\.\d+=\S+$", line), line
            continue
        match = _SWITCH_LINE.match(line)
        assert match, f"not a topology.conf line: {line!r}"
        name, kind, members = match.groups()
        expanded = [n for part in _split(members) for n in expand_hostlist(part)]
        (switches if kind == "Switches" else nodes)[name] = expanded
    return switches, nodes


def _split(members: str) -> list[str]:
    """Split a Slurm list on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in members:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def test_the_demo_clusters_slurm_tree_is_a_tree_over_every_node() -> None:
    switches, nodes = parse_tree(slurm_tree(DEMO))
    children = [c for kids in switches.values() for c in kids]
    assert len(children) == len(set(children)), "a switch with two parents"
    assert set(children) <= set(switches) | set(nodes)
    listed = [n for members in nodes.values() for n in members]
    assert sorted(listed) == sorted(p.name for p in DEMO)
    assert len(switches) == 1 + 2  # one core, two spines; four leaves hold the nodes
    assert len(nodes) == 4


def test_the_demo_cluster_has_one_block_the_nvl72_rack() -> None:
    text = slurm_block(DEMO)
    assert "BlockName=block001 Nodes=gb200-[01-18]" in text
    assert text.endswith("BlockSizes=18\n")


def test_topology_levels_for_the_demo_cluster() -> None:
    assert topology_levels(DEMO, SCHEME) == {
        "gputopo-fabric": ["gputopo.io/core", "gputopo.io/spine", "gputopo.io/leaf", HOSTNAME],
        # the NVL72 rack sits under one spine, so the spine scopes it
        "gputopo-nvlink": ["gputopo.io/spine", "accelerator.topograph.run/domain", HOSTNAME],
    }


def test_topology_levels_follow_the_depth_and_sub_domains_present() -> None:
    nodes = [
        Placed("a", f("leaf-1", domain="d1", sub="d1.0")),
        Placed("b", f("leaf-2", domain="d1", sub="d1.1")),
    ]
    assert topology_levels(nodes, SCHEME) == {
        "gputopo-fabric": ["gputopo.io/leaf", HOSTNAME],
        # d1 spans two leaves and no spine is known: it is not nested under a fabric tier
        "gputopo-nvlink": [
            "accelerator.topograph.run/domain",
            "accelerator.topograph.run/sub-domain",
            HOSTNAME,
        ],
    }
    assert topology_levels([Placed("x", f())], SCHEME) == {}


@pytest.mark.parametrize("build", [kueue_topologies, kai_topologies], ids=["kueue", "kai"])
def test_topology_objects_pass_their_schema(build: object) -> None:
    objects = build(DEMO, SCHEME)  # type: ignore[operator]
    assert [o["metadata"]["name"] for o in objects] == ["gputopo-fabric", "gputopo-nvlink"]
    for obj in objects:
        assert check_topology(obj) == []
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gputopo"}


@pytest.mark.parametrize(
    ("levels", "problem"),
    [
        pytest.param([], "spec.levels: must list 1 to 8 levels", id="no levels"),
        pytest.param(
            [HOSTNAME, "a/b"],
            f"spec.levels: {HOSTNAME} can only be the lowest level",
            id="hostname above another level",
        ),
        pytest.param(["a/b", "a/b"], "spec.levels: must be unique", id="a level twice"),
        pytest.param(["a b"], "spec.levels[0].nodeLabel: 'a b' is not a label key", id="bad key"),
    ],
)
def test_the_topology_validator_rejects_what_kueue_rejects(levels: list[str], problem: str) -> None:
    obj = {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": k} for k in levels]}}
    assert problem in check_topology(obj)


def test_volcano_hypernodes_form_the_fabric_tree() -> None:
    objects = volcano_hypernodes(DEMO)
    assert all(check_hypernode(o) == [] for o in objects)
    by_name = {o["metadata"]["name"]: o["spec"] for o in objects}
    assert sorted((s["tier"], s["tierName"]) for s in by_name.values()) == [
        (1, "leaf"),
        (1, "leaf"),
        (1, "leaf"),
        (1, "leaf"),
        (2, "spine"),
        (2, "spine"),
        (3, "core"),
    ]
    leaf4 = by_name["gputopo-leaf-leaf-4"]
    assert {m["selector"]["exactMatch"]["name"] for m in leaf4["members"]} == {
        f"gb200-{i:02}" for i in range(1, 19)
    }
    assert all(m["type"] == "Node" for m in leaf4["members"])
    core = by_name["gputopo-core-core-1"]
    assert [m["selector"]["exactMatch"]["name"] for m in core["members"]] == [
        "gputopo-spine-spine-1",
        "gputopo-spine-spine-2",
    ]
    members = [m["selector"]["exactMatch"]["name"] for s in by_name.values() for m in s["members"]]
    assert len(members) == len(set(members)), "every node and HyperNode has one parent"


def test_a_reused_leaf_name_makes_two_hypernodes() -> None:
    nodes = [Placed("a", f("rack-1", "spine-1")), Placed("b", f("rack-1", "spine-2"))]
    leaves = [o for o in volcano_hypernodes(nodes) if o["spec"]["tier"] == 1]
    assert len(leaves) == 2
    assert all(check_hypernode(o) == [] for o in leaves)


def test_objects_from_an_inventory_in_topographs_model_format() -> None:
    topologies, _ = inventory_topologies(load_inventory(str(SMALL)))
    nodes = [Placed(t.name, t.fabric) for t in topologies]
    _, listed = parse_tree(slurm_tree(nodes))
    assert sum(len(v) for v in listed.values()) == 25
    assert "BlockName=block001 Nodes=gb200-[001-018]" in slurm_block(nodes)
    assert all(check_hypernode(o) == [] for o in volcano_hypernodes(nodes))
