"""Kernel-style CPU and NUMA lists (`0-31,64-95`) and hex CPU masks, as sysfs and recordings print
them. Public: the exporter reads sysfs with them and its fakes write them, as the importers do."""

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
    # Linux builds for at most 8,192 CPUs (NR_CPUS); a longer mask is not a machine's, and
    # testing each bit of a huge int is quadratic (a 100,000-digit mask took seconds).
    if len(words) > _MAX_MASK_WORDS:
        raise ValueError(f"a CPU mask of {len(words)} words names more than 8192 CPUs")
    value = 0
    for word in words:
        if len(word) > 8:
            raise ValueError(f"CPU mask word {word[:16]!r} is longer than 32 bits")
        value = (value << 32) | int(word, 16)
    bits = bin(value)[:1:-1]  # least significant first, one pass
    return format_cpulist([i for i, b in enumerate(bits) if b == "1"])


_MAX_MASK_WORDS = 8192 // 32
