"""Jittered exponential backoff, for everything that retries against a server.

Full jitter keeps a fleet of clients that failed together (an aggregator restart drops
thousands of exporter streams at once) from coming back together; the lower half of the
window is kept so that a retry never comes back instantly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Jittered exponential backoff: attempt n waits uniform(c/2, c), c = min(cap, base * 2**n)."""

    base_s: float = 0.5
    cap_s: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt `attempt` (0-based)."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(attempt, 30))
        return rng.uniform(ceiling / 2, ceiling)
