"""A client-side rate limit for writes to a shared server (the Kubernetes API above all).

client-go throttles every client with a token bucket (QPS and Burst) so that one controller
cannot starve the API server; writers here do the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """A token bucket: `qps` tokens per second, at most `burst` saved up (client-go's QPS and
    Burst)."""

    def __init__(
        self,
        *,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("rate limit needs qps > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now

    def wait_s(self) -> float:
        """Seconds until a token is available (0: now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.qps

    async def acquire(self) -> None:
        """Take one token, waiting for it when the bucket is empty.

        The token is taken at once (the balance may go negative) and the caller sleeps off the
        debt, so concurrent callers queue up fairly at exactly `qps`.
        """
        self._refill()
        self._tokens -= 1
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.qps)
