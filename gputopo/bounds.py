"""What hardware can be: the bounds a reported or requested figure must lie within.

A report claiming 10,000 GPUs on one node, 12,000 fabric tiers, NVLink at 10^12 GB/s or a NaN
latency is not a fact about a cluster; accepting it grew the aggregator by gigabytes and drew
honest placements onto a fake node. Every limit here is generous beyond any machine built or
announced, with the reason beside it, so that a real node never meets one and an absurd one
always does. `check` raises `BoundsError` naming the field; decoders call it before anything
is applied.
"""

from __future__ import annotations

import math

__all__ = [
    "MAX_FABRIC_TIERS",
    "MAX_GBPS",
    "MAX_GPUS_PER_NODE",
    "MAX_LANES",
    "MAX_LATENCY_US",
    "MAX_LINKS_PER_NODE",
    "MAX_MEMORY_MIB",
    "MAX_NICS_PER_NODE",
    "MAX_NUMA_NODES",
    "MAX_PROBLEMS",
    "MAX_TEXT",
    "BoundsError",
    "check_count",
    "check_number",
    "check_text",
]

# The largest single nodes have 16-20 GPUs (DGX-2 class, PCIe servers); 128 leaves room for
# anything announced (an NVL72 rack is 18 nodes of 4, not one node).
MAX_GPUS_PER_NODE = 128
# Eight NICs per node is typical, 18 on some GB200 trays (4 CX-7 x 2 ports + DPUs); 64 is ample.
MAX_NICS_PER_NODE = 64
# 4x GH200 shows 36 NUMA nodes (GPU memory is a NUMA node each); 256 is ample.
MAX_NUMA_NODES = 256
# Every pair of devices once, and then some: (128 + 64 + 256)^2 / 2 would be 100k; no discovery
# reports more than GPU pairs, GPU-NIC and GPU-NUMA paths: well under 20,000.
MAX_LINKS_PER_NODE = 20_000
# Leaf, spine, core, super-spine, zone, region: 16 is far past any fabric.
MAX_FABRIC_TIERS = 16
# NVLink 5 bonds 18 lanes between a GPU and its NVSwitches; 72 leaves room for two generations.
MAX_LANES = 72
# 192 GB of HBM today (B200 192 GB, MI300X 192 GB); 4 TiB per GPU is far ahead of any roadmap.
MAX_MEMORY_MIB = 4 * 1024 * 1024
# NVLink 5 is 900 GB/s per direction per GPU, C2C 450; 10 TB/s per direction per link is ample.
MAX_GBPS = 10_000.0
# A probe's latency: ten seconds is no link.
MAX_LATENCY_US = 10_000_000.0
# Names, UUIDs, bus ids, labels: Kubernetes' longest name is 253 bytes; a reason a little more.
MAX_TEXT = 1024
MAX_PROBLEMS = 256


class BoundsError(ValueError):
    """A figure outside what hardware can be; `field` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check_count(field: str, count: int, limit: int) -> None:
    """At most `limit` items."""
    if count > limit:
        raise BoundsError(field, f"{count} items, more than any node has ({limit} at most)")


def check_number(field: str, value: float, *, limit: float, allow_zero: bool = True) -> None:
    """A finite number in [0, limit] (or (0, limit] without `allow_zero`)."""
    if not math.isfinite(value):
        raise BoundsError(field, f"must be a finite number, not {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise BoundsError(field, f"must be {'non-negative' if allow_zero else 'positive'}")
    if value > limit:
        raise BoundsError(field, f"{value:g} is beyond what hardware can be ({limit:g} at most)")


def check_text(field: str, text: str) -> None:
    """A string no longer than `MAX_TEXT` characters."""
    if len(text) > MAX_TEXT:
        raise BoundsError(field, f"{len(text)} characters, {MAX_TEXT} at most")
