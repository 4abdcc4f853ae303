"""Probes: measure what the facts table only estimates.

- `exporter.probes.gpu`: GPU-to-GPU and GPU-to-host copy bandwidth (and copy latency) with
  cuda-bindings, copy engines and large buffers, as nvbandwidth measures; unavailable, and
  saying why, when cuda-bindings or a GPU is missing.
- `exporter.probes.tcp`: a small TCP endpoint peers probe, and the client that probes the peers
  the aggregator names (bandwidth and round-trip time).
- `exporter.probes.runner`: when probes run (jittered intervals, never on a busy GPU) and where
  results go (`ProbeResults`, laid over the discovered topology: a measurement replaces the
  nominal figure in placement, both stay in the report).
"""

from exporter.probes.results import ProbeOutcome, ProbeResults

__all__ = ["ProbeOutcome", "ProbeResults"]
