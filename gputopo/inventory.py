"""Static cluster inventories: topograph's model YAML, read unchanged, plus two extensions.

The format is NVIDIA topograph's simulation model (`tests/models/*.yaml`), so its fixtures and a
site's existing topograph files load as they are:

    switches:                      # switch id -> labels, annotations, child switches
      core:   {labels: {topology.kubernetes.io/region: us-east}, switches: [spine-1]}
      spine-1: {switches: [leaf-1, leaf-2]}
    blocks:                        # the only place nodes are declared
      - switch: leaf-1             # optional: the leaf the nodes hang off
        nodes: ["node[01-18]", node20]
        labels: {...}
        annotations:
          accelerator.topology.test/domain: nvl-1        # multi-node NVLink domain
          accelerator.topology.test/sub-domain: rack-1   # optional partition

Extensions (optional, ignored by topograph):

    defaults: {nodeProfile: dgx-h100}          # machine profile of nodes that name none
    blocks:
      - ...
        nodeProfile: gb200-tray                # machine profile of this block's nodes
        used: {"node[01-02]": [0, 1, 2, 3]}    # GPUs already in use, per node (ranges allowed)
    nodes:                                     # per-node overrides
      node07: {nodeProfile: dgx-h100, used: [0, 1]}

Topograph's rules are kept: a switch has at most one parent, no cycles, a node in at most one
block, a block's switch must exist, a block has at least one node, a switch's optional `name`
equals its key. A node's tiers are the switch path from its leaf upwards (closest first);
labels and annotations are inherited root to leaf, then the block's own override them.
Every error names where it is (`blocks[2].nodes[0]: ...`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import yaml

from gputopo.machines import gfd_labels, load_machine, with_gpu_fabric
from gputopo.topology import FabricPosition, NodeTopology

__all__ = [
    "ACCELERATOR_DOMAIN_SUFFIX",
    "ACCELERATOR_SUB_DOMAIN_SUFFIX",
    "MAX_FILE_BYTES",
    "MAX_NODES",
    "Inventory",
    "InventoryError",
    "InventoryNode",
    "compact_hostlist",
    "expand_hostlist",
    "inventory_labels",
    "inventory_topologies",
    "load_inventory",
    "parse_inventory",
    "read_text",
]

# topograph's annotation keys end so (`accelerator.topology.test/domain` in its fixtures, another
# prefix on a real site); any key under an `accelerator` prefix with these names counts.
ACCELERATOR_DOMAIN_SUFFIX = "/domain"
ACCELERATOR_SUB_DOMAIN_SUFFIX = "/sub-domain"

# Nodes one inventory may name: past the largest GPU clusters built (about 25,000 nodes of eight
# GPUs), and small enough that a range bomb (`h-[1-100000]` five times over) is refused by
# counting, before a single name is made.
MAX_NODES = 50_000

_RANGE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[^\[\]]+)\](?P<suffix>[^\[\]]*)$")
_TRAILING_NUMBER = re.compile(r"^(?P<prefix>.*?)(?P<number>\d+)$")

# An inventory of 100,000 nodes is a few MiB of YAML; requests are a few KiB.
MAX_FILE_BYTES = 64 << 20


class InventoryError(ValueError):
    """An invalid inventory; `where` names the offending field."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True, slots=True)
class InventoryNode:
    """One node as the inventory declares it."""

    name: str
    tiers: tuple[str, ...]
    accelerator_domain: str = ""
    accelerator_sub_domain: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    profile: str = ""
    used: frozenset[int] = frozenset()

    def fabric(self) -> FabricPosition:
        """The node's place in the fabric, as the inventory (highest precedence) says."""
        zone = self.labels.get("topology.kubernetes.io/zone", "")
        return FabricPosition(
            tiers=self.tiers,
            accelerator_domain=self.accelerator_domain,
            accelerator_sub_domain=self.accelerator_sub_domain,
            zone=zone,
            source="inventory",
            confidence="high",
        )


@dataclass(frozen=True, slots=True)
class Inventory:
    """A parsed inventory: nodes by name (in declaration order) and the switch tree."""

    nodes: Mapping[str, InventoryNode]
    parents: Mapping[str, str]  # switch -> parent switch
    switch_labels: Mapping[str, Mapping[str, str]]

    @property
    def depth(self) -> int:
        """The deepest tier path of any node."""
        return max((len(n.tiers) for n in self.nodes.values()), default=0)


def expand_hostlist(pattern: str, *, limit: int = MAX_NODES) -> list[str]:
    """Slurm-style compact node names: `node[01-03,07]` -> node01, node02, node03, node07.

    Zero padding follows the range's start (`[001-010]` gives three digits). A name without
    brackets is itself. Raises ValueError with the reason for malformed patterns, and when the
    pattern names more than `limit` nodes: every range is read and counted first, so a huge
    pattern is refused without being expanded.
    """
    text = pattern.strip()
    if "[" not in text and "]" not in text:
        if not text:
            raise ValueError("empty node name")
        if limit < 1:
            raise ValueError(f"more than {MAX_NODES} nodes in all")
        return [text]
    match = _RANGE.match(text)
    if match is None:
        raise ValueError(f"cannot read node range {pattern[:80]!r}")
    spans: list[tuple[int, int, int]] = []
    count = 0
    for part in match.group("body").split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or len(lo) > 18 or len(hi) > 18:
            raise ValueError(f"bad range {part[:40]!r} in {pattern[:80]!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"range {part!r} in {pattern[:80]!r} runs backwards")
        count += last - first + 1
        if count > limit:
            raise ValueError(
                f"{pattern[:80]!r} names at least {count} nodes; at most {MAX_NODES} in all"
            )
        spans.append((first, last, len(lo)))
    prefix, suffix = match.group("prefix"), match.group("suffix")
    return [
        f"{prefix}{i:0{width}d}{suffix}"
        for first, last, width in spans
        for i in range(first, last + 1)
    ]


def compact_hostlist(names: Iterable[str]) -> list[str]:
    """The inverse of `expand_hostlist`: `node01, node02, node05` -> `node[01-02,05]`.

    Names are grouped by the text before their trailing number and its width (zero padding is
    kept, so `n1` and `n01` stay apart); a group of one stays a plain name; names without a
    trailing number stay as they are. Groups come out sorted by prefix, as Slurm tools print.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in sorted(set(names)):
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            plain.append(name)
            continue
        number = match.group("number")
        groups.setdefault((match.group("prefix"), len(number)), []).append(int(number))
    out = list(plain)
    for (prefix, width), numbers in groups.items():
        numbers.sort()
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        spans: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(spans)}]")
    return sorted(out)


def load_inventory(path: str) -> Inventory:
    """Read and parse an inventory file."""
    return parse_inventory(read_text(path), source=path)


def read_text(path: str, *, limit: int = MAX_FILE_BYTES) -> str:
    """A YAML file's text, or InventoryError saying in one line why it is not UTF-8 text (a binary
    file, a UTF-16 export from an editor) instead of a UnicodeDecodeError traceback. At most
    `limit` bytes are read: `--request /dev/zero` or a FIFO that never ends is refused, not
    read until memory runs out."""
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise InventoryError(path, f"is larger than {limit // (1 << 20)} MiB; not a YAML file")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InventoryError(path, "is UTF-16 text; save it as UTF-8")
    if b"\0" in raw:
        raise InventoryError(path, "is a binary file, not YAML text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InventoryError(path, f"is not UTF-8 text (byte {err.start})") from None


def parse_inventory(text: str, *, source: str = "inventory") -> Inventory:
    """Parse an inventory document (see the module docstring)."""
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise InventoryError(source, "nested too deeply to be an inventory") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise InventoryError(where, f"not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(data, Mapping):
        raise InventoryError(source, "must be a mapping with `switches` and `blocks`")
    _only(data, "", _TOP_KEYS)
    switches = _mapping(data.get("switches") or {}, "switches")
    parents, labels, annotations = _switch_tree(switches)
    defaults = _only(_mapping(data.get("defaults") or {}, "defaults"), "defaults", _DEFAULT_KEYS)
    default_profile = _str(defaults.get("nodeProfile", ""), "defaults.nodeProfile")

    nodes: dict[str, InventoryNode] = {}
    for i, raw in enumerate(_list(data.get("blocks") or [], "blocks")):
        where = f"blocks[{i}]"
        block = _only(_mapping(raw, where), where, _BLOCK_KEYS)
        leaf = _str(block.get("switch", ""), f"{where}.switch")
        if leaf and leaf not in parents and leaf not in _declared(switches):
            raise InventoryError(f"{where}.switch", f"switch {leaf!r} is not declared")
        tiers = _path(leaf, parents) if leaf else ()
        merged_labels = _inherit(tiers, labels, _strmap(block.get("labels"), f"{where}.labels"))
        merged_ann = _inherit(
            tiers, annotations, _strmap(block.get("annotations"), f"{where}.annotations")
        )
        domain, sub = _accelerator(merged_ann)
        profile = _str(block.get("nodeProfile", default_profile), f"{where}.nodeProfile")
        used = _used(block.get("used"), f"{where}.used")
        names: list[str] = []
        for j, pattern in enumerate(_list(block.get("nodes") or [], f"{where}.nodes")):
            try:
                room = MAX_NODES - len(nodes) - len(names)
                names.extend(expand_hostlist(_str(pattern, f"{where}.nodes[{j}]"), limit=room))
            except ValueError as err:
                raise InventoryError(f"{where}.nodes[{j}]", str(err)) from None
        if not names:
            raise InventoryError(f"{where}.nodes", "a block needs at least one node")
        for name in names:
            if name in nodes:
                raise InventoryError(f"{where}.nodes", f"node {name!r} is already in another block")
            nodes[name] = InventoryNode(
                name=name,
                tiers=tiers,
                accelerator_domain=domain,
                accelerator_sub_domain=sub,
                labels=MappingProxyType(dict(merged_labels)),
                annotations=MappingProxyType(dict(merged_ann)),
                profile=profile,
                used=used.get(name, frozenset()),
            )
        unknown_used = sorted(set(used) - set(names))
        if unknown_used:
            raise InventoryError(f"{where}.used", f"node {unknown_used[0]!r} is not in this block")
    for name, raw in _mapping(data.get("nodes") or {}, "nodes").items():
        where = f"nodes.{name}"
        if name not in nodes:
            raise InventoryError(where, "overrides a node no block declares")
        over = _only(_mapping(raw, where), where, _NODE_KEYS)
        node = nodes[name]
        nodes[name] = replace(
            node,
            profile=_str(over.get("nodeProfile", node.profile), f"{where}.nodeProfile"),
            used=_indices(over["used"], f"{where}.used") if "used" in over else node.used,
        )
    return Inventory(
        MappingProxyType(nodes),
        MappingProxyType(parents),
        MappingProxyType({k: MappingProxyType(v) for k, v in labels.items()}),
    )


# Every key each part of the document may have: anything else is a typo that would otherwise
# silently drop a fact (`nodeprofile:` in a block left the block on the default profile).
_TOP_KEYS = ("switches", "blocks", "defaults", "nodes", "version", "tiers", "faults")
_DEFAULT_KEYS = ("nodeProfile",)
_BLOCK_KEYS = ("switch", "nodes", "nodeProfile", "labels", "annotations", "used")
_SWITCH_KEYS = ("name", "labels", "annotations", "switches")
_NODE_KEYS = ("nodeProfile", "used")


def _only(raw: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """`raw` if it has no key but `allowed`; else InventoryError naming the first unknown key and
    the allowed key it most looks like."""
    for key in sorted(str(k) for k in raw):
        if key in allowed:
            continue
        by_case = [a for a in allowed if a.lower() == key.lower()]
        close = by_case or difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; known keys: {', '.join(allowed)}"
        raise InventoryError(f"{where}.{key}" if where else key, f"unknown key{hint}")
    return raw


def _declared(switches: Mapping[str, Any]) -> set[str]:
    out = set(switches)
    for raw in switches.values():
        if isinstance(raw, Mapping):
            out.update(str(c) for c in raw.get("switches") or [])
    return out


def _switch_tree(
    switches: Mapping[str, Any],
) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    parents: dict[str, str] = {}
    labels: dict[str, dict[str, str]] = {}
    annotations: dict[str, dict[str, str]] = {}
    for key, raw in switches.items():
        where = f"switches.{key}"
        sw = _only(_mapping(raw or {}, where), where, _SWITCH_KEYS)
        name = sw.get("name")
        if name is not None and name != key:
            raise InventoryError(f"{where}.name", f"is {name!r}, but the key is {key!r}")
        labels[key] = dict(_strmap(sw.get("labels"), f"{where}.labels"))
        annotations[key] = dict(_strmap(sw.get("annotations"), f"{where}.annotations"))
        for raw_child in _list(sw.get("switches") or [], f"{where}.switches"):
            child = str(raw_child)
            if child in parents:
                raise InventoryError(
                    f"{where}.switches", f"switch {child!r} already has parent {parents[child]!r}"
                )
            parents[child] = key
    for start in parents:  # reject cycles
        seen = {start}
        current = start
        while current in parents:
            current = parents[current]
            if current in seen:
                raise InventoryError(f"switches.{start}", "the switch tree has a cycle")
            seen.add(current)
    return parents, labels, annotations


def _path(leaf: str, parents: Mapping[str, str]) -> tuple[str, ...]:
    out = [leaf]
    while out[-1] in parents:
        out.append(parents[out[-1]])
    return tuple(out)


def _inherit(
    tiers: Iterable[str], per_switch: Mapping[str, Mapping[str, str]], own: Mapping[str, str]
) -> dict[str, str]:
    merged: dict[str, str] = {}
    for sw in reversed(tuple(tiers)):  # root first, so closer switches override
        merged.update(per_switch.get(sw, {}))
    merged.update(own)
    return merged


def _accelerator(annotations: Mapping[str, str]) -> tuple[str, str]:
    domain = sub = ""
    for key, value in sorted(annotations.items()):
        if not key.startswith("accelerator"):
            continue
        if key.endswith(ACCELERATOR_SUB_DOMAIN_SUFFIX):
            sub = value
        elif key.endswith(ACCELERATOR_DOMAIN_SUFFIX):
            domain = value
    return domain, sub


def _used(raw: Any, where: str) -> dict[str, frozenset[int]]:
    if raw is None:
        return {}
    out: dict[str, frozenset[int]] = {}
    for pattern, indices in _mapping(raw, where).items():
        try:
            names = expand_hostlist(str(pattern))
        except ValueError as err:
            raise InventoryError(f"{where}.{pattern}", str(err)) from None
        for name in names:
            out[name] = _indices(indices, f"{where}.{pattern}")
    return out


def _indices(raw: Any, where: str) -> frozenset[int]:
    values = _list(raw, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise InventoryError(where, "must be a list of GPU indices (non-negative integers)")
    return frozenset(values)


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise InventoryError(where, f"must be a mapping, not {type(raw).__name__}")
    return raw


def _list(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise InventoryError(where, f"must be a list, not {type(raw).__name__}")
    return raw


def _str(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise InventoryError(where, f"must be a string, not {type(raw).__name__}")
    return raw


def _strmap(raw: Any, where: str) -> Mapping[str, str]:
    if raw is None:
        return {}
    m = _mapping(raw, where)
    return {str(k): str(v) for k, v in m.items()}


def inventory_labels(
    inventory: Inventory, topologies: Iterable[NodeTopology]
) -> dict[str, dict[str, str]]:
    """Each inventory node's labels: what GPU Feature Discovery would write for its machine
    (`gfd_labels`), then the labels the inventory gives it, which win. Node selectors written
    for a real cluster (`nvidia.com/gpu.product: NVIDIA-GB200`) thus match a simulated one."""
    out: dict[str, dict[str, str]] = {}
    for topology in topologies:
        node = inventory.nodes.get(topology.name)
        out[topology.name] = {**gfd_labels(topology), **(node.labels if node else {})}
    return out


def inventory_topologies(
    inventory: Inventory, *, default_profile: str = ""
) -> tuple[list[NodeTopology], dict[str, frozenset[int]]]:
    """Node topologies for an inventory (machine profiles + fabric), and the GPUs in use.

    Raises InventoryError naming the node when a node has no profile or an unknown one, or when
    its `used` GPUs do not exist on that machine.
    """
    nodes: list[NodeTopology] = []
    used: dict[str, frozenset[int]] = {}
    for name, inv in inventory.nodes.items():
        profile = inv.profile or default_profile
        if not profile:
            raise InventoryError(f"nodes.{name}", "no nodeProfile (set defaults.nodeProfile)")
        try:
            topo = load_machine(profile, node_name=name)
        except (KeyError, ValueError) as err:
            raise InventoryError(f"nodes.{name}.nodeProfile", str(err)) from None
        if inv.accelerator_domain:
            topo = with_gpu_fabric(topo, cluster_uuid=inv.accelerator_domain, clique_id=0)
        topo = replace(topo, fabric=inv.fabric())
        bad = sorted(g for g in inv.used if g >= topo.gpu_count)
        if bad:
            raise InventoryError(
                f"nodes.{name}.used",
                f"GPU {bad[0]} does not exist ({profile} has {topo.gpu_count})",
            )
        nodes.append(topo)
        if inv.used:
            used[name] = inv.used
    return nodes, used
