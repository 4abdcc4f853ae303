"""Benchmarks behind `gputopo bench NAME`, one module each.

Each module defines `HELP`, `add_arguments(parser)` and `run(args) -> int`, prints its figures as
JSON with `--json` (the default output is a readable summary of the same figures), and compares
against its baseline side by side in the same run: these machines are noisy, so figures are
medians and ratios from one run, never absolute times against a fixed threshold. Benchmarks
report numbers; tests assert behaviour.
"""
