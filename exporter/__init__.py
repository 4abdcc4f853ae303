"""The exporter: a node agent that discovers its node's GPU topology, measures it and streams it.

- `exporter.agent`: the agent (discovery loop, probes, metrics, report stream in one loop);
- `exporter.nvml` (the only module importing pynvml), `exporter.sysfs`: the hardware readers;
- `exporter.assemble`, `exporter.health`, `exporter.discovery`: readings -> `NodeTopology`;
- `exporter.probes`: GPU copy probes (cuda-bindings) and peer TCP probes;
- `exporter.metrics`, `exporter.metric_names`: the Prometheus collector and every metric name;
- `exporter.stream`: the report stream to the aggregator; `exporter.simulate`: simulated
  exporters for the demo and benchmarks;
- `exporter.fake_machine`, `exporter.fake_nvml` (pynvml over a fake libnvidia-ml),
  `exporter.fake_sysfs`, `exporter.fake_cuda` (a fake `cuda.bindings.runtime`): fake hardware
  derived from recorded machines, for tests, `gputopo exporter --simulate` and the benchmark.
"""
