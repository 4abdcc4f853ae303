"""One vocabulary for the levels of topology domains, spelt the same on every surface.

A domain is a set of GPUs that stay together at some level: a node, an NVLink domain, a switch
group at fabric tier n (tier 0 = leaf group, closest first, as deep as the fabric goes), a zone,
the cluster. The placement request speaks `Scope` (the levels a user can ask for: three named
tiers); everything that *reports* domains speaks `Level`, which has every tier:

- the snapshot and the placement rejections (`Rejection.domain` = `domain_name(level, id)`,
  e.g. `tier-0/core/spine-1/leaf-2`, `nvlink/nvl72-a`, `node/h100-3`);
- the aggregator's domain index and the `level` label of its metrics;
- GetTopology's `Domain.level` and the HTTP mirror `/api/v1/topology`.

A domain id at tier n is the tier's whole path from the top down (`tier_path`), so a leaf name
reused under two spines is two leaves; the id is unique within its level, and `level/id` is
unique in the cluster. A `Level` is its spelling (a typed `str`), checked by `parse_level`.
"""

from __future__ import annotations

import re
from typing import NewType

from gputopo.request import Scope

__all__ = [
    "CLUSTER",
    "NODE",
    "NVLINK",
    "ZONE",
    "Level",
    "domain_name",
    "level_tier",
    "parent_level",
    "parse_domain_name",
    "parse_level",
    "scope_level",
    "tier_level",
    "tier_path",
]

_TIER = re.compile(r"^tier-(0|[1-9][0-9]?)$")
_NAMED = frozenset({"node", "nvlink", "zone", "cluster"})
_TIER_OF_SCOPE = {Scope.LEAF: 0, Scope.SPINE: 1, Scope.CORE: 2}
# The index asks for tier levels on every node update: spell each one once.
_TIER_LEVELS: dict[int, Level] = {}


# A level's spelling is its value: it goes into JSON, protobuf and metric labels as is. A
# NewType, not a str subclass: levels key the domain index, which is updated on every report,
# and plain str keys keep CPython's fast dict paths (a subclass doubled the update's cost).
Level = NewType("Level", str)


def parse_level(text: str) -> Level:
    """A level from its spelling; ValueError for anything else (`leaf`, `accelerator`, ...)."""
    if text not in _NAMED and not _TIER.match(text):
        raise ValueError(f"not a domain level: {text!r} (node, nvlink, tier-N, zone, cluster)")
    return Level(text)


def tier_level(tier: int) -> Level:
    """Fabric tier `tier` (0 = the switch group closest to the node)."""
    level = _TIER_LEVELS.get(tier)
    if level is None:
        if tier < 0:
            raise ValueError(f"tier must be >= 0, not {tier}")
        level = _TIER_LEVELS[tier] = Level(f"tier-{tier}")
    return level


def scope_level(scope: Scope) -> Level:
    """The level a request scope names (LEAF, SPINE, CORE are tiers 0, 1, 2)."""
    tier = _TIER_OF_SCOPE.get(scope)
    return tier_level(tier) if tier is not None else Level(scope.name.lower())


def level_tier(level: str) -> int | None:
    """The fabric tier of a tier level, else None."""
    return int(level[5:]) if level.startswith("tier-") else None


def parent_level(level: str) -> Level | None:
    """The next wider tier of a tier level (the domain that contains it), else None."""
    tier = level_tier(level)
    return tier_level(tier + 1) if tier is not None else None


NODE = Level("node")
NVLINK = Level("nvlink")
ZONE = Level("zone")
CLUSTER = Level("cluster")


def tier_path(tiers: tuple[str, ...], tier: int) -> str:
    """The id of a node's tier-`tier` domain: the path of switch groups from the top down.

    `tiers` is the node's fabric position closest first (`("leaf-2", "spine-1", "core")`);
    tier 0 of that is `core/spine-1/leaf-2`, tier 1 `core/spine-1`.
    """
    return "/".join(reversed(tiers[tier:]))


# Placement names rejected domains by scope, many per decision: look the spelling up.
_SCOPE_LEVELS = {scope: scope_level(scope) for scope in Scope}


def domain_name(level: Level | Scope, domain_id: str) -> str:
    """`level/id`: how a rejection, the API and a dashboard name one domain."""
    lv = _SCOPE_LEVELS[level] if isinstance(level, Scope) else level
    return f"{lv}/{domain_id}"


def parse_domain_name(name: str) -> tuple[Level, str]:
    """The level and id of a `domain_name` (ValueError when it is not one)."""
    level, sep, domain_id = name.partition("/")
    if not sep or not domain_id:
        raise ValueError(f"not a domain name: {name!r} (want level/id)")
    return parse_level(level), domain_id
