"""The command line: discovery of subcommands, exit codes."""

from __future__ import annotations

import pytest

from gputopo.app.cli import main
from gputopo.machines import PROFILES


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("aggregator", "demo", "machines"):
        assert command in out


def test_machines_lists_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["machines"]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in PROFILES)


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
