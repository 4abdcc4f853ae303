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
unique in the cluster. `Level` is a `str` so that the spelling is the value: it goes into JSON,
protobuf and metric labels as is, and parses back with `Level(text)`.
"""

from __future__ import annotations

import re

from gputopo.request import Scope

__all__ = [
    "CLUSTER",
    "NODE",
    "NVLINK",
    "ZONE",
    "Level",
    "domain_name",
    "parse_domain_name",
    "tier_path",
]

_TIER = re.compile(r"^tier-(0|[1-9][0-9]?)$")
_NAMED = frozenset({"node", "nvlink", "zone", "cluster"})
_TIER_OF_SCOPE = {Scope.LEAF: 0, Scope.SPINE: 1, Scope.CORE: 2}


class Level(str):
    """A domain level: `node`, `nvlink`, `tier-N` (N >= 0), `zone` or `cluster`."""

    __slots__ = ()

    def __new__(cls, text: str) -> Level:
        if text not in _NAMED and not _TIER.match(text):
            raise ValueError(f"not a domain level: {text!r} (node, nvlink, tier-N, zone, cluster)")
        return super().__new__(cls, text)

    @classmethod
    def of_tier(cls, tier: int) -> Level:
        """Fabric tier `tier` (0 = the switch group closest to the node)."""
        if tier < 0:
            raise ValueError(f"tier must be >= 0, not {tier}")
        return cls(f"tier-{tier}")

    @classmethod
    def of_scope(cls, scope: Scope) -> Level:
        """The level a request scope names (LEAF, SPINE, CORE are tiers 0, 1, 2)."""
        tier = _TIER_OF_SCOPE.get(scope)
        return cls.of_tier(tier) if tier is not None else cls(scope.name.lower())

    @property
    def tier(self) -> int | None:
        """The fabric tier of a tier level, else None."""
        return int(self[5:]) if self.startswith("tier-") else None

    def parent(self) -> Level | None:
        """The next wider tier of a tier level (the domain that contains it), else None."""
        tier = self.tier
        return Level.of_tier(tier + 1) if tier is not None else None


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


def domain_name(level: Level | Scope, domain_id: str) -> str:
    """`level/id`: how a rejection, the API and a dashboard name one domain."""
    lv = level if isinstance(level, Level) else Level.of_scope(level)
    return f"{lv}/{domain_id}"


def parse_domain_name(name: str) -> tuple[Level, str]:
    """The level and id of a `domain_name` (ValueError when it is not one)."""
    level, sep, domain_id = name.partition("/")
    if not sep or not domain_id:
        raise ValueError(f"not a domain name: {name!r} (want level/id)")
    return Level(level), domain_id
