"""The shell on top of everything: the `gputopo` command line, its subcommands, the demo and
the benchmarks.

The only package that may import all three processes (exporter, aggregator, scheduler): the
import contracts keep every other part of `gputopo` below them, so the core never depends on
the processes built on it.
"""
