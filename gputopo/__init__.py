"""gputopo: GPU topology made schedulable.

The shared package holds what the exporter, the aggregator and the scheduler all speak: the
topology model (`gputopo.topology`), link kinds (`gputopo.links`), bandwidth facts
(`gputopo.bandwidth`), the cost model, placement, importers of recordings, the runtime kit the
processes share (`gputopo.runtime`) and, on top of everything, the CLI (`gputopo.app`).
"""

__version__ = "0.1.0"
