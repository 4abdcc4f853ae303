"""The exporter: a node agent that discovers its node's GPU topology and streams it.

`exporter.stream` holds the report stream to the aggregator; `exporter.simulate` runs simulated
exporters for machines built from recordings (the demo and the benchmarks).
"""
