"""The garbage collector as the aggregator runs it, for benchmarks that time decisions.

The aggregator never lets a full collection walk its long-lived state: `runtime.heap` freezes
what survives each full collection the interpreter makes, and the state it built. A benchmark
process left to the default collector instead walks everything it ever built and cached (the
clusters of every size so far, the search's caches) in each full collection, 12-26 ms at
`bench placement`'s sizes, traced with `gc.callbacks`; whichever decision allocates past the
collector's threshold absorbs it. The p99 of 20-40 samples is then the sample a collection
happened to land on, on one tree the first kueue-bestfit TP-8 at 10,008 GPUs, on another a
cold PCIe sample, and a comparison of two trees compares those accidents.

`collector_as_deployed` applies the aggregator's policy for the length of a benchmark: survivors
of each full collection are frozen at once, so a later one walks what arrived since; `settle`
(between parts, never inside a timed region) unfreezes, collects everything, so that what an
earlier part left is freed, and freezes what is left, such as a cluster state just built.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

__all__ = ["collector_as_deployed"]


@contextlib.contextmanager
def collector_as_deployed() -> Iterator[Callable[[], None]]:
    """The aggregator's collector policy until the block ends; yields `settle` (see the module
    docstring). The heap is unfrozen when the block ends."""

    def collected(phase: str, info: dict[str, int]) -> None:
        # After the collection: its survivors are long-lived (`runtime.heap` does the same,
        # from its event loop); no thread here allocates while this runs.
        if phase == "stop" and info["generation"] == 2:
            gc.freeze()

    def settle() -> None:
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    gc.callbacks.append(collected)
    try:
        settle()
        yield settle
    finally:
        gc.callbacks.remove(collected)
        gc.unfreeze()
