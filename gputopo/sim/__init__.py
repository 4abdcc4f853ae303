"""Simulation: modelled clusters, workloads and yardsticks that drive the engine from outside.

What benchmarks, tests and `gputopo simulate` build to exercise placement lives here, not in
`gputopo.placement`: the engine never imports this package (an import contract says so), so a
reader of the engine meets only what places. Modules are imported by path
(`gputopo.sim.scenarios`, `gputopo.sim.instances`, `gputopo.sim.pcieserver`,
`gputopo.sim.exhaustive`), and `gputopo simulate`'s trace replay (`gputopo.sim.replay` and
its neighbours: the job-time model, sources, metrics).
"""

__all__: list[str] = []
