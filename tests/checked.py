"""Property tests that prove they checked something: `assume()` plus a count of the examples
that got past it.

A property test that skips infeasible draws passes having checked nothing if its generators
drift toward infeasible inputs. `assume()` makes hypothesis draw again (and fail the test when
almost nothing passes), and `checks_at_least(n)` fails it when fewer than `n` examples reached
the assertions, as `tests/placement/test_service_concurrency.py` does with `reused > 0`:

    @checks_at_least(10)
    @given(...)
    def test_x(...):
        assume(feasible)
        checked()
        assert ...
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any, ParamSpec

__all__ = ["checked", "checks_at_least"]

_P = ParamSpec("_P")
_running: list[str] = []
_counts: Counter[str] = Counter()


def checked() -> None:
    """Count one example of the running test as checked (call it after the `assume()`s)."""
    _counts[_running[-1]] += 1


def checks_at_least(minimum: int) -> Callable[[Callable[_P, Any]], Callable[_P, None]]:
    """Fail the decorated (outermost, above `@given`) test when fewer than `minimum` of its
    examples were checked."""

    def decorate(test: Callable[_P, Any]) -> Callable[_P, None]:
        @functools.wraps(test)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> None:
            name = test.__qualname__
            _counts[name] = 0
            _running.append(name)
            try:
                test(*args, **kwargs)
            finally:
                _running.pop()
            assert _counts[name] >= minimum, (
                f"{name}: only {_counts[name]} examples got past assume(); the generators no"
                " longer draw what the property is about"
            )

        return run

    return decorate
