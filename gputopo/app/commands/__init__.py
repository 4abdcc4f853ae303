"""Subcommands of `gputopo`, one module each.

Each module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`, and is
found by `gputopo.app.cli` without a central list, so adding a command touches one new file. Modules
here must stay cheap to import: heavy imports belong inside `run`.
"""
