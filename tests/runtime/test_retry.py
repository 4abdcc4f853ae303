"""Backoff and the rate limiter: the figures their docstrings promise."""

from __future__ import annotations

import asyncio
import random

import pytest

from gputopo.runtime.backoff import Backoff
from gputopo.runtime.ratelimit import RateLimiter


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [
        pytest.param(0, 0.25, 0.5, id="first retry waits half to all of base"),
        pytest.param(3, 2.0, 4.0, id="doubles per attempt"),
        pytest.param(40, 15.0, 30.0, id="capped, even for huge attempt numbers"),
    ],
)
def test_backoff_window(attempt: int, low: float, high: float) -> None:
    rng = random.Random(7)
    delays = [Backoff(base_s=0.5, cap_s=30.0).delay(attempt, rng) for _ in range(200)]
    assert low <= min(delays)
    assert max(delays) <= high
    assert max(delays) - min(delays) > (high - low) / 2  # jittered, not constant


def test_rate_limiter_spends_the_burst_then_paces_at_qps() -> None:
    now = [0.0]
    limiter = RateLimiter(qps=2.0, burst=3, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.wait_s() == 0.0
        asyncio.run(limiter.acquire())
    assert limiter.wait_s() == pytest.approx(0.5)
    now[0] += 1.0
    assert limiter.wait_s() == 0.0
    with pytest.raises(ValueError, match="qps"):
        RateLimiter(qps=0, burst=1)
