"""Kernel-style CPU and NUMA lists (`0-31,64-95`) and hex CPU masks, as recordings print them."""

from __future__ import annotations

import re

__all__ = ["cpulist_from_mask", "format_cpulist", "parse_idlist"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_idlist(text: str) -> tuple[int, ...]:
    """The ids in a list like `0,3-9,11-17`, sorted; ValueError if it is not such a list."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a list of ids like 0,3-9")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"{text!r} has a range that runs backwards")
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))


def format_cpulist(ids: tuple[int, ...] | list[int]) -> str:
    """The kernel's compact form of a set of ids: `0-23,48-71`."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    start = prev = -2
    for i in ordered:
        if i == prev + 1:
            prev = i
            continue
        if start >= 0:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    if start >= 0:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def cpulist_from_mask(mask: str) -> str:
    """Turn a hex CPU mask as sysfs and NCCL print it (`0000ffff,ffffffff`, most significant
    32-bit word first) into a cpulist (`0-47`); ValueError if it is not hex."""
    words = mask.strip().split(",")
    value = 0
    for word in words:
        value = (value << 32) | int(word, 16)
    return format_cpulist([bit for bit in range(value.bit_length()) if value >> bit & 1])
