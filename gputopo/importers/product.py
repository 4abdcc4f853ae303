"""The NVLink generation a recording's notes name, for recordings that do not say it themselves.

`nvidia-smi topo -m` prints `NV18` for a bonded set of 18 NVLinks and nothing about their
generation, and without a generation the facts table falls back to NVLink 4 (25 GB/s per link).
That is right for H100 but half the truth for Blackwell: a GB200 tray's NV18 is NVLink 5, 900
GB/s per direction. The recordings carry their machine on their `#` source line ("4x NVIDIA
GB200, 2x Grace", or "NVLink2" outright), so the generation is read from there, and only when
it is unambiguous: the notes name exactly one generation, and no GPU has more links than that
generation ever had (a V100 note on an NV18 matrix is a wrong note, not NVLink 2).
"""

from __future__ import annotations

import re

__all__ = ["MAX_LINKS", "nvlink_generation_named", "nvlink_generation_note", "recording_notes"]

# Product names (as NVIDIA and clouds write them) -> NVLink generation; the Grace superchips and
# their GPUs share a generation (GH200: 4, GB200/GB300: 5).
_PRODUCTS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"\bG?B(?:100|200|300)\b", re.IGNORECASE), 5),
    (re.compile(r"\b(?:GH200|H100|H200|H800|H20)\b", re.IGNORECASE), 4),
    (re.compile(r"\b(?:A100|A800|A30)\b", re.IGNORECASE), 3),
    (re.compile(r"\bV100\b", re.IGNORECASE), 2),
    (re.compile(r"\bP100\b", re.IGNORECASE), 1),
)
_STATED = re.compile(r"\bNVLink ?([1-5])\b", re.IGNORECASE)
# The most NVLinks one GPU of each generation has.
MAX_LINKS: dict[int, int] = {1: 4, 2: 6, 3: 12, 4: 18, 5: 18}


def recording_notes(text: str) -> str:
    """The `#` lines a recording starts with (its source line), joined; "" when none."""
    notes = []
    for line in text.removeprefix("\ufeff").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            notes.append(stripped)
        elif stripped:
            break
    return "\n".join(notes)


def nvlink_generation_note(generation: int) -> str:
    """The note `render_topo_matrix` writes above a matrix so that reading it back keeps the
    generation (`nvidia-smi` itself never prints one)."""
    return f"# NVLink {generation}"


def nvlink_generation_named(notes: str, *, max_lanes: int) -> int:
    """The one NVLink generation the notes give, or 0 when they give none, several, or one whose
    GPUs never had `max_lanes` links. "NVLink 5" (or "NVLink5") said outright wins over product
    names."""
    named = {int(n) for n in _STATED.findall(notes)}
    if not named:
        named = {gen for pattern, gen in _PRODUCTS if pattern.search(notes)}
    if len(named) != 1:
        return 0
    (generation,) = named
    return generation if max_lanes <= MAX_LINKS[generation] else 0
