"""`gputopo aggregator --max-heartbeats-per-second`: default, environment, refusal."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from aggregator.server import AggregatorConfig
from gputopo.app.commands.aggregator import add_arguments
from gputopo.heartbeats import DEFAULT_MAX_HEARTBEATS_PER_SECOND


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_default_is_the_configs_and_the_environment_can_set_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert AggregatorConfig().max_heartbeats_per_second == DEFAULT_MAX_HEARTBEATS_PER_SECOND
    assert parse([]).max_heartbeats_per_second == DEFAULT_MAX_HEARTBEATS_PER_SECOND
    assert parse(["--max-heartbeats-per-second", "0"]).max_heartbeats_per_second == 0
    monkeypatch.setenv("GPUTOPO_MAX_HEARTBEATS_PER_SECOND", "250")
    assert parse([]).max_heartbeats_per_second == 250
    assert parse(["--max-heartbeats-per-second", "10"]).max_heartbeats_per_second == 10


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        pytest.param(
            ["--max-heartbeats-per-second", "-1"], "", "must be at least 0", id="negative"
        ),
        pytest.param([], "lots", "invalid float value: 'lots'", id="not a number in the env"),
    ],
)
def test_a_bad_budget_is_refused_naming_the_option(argv: list[str], env: str, says: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gputopo", "aggregator", "--insecure", "--grpc-port", "0", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "GPUTOPO_MAX_HEARTBEATS_PER_SECOND": env},
    )
    assert out.returncode == 2, out.stderr
    assert "--max-heartbeats-per-second" in out.stderr
    assert says in out.stderr
